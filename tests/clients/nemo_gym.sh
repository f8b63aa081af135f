#!/usr/bin/env bash
# nemo_gym.sh DIR SBX PLUGIN_DIR [--api-key] [--server-proxy]
#
# NeMo Gym 0.7.0's own OpenSandbox provider against a fresh `sbx serve` over local_docker
# (harness/with_serve.py; nemo_gym_check.py says what is checked: exec, a 1 MiB single line,
# preserve_background_services=True, files, terminals). NeMo Gym 0.7.0 comes from
# nemo_gym_venv.sh DIR (installed once, 1.6 GB). Registered as clients_nemo_gym_direct and
# clients_nemo_gym_proxy in every preset (DIR: SBX_NEMO_GYM_DIR, ~/.cache/sbx-nemo-gym, shared by
# the presets); -DSBX_NEMO_GYM_TEST=OFF leaves them out.
set -Eeuo pipefail

die() {
  printf 'tests/clients/nemo_gym.sh: ERROR: %s\n' "$*" >&2
  exit 1
}
(($# >= 3)) || die "usage: nemo_gym.sh DIR SBX PLUGIN_DIR [--api-key] [--server-proxy]"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$1 sbx=$2 plugin_dir=$3
shift 3
venv_python=$(bash "${here}/nemo_gym_venv.sh" "${dir}")
export PYTHONDONTWRITEBYTECODE=1
exec "${venv_python}" "${here}/harness/with_serve.py" --sbx "${sbx}" \
  --plugin-dir "${plugin_dir}" --no-record "$@" -- "${venv_python}" "${here}/nemo_gym_check.py"

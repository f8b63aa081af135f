#!/usr/bin/env bash
# nemo_gym.sh DIR SBX PLUGIN_DIR [--api-key] [--server-proxy]
#
# NeMo Gym 0.7.0's own OpenSandbox provider against a fresh `sbx serve` over local_docker
# (harness/with_serve.py; nemo_gym_check.py says what is checked: exec, a 1 MiB single line,
# preserve_background_services=True, files). Installs nemo-gym[sandbox]==0.7.0 into DIR/venv the
# first time (it needs Python 3.13: SBX_NEMO_PYTHON, default pyenv's 3.13.0; about 110 s and
# 1.6 GB from PyPI); DIR/stamp keeps it. Registered as clients_nemo_gym_direct and
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
python=${SBX_NEMO_PYTHON:-/root/.pyenv/versions/3.13.0/bin/python3}
pin='nemo-gym[sandbox]==0.7.0'

mkdir -p "${dir}"
dir=$(cd "${dir}" && pwd)
if [[ ! -e ${dir}/.sbx-nemo-gym ]]; then # ours only if empty or marked: nothing else is deleted
  [[ -z $(ls -A "${dir}") ]] || die "${dir} is not empty and was not made by this script"
  : >"${dir}/.sbx-nemo-gym"
fi
want="${pin} $("${python}" --version 2>&1)"
if [[ $(cat "${dir}/stamp" 2>/dev/null) != "${want}" ]]; then
  [[ -x ${python} ]] || die "no Python 3.13 at ${python} (set SBX_NEMO_PYTHON)"
  rm -rf "${dir}/venv" "${dir}/stamp"
  "${python}" -m venv "${dir}/venv"
  # 0.7.0 declares Requires-Python >=3.13.14, which no Python here is; 3.13.0 runs it.
  "${dir}/venv/bin/pip" install -q --disable-pip-version-check --ignore-requires-python "${pin}" ||
    die "pip could not install ${pin}"
  printf '%s\n' "${want}" >"${dir}/stamp"
fi
export PYTHONDONTWRITEBYTECODE=1
exec "${dir}/venv/bin/python" "${here}/harness/with_serve.py" --sbx "${sbx}" \
  --plugin-dir "${plugin_dir}" --no-record "$@" -- "${dir}/venv/bin/python" "${here}/nemo_gym_check.py"

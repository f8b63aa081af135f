#!/usr/bin/env bash
# nemo_gym_venv.sh DIR — installs nemo-gym[sandbox]==0.7.0 into DIR/venv the first time (it
# needs Python 3.13: SBX_NEMO_PYTHON, default pyenv's 3.13.0; about 110 s and 1.6 GB from PyPI)
# and prints the venv's python. DIR/stamp keeps it; DIR must be empty or made by this script
# (nothing else is deleted). Used by nemo_gym.sh and by the Python package's NeMo Gym test.
set -Eeuo pipefail

die() {
  printf 'tests/clients/nemo_gym_venv.sh: ERROR: %s\n' "$*" >&2
  exit 1
}
(($# == 1)) || die "usage: nemo_gym_venv.sh DIR"
dir=$1
python=${SBX_NEMO_PYTHON:-/root/.pyenv/versions/3.13.0/bin/python3}
pin='nemo-gym[sandbox]==0.7.0'

mkdir -p "${dir}"
dir=$(cd "${dir}" && pwd)
if [[ ! -e ${dir}/.sbx-nemo-gym ]]; then # ours only if empty or marked: nothing else is deleted
  [[ -z $(ls -A "${dir}") ]] || die "${dir} is not empty and was not made by this script"
  : >"${dir}/.sbx-nemo-gym"
fi
[[ -x ${python} ]] || die "no Python 3.13 at ${python} (set SBX_NEMO_PYTHON)"
want="${pin} $("${python}" --version 2>&1)"
if [[ $(cat "${dir}/stamp" 2>/dev/null) != "${want}" ]]; then
  rm -rf "${dir}/venv" "${dir}/stamp"
  "${python}" -m venv "${dir}/venv" >&2
  # 0.7.0 declares Requires-Python >=3.13.14, which no Python here is; 3.13.0 runs it.
  "${dir}/venv/bin/pip" install -q --disable-pip-version-check --ignore-requires-python "${pin}" >&2 ||
    die "pip could not install ${pin}"
  printf '%s\n' "${want}" >"${dir}/stamp"
fi
printf '%s\n' "${dir}/venv/bin/python"

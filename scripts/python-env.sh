#!/usr/bin/env bash
# python-env.sh — the Python the package's module (python/) is built with in this tree and its
# tests run under: a venv with the pinned build and test requirements from PyPI, made from
# pyenv's CPython 3.13.0 where the machine has it (NeMo Gym 0.7.0 needs 3.13, and its tests load
# the same module), else Debian's python3 (python3-dev and python3-venv, from
# scripts/install-deps.sh). Made once; a stamp names the pins and the Python, and a change
# remakes it. Prints the venv's python.
#
# Usage: scripts/python-env.sh
# Environment:
#   SBX_PYTHON_BASE=PY    the Python to make it from (default: the above)
#   SBX_PYTHON_VENV=DIR   where the venv goes (default ~/.cache/sbx-python-venv-X.Y); a
#                         directory that exists without this script's stamp is refused, never
#                         deleted
set -Eeuo pipefail

die() { printf 'python-env.sh: ERROR: %s\n' "$*" >&2; exit 1; }

python=${SBX_PYTHON_BASE:-/root/.pyenv/versions/3.13.0/bin/python3}
[[ -n ${SBX_PYTHON_BASE:-} || -x ${python} ]] || python=/usr/bin/python3
pins=(nanobind==3.1.0 pytest==9.2.0)
[[ -x ${python} ]] || die "no ${python} (scripts/install-deps.sh installs python3)"

version=$("${python}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv=${SBX_PYTHON_VENV:-${HOME:-/root}/.cache/sbx-python-venv-${version}}
want="${pins[*]} $("${python}" --version 2>&1)"
if [[ $(cat "${venv}/.sbx-python-env" 2>/dev/null) != "${want}" ]]; then
  if [[ -e ${venv} ]]; then
    [[ -e ${venv}/.sbx-python-env ]] || die "${venv} exists and was not made by this script"
    rm -rf "${venv}"
  fi
  mkdir -p "$(dirname "${venv}")"
  "${python}" -m venv "${venv}" >&2 || die "python3 -m venv failed (is python3-venv installed?)"
  "${venv}/bin/pip" install -q --disable-pip-version-check "${pins[@]}" >&2 ||
    die "pip could not install ${pins[*]}"
  printf '%s\n' "${want}" >"${venv}/.sbx-python-env"
fi
printf '%s\n' "${venv}/bin/python"

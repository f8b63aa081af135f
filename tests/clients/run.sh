#!/usr/bin/env bash
# run.sh DIR SBX PLUGIN_DIR [with_serve options] -- KIND PROGRAM [ARGS...]
#
# One client test as ctest runs it: installs the pinned clients into DIR if needed (setup.sh,
# cached), then runs PROGRAM against a fresh `sbx serve` (harness/with_serve.py) with the venv's
# Python. KIND is `python` (PROGRAM runs with the venv's python) or `node` (with the machine's
# node, SBX_CLIENTS_NPM pointing at the npm prefix). A client that cannot be installed fails the
# test (setup.sh's message says which). With the option --no-serve, PROGRAM runs alone.
set -Eeuo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
(($# >= 5)) || {
  echo "usage: run.sh DIR SBX PLUGIN_DIR [options] -- KIND PROGRAM [ARGS...]" >&2
  exit 2
}
dir=$1 sbx=$2 plugin_dir=$3
shift 3
options=()
while (($# > 0)) && [[ $1 != -- ]]; do
  options+=("$1")
  shift
done
[[ ${1:-} == -- ]] || {
  echo "run.sh: missing -- before the program" >&2
  exit 2
}
shift
kind=$1
shift

"${here}/setup.sh" "${dir}"
export PYTHONDONTWRITEBYTECODE=1 # nothing written into the source tree
dir=$(cd "${dir}" && pwd)
python=${dir}/venv/bin/python

case ${kind} in
python) program=("${python}" "$@") ;;
node) program=(env "SBX_CLIENTS_NPM=${dir}/npm" node "$@") ;;
*)
  echo "run.sh: unknown kind ${kind}" >&2
  exit 2
  ;;
esac

if [[ " ${options[*]} " == *" --no-serve "* ]]; then
  exec "${program[@]}"
fi
exec "${python}" "${here}/harness/with_serve.py" --sbx "${sbx}" --plugin-dir "${plugin_dir}" \
  "${options[@]}" -- "${program[@]}"

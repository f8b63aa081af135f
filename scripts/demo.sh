#!/usr/bin/env bash
# demo.sh — runs a real sandbox session: installs dependencies, brings up
# Docker and the test images, builds the default preset, then uses
# build/bin/sbx with the local_docker provider to upload a file into a
# busybox container, run a command there and download its output.
# Exits with sbx's exit code.
set -Eeuo pipefail
trap 'printf "demo.sh: ERROR: failed at line %s: %s\n" "${LINENO}" "${BASH_COMMAND}" >&2' ERR

step() { printf '==> %s\n' "$*"; }
die() { printf 'demo.sh: ERROR: %s\n' "$*" >&2; exit 1; }

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

step "install dependencies (scripts/install-deps.sh)"
scripts/install-deps.sh

step "Docker daemon and test images (scripts/docker-up.sh)"
scripts/docker-up.sh

launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_DIR=${CCACHE_DIR:-${HOME:-/root}/.cache/ccache}
  mkdir -p "${CCACHE_DIR}"
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

step "configure (cmake --preset default)"
cmake --preset default "${launcher[@]}"
step "build the sbx command and the local_docker plugin (cmake --build --preset default --target sbx local_docker)"
cmake --build --preset default --target sbx local_docker

sbx=build/bin/sbx
[[ -x ${sbx} ]] || die "${sbx} was not built"

tmp=$(mktemp -d /tmp/sbx-demo.XXXXXX)
trap 'rm -rf "${tmp}"' EXIT
printf 'hello from the host, through a sandbox\n' >"${tmp}/in.txt"
step "input file ${tmp}/in.txt:"
cat "${tmp}/in.txt"

step "run a session: ${sbx} run --provider local_docker --image sbx-busybox:latest ..."
rc=0
# shellcheck disable=SC2016 # $GREETING and $(hostname) expand inside the sandbox
"${sbx}" run --provider local_docker --image sbx-busybox:latest \
  --env GREETING=hello --workdir /work \
  --upload "${tmp}/in.txt:/work/in.txt" \
  --download "/work/out.txt:${tmp}/out.txt" \
  -- sh -c 'echo "$GREETING from $(hostname)"; wc -c < in.txt; tr a-z A-Z < in.txt > out.txt; uname -a' \
  || rc=$?

step "downloaded file ${tmp}/out.txt:"
if [[ -f ${tmp}/out.txt ]]; then
  cat "${tmp}/out.txt"
else
  echo "(not there)"
fi

step "sbx exited with status ${rc}"
exit "${rc}"

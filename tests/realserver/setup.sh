#!/usr/bin/env bash
# setup.sh DIR AGENT — prepares what the real OpenSandbox server needs here:
#   1. DIR/venv, a Python venv with opensandbox-server 1.1.1 (requirements.txt, its dependencies
#      held by constraints.txt). Cached: DIR/stamp holds the hash of both files and the Python
#      version; when it matches nothing is installed.
#   2. The execd image (default sbx-execd:local; $SBX_EXECD_IMAGE): made with `docker import`
#      (nothing is pulled) from AGENT (our static sbx-agent) as /execd, our bootstrap.sh as
#      /bootstrap.sh, and a static busybox as /bin/tail: the server starts a throw-away container
#      of this image with the command `tail -f /dev/null` to copy /execd and /bootstrap.sh out of
#      it. Its label sbx.realserver.execd holds the hash of those inputs; the image is rebuilt
#      when the agent, the bootstrap or the busybox changes.
# Runs under a lock (DIR/setup.lock), so runs started in parallel install once. DIR is ours only
# if it is empty or carries our marker (.sbx-realserver): nothing else is ever deleted.
# Environment: SBX_REALSERVER_PYTHON (default python3), SBX_EXECD_IMAGE.
set -Eeuo pipefail

die() {
  printf 'tests/realserver/setup.sh: ERROR: %s\n' "$*" >&2
  exit 1
}

(($# == 2)) || die "usage: setup.sh DIR AGENT"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$1 agent=$2
python=${SBX_REALSERVER_PYTHON:-python3}
image=${SBX_EXECD_IMAGE:-sbx-execd:local}
recipe=1 # bump when the image's layout below changes

[[ -x ${agent} ]] || die "no executable agent at ${agent} (build the sbx-agent target)"
busybox=$(readlink -f /bin/busybox 2>/dev/null || true)
[[ -x ${busybox} ]] || die "no /bin/busybox (package busybox-static; scripts/install-deps.sh)"
if ldd "${busybox}" >/dev/null 2>&1; then die "${busybox} is not static (install busybox-static)"; fi

mkdir -p "${dir}"
dir=$(cd "${dir}" && pwd)
if [[ ! -e ${dir}/.sbx-realserver ]]; then
  [[ -z $(ls -A "${dir}") ]] || die "${dir} is not empty and was not made by this script"
  : >"${dir}/.sbx-realserver"
fi
exec 9>"${dir}/setup.lock"
flock 9

# --- 1. the server's venv -------------------------------------------------------------------
want=$(
  cat "${here}/requirements.txt" "${here}/constraints.txt"
  "${python}" --version 2>&1
)
want=$(sha256sum <<<"${want}" | cut -d' ' -f1)
if [[ ! -f ${dir}/stamp || $(cat "${dir}/stamp") != "${want}" ]]; then
  printf 'tests/realserver/setup.sh: installing opensandbox-server into %s/venv\n' "${dir}"
  rm -f "${dir}/stamp"
  rm -rf "${dir}/venv"
  "${python}" -m venv "${dir}/venv" || die "${python} -m venv failed (is the venv module installed?)"
  timeout 900 "${dir}/venv/bin/python" -m pip install --no-input --disable-pip-version-check -q \
    -r "${here}/requirements.txt" -c "${here}/constraints.txt" ||
    die "could not install opensandbox-server 1.1.1 from PyPI: see pip's output above"
  got=$("${dir}/venv/bin/python" -c \
    'import importlib.metadata as m; print(m.version("opensandbox-server"))')
  [[ ${got} == 1.1.1 ]] || die "opensandbox-server ${got} installed, 1.1.1 pinned"
  printf '%s\n' "${want}" >"${dir}/stamp"
fi

# --- 2. the execd image ---------------------------------------------------------------------
hash=$({
  echo "recipe ${recipe}"
  sha256sum <"${agent}"
  sha256sum <"${here}/bootstrap.sh"
  sha256sum <"${busybox}"
} | sha256sum | cut -d' ' -f1)
have=$(docker image inspect -f '{{ index .Config.Labels "sbx.realserver.execd" }}' "${image}" \
  2>/dev/null || true)
if [[ ${have} == "${hash}" ]]; then
  exit 0
fi
printf 'tests/realserver/setup.sh: building %s from %s\n' "${image}" "${agent}"
old_id=
[[ -n ${have} ]] && old_id=$(docker image inspect -f '{{.Id}}' "${image}") # ours: it has our label
root=${dir}/image-root # rebuilt each time: ours (inside our marked DIR)
rm -rf "${root}"
mkdir -p "${root}/bin"
install -m 0755 "${agent}" "${root}/execd"
install -m 0755 "${here}/bootstrap.sh" "${root}/bootstrap.sh"
install -m 0755 "${busybox}" "${root}/bin/busybox"
ln -s busybox "${root}/bin/tail"
ln -s busybox "${root}/bin/sh" # for a look inside: docker run --rm -it IMAGE sh
tar --numeric-owner --owner=0 --group=0 --sort=name -C "${root}" -cf - . |
  docker import \
    --change 'ENV PATH=/bin' \
    --change "LABEL sbx.realserver.execd=${hash}" \
    --message "sbx-agent as the OpenSandbox execd image (tests/realserver/setup.sh)" \
    - "${image}" >/dev/null || die "docker import of ${image} failed"
rm -rf "${root}"
have=$(docker image inspect -f '{{ index .Config.Labels "sbx.realserver.execd" }}' "${image}")
[[ ${have} == "${hash}" ]] || die "${image} does not carry the label just given to it"
# The image this replaced, if it was ours and no container uses it any more.
if [[ -n ${old_id} && ${old_id} != $(docker image inspect -f '{{.Id}}' "${image}") ]]; then
  docker image rm "${old_id}" >/dev/null 2>&1 || true
fi
printf 'tests/realserver/setup.sh: built %s\n' "${image}"

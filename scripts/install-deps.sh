#!/usr/bin/env bash
# install-deps.sh — installs the Debian 12 packages sbx needs to build, test
# and run its Docker-backed tests (build tools, libraries, docker.io,
# busybox-static, docker-registry, ...). Only calls apt-get when something is
# missing, so it is cheap to run again. Needs root (re-runs itself via sudo).
set -Eeuo pipefail
trap 'printf "install-deps: ERROR: unexpected failure at line %s: %s\n" "${LINENO}" "${BASH_COMMAND}" >&2' ERR

log() { printf 'install-deps: %s\n' "$*"; }
die() { printf 'install-deps: ERROR: %s\n' "$*" >&2; exit 1; }

if [[ ${EUID} -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    log "not root, re-running with sudo"
    exec sudo --preserve-env=DEBIAN_FRONTEND "$0" "$@"
  fi
  die "must run as root (and sudo is not available)"
fi

packages=(
  # build tools
  cmake ninja-build g++ pkg-config ccache git
  # Debian packages (cpack -G DEB: dpkg-shlibdeps, file)
  dpkg-dev file
  # libraries
  libboost1.81-dev libboost-json1.81-dev libcurl4-openssl-dev libspdlog-dev doctest-dev
  libssl-dev
  # runtime / test tools
  docker.io busybox-static docker-registry iproute2 curl python3 clang-format
  # the Python package's module and its tests (python/, scripts/python-env.sh)
  python3-dev python3-venv
  # sbx shell's test drives a real terminal (tests/core/shell_test.sh)
  tmux
  # the SDK HTTP client's TLS tests run `openssl req` and `openssl s_server`
  openssl
  # used by scripts/docker-up.sh (cgroup setup on bare machines, pgrep, tar)
  cgroupfs-mount iptables procps tar
  # scripts/fuzz.sh: clang's libFuzzer with ASan and UBSan (fuzz/)
  clang-14 libclang-rt-14-dev
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "${pkg}" 2>/dev/null || true)
  [[ ${status} == installed ]] || missing+=("${pkg}")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  log "all ${#packages[@]} packages already installed"
  exit 0
fi

log "missing: ${missing[*]}"

export DEBIAN_FRONTEND=noninteractive
export NEEDRESTART_SUSPEND=1  # needrestart must not try to restart services

# Package installs must not start services (dockerd, a registry listening on
# every interface, ...): scripts/docker-up.sh starts what the tests need.
# Machine images built with Docker already have such a policy-rc.d.
policy=/usr/sbin/policy-rc.d
if [[ ! -e ${policy} ]]; then
  printf '#!/bin/sh\n# temporary, from sbx scripts/install-deps.sh\nexit 101\n' >"${policy}"
  chmod 0755 "${policy}"
  trap 'rm -f "${policy}"' EXIT
fi

apt_opts=(-o Acquire::Retries=3 -o DPkg::Lock::Timeout=300)

log "apt-get update"
apt-get "${apt_opts[@]}" update -q || die "apt-get update failed"

log "apt-get install ${missing[*]}"
apt-get "${apt_opts[@]}" install -y -q --no-install-recommends "${missing[@]}" \
  || die "apt-get install failed for: ${missing[*]}"

still_missing=()
for pkg in "${missing[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "${pkg}" 2>/dev/null || true)
  [[ ${status} == installed ]] || still_missing+=("${pkg}")
done
[[ ${#still_missing[@]} -eq 0 ]] || die "still not installed after apt-get: ${still_missing[*]}"

log "installed ${#missing[@]} package(s)"

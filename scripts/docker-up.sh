#!/usr/bin/env bash
# docker-up.sh — makes a Docker daemon answer on /var/run/docker.sock (starting
# dockerd if needed), builds the offline test images sbx-busybox:latest,
# sbx-bash:latest (from host binaries), sbx-empty:latest (no program at
# all: /etc/passwd and /etc/group only) and sbx-busybox-user:latest (busybox
# whose USER is sbx) (no image is ever pulled from the internet), starts a local registry on 127.0.0.1:5000 and pushes
# 127.0.0.1:5000/sbx/busybox:latest to it. Idempotent: re-running only checks.
#
# Usage: scripts/docker-up.sh [--rebuild]
#   --rebuild   rebuild and re-import the test images even if they exist
set -Eeuo pipefail
trap 'printf "docker-up: ERROR: unexpected failure at line %s: %s\n" "${LINENO}" "${BASH_COMMAND}" >&2' ERR

SOCK=/var/run/docker.sock
DOCKERD_LOG=/var/log/sbx-dockerd.log
DOCKERD_WAIT=60
REG_ADDR=127.0.0.1:5000
REG_CONF=/etc/sbx/registry.yml
REG_DATA=/var/lib/sbx-registry
REG_LOG=/var/log/sbx-registry.log
REG_PIDFILE=/run/sbx-registry.pid
REG_WAIT=30
BUSYBOX_IMAGE=sbx-busybox:latest
BASH_IMAGE=sbx-bash:latest
EMPTY_IMAGE=sbx-empty:latest
USER_IMAGE=sbx-busybox-user:latest # busybox whose USER is sbx (1000), not root
REG_REPO=sbx/busybox
REG_IMAGE=${REG_ADDR}/${REG_REPO}:latest
# Bump when the rootfs recipe below changes: images with another recipe
# label are rebuilt automatically.
IMAGE_RECIPE=1
IMAGE_PATH_ENV=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf 'docker-up: %s\n' "$*"; }
die() { printf 'docker-up: ERROR: %s\n' "$*" >&2; exit 1; }

usage() { sed -n '2,11s/^# \{0,1\}//p' "$0"; }

rebuild=0
for arg in "$@"; do
  case ${arg} in
    --rebuild) rebuild=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: ${arg}" ;;
  esac
done

if [[ ${EUID} -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    log "not root, re-running with sudo"
    exec sudo "$0" "$@"
  fi
  die "must run as root (starts dockerd and builds root-owned image trees), and sudo is not available"
fi

for tool in curl tar flock pgrep ps; do
  command -v "${tool}" >/dev/null 2>&1 || die "'${tool}' not found; run scripts/install-deps.sh first"
done

# Debian's client, not whatever other `docker` comes first on PATH.
if [[ -x /usr/bin/docker ]]; then
  DOCKER=/usr/bin/docker
elif DOCKER=$(command -v docker); then
  :
else
  die "no docker client found; run scripts/install-deps.sh first (package docker.io)"
fi
export DOCKER_HOST=unix://${SOCK}
unset DOCKER_CONTEXT

# One docker-up at a time (test.sh and demo.sh may run concurrently).
exec 9>/run/sbx-docker-up.lock
flock -w 300 9 || die "another docker-up.sh still holds /run/sbx-docker-up.lock after 300 s"

# ---------------------------------------------------------------- daemon ----

docker_ping() {
  [[ $(curl -sS -m 3 --unix-socket "${SOCK}" http://localhost/_ping 2>/dev/null) == OK ]]
}

ensure_cgroups() {
  # Bare machines may boot without cgroups mounted; dockerd/runc need them.
  if ! mountpoint -q /sys/fs/cgroup; then
    command -v cgroupfs-mount >/dev/null 2>&1 \
      || die "/sys/fs/cgroup is not mounted and cgroupfs-mount is missing; run scripts/install-deps.sh"
    log "mounting cgroups (cgroupfs-mount)"
    cgroupfs-mount || die "cgroupfs-mount failed"
  fi
}

dockerd_log_offset=0
dockerd_pid=""

dockerd_failed() {
  printf 'docker-up: ERROR: %s\n' "$1" >&2
  if [[ -f ${DOCKERD_LOG} ]]; then
    printf -- '--- last lines of %s ---\n' "${DOCKERD_LOG}" >&2
    tail -c "+$((dockerd_log_offset + 1))" "${DOCKERD_LOG}" | tail -n 40 >&2
  fi
  exit 1
}

# A killed dockerd leaves its pid files behind; dockerd refuses to start (or
# waits for a containerd that is gone) while the pid in them belongs to any
# live process, so drop pid files whose pid is not the expected daemon.
remove_stale_pidfile() { # pidfile process-name
  local pidfile=$1 name=$2 old
  [[ -f ${pidfile} ]] || return 0
  old=$(tr -dc '0-9' <"${pidfile}")
  if [[ -n ${old} ]] && ps -p "${old}" -o comm=,stat= 2>/dev/null \
    | awk -v n="${name}" '$1 == n && $2 !~ /^Z/ { found = 1 } END { exit !found }'; then
    return 0
  fi
  log "removing stale ${pidfile} (pid ${old:-?} is not a running ${name})"
  rm -f "${pidfile}"
}

start_dockerd() { # sets dockerd_pid
  command -v dockerd >/dev/null 2>&1 || die "dockerd not found; run scripts/install-deps.sh first (package docker.io)"
  ensure_cgroups
  remove_stale_pidfile /var/run/docker.pid dockerd
  remove_stale_pidfile /var/run/docker/containerd/containerd.pid containerd
  mkdir -p "$(dirname "${DOCKERD_LOG}")"
  touch "${DOCKERD_LOG}"
  dockerd_log_offset=$(stat -c %s "${DOCKERD_LOG}")
  printf '\n=== %s: started by sbx scripts/docker-up.sh ===\n' "$(date -u +%FT%TZ)" >>"${DOCKERD_LOG}"
  log "starting dockerd (log: ${DOCKERD_LOG})"
  # setsid+nohup: the daemon outlives this script and its terminal;
  # 9>&- keeps it from holding our lock.
  # dockerd starts its own containerd when none is running.
  # The limits Docker's own systemd unit gives it (LimitNOFILE=infinity,
  # LimitNPROC=infinity), not whatever this shell inherited: a CI runner's
  # 1024 open files would leave a busy daemon unable to accept a connection.
  (
    ulimit -n "$(cat /proc/sys/fs/nr_open)" 2>/dev/null || ulimit -n 1048576 2>/dev/null || true
    ulimit -u unlimited 2>/dev/null || true
    exec setsid nohup dockerd >>"${DOCKERD_LOG}" 2>&1 </dev/null 9>&-
  ) &
  dockerd_pid=$!
  disown
}

ensure_daemon() {
  if docker_ping; then
    log "Docker daemon answers on ${SOCK}"
    return
  fi
  local running="" waited_for="" deadline=$((SECONDS + DOCKERD_WAIT))
  dockerd_pid=""
  until docker_ping; do
    if [[ -n ${dockerd_pid} ]]; then
      kill -0 "${dockerd_pid}" 2>/dev/null \
        || dockerd_failed "dockerd (pid ${dockerd_pid}) exited during startup"
    else
      # Live dockerd processes (not zombies): one may be starting up or
      # shutting down. Wait for it; start our own once none is left.
      running=$({ ps -C dockerd -o pid=,stat= || true; } | awk '$2 !~ /^Z/ { printf "%s ", $1 }')
      running=${running% }
      if [[ -z ${running} ]]; then
        start_dockerd
      elif [[ ${running} != "${waited_for}" ]]; then
        log "dockerd is running (pid ${running}) but ${SOCK} does not answer; waiting"
        waited_for=${running}
      fi
    fi
    if ((SECONDS >= deadline)); then
      dockerd_failed "Docker daemon did not answer on ${SOCK} within ${DOCKERD_WAIT} s${running:+ (a dockerd not started by this script is running: pid ${running}; if it listens elsewhere, stop it)}"
    fi
    sleep 0.5
  done
  log "Docker daemon is up${dockerd_pid:+ (dockerd pid ${dockerd_pid})}"
}

# ---------------------------------------------------------------- images ----

image_is_current() { # image
  local recipe
  recipe=$("${DOCKER}" image inspect -f '{{ index .Config.Labels "sbx.test-image.recipe" }}' "$1" 2>/dev/null) || return 1
  [[ ${recipe} == "${IMAGE_RECIPE}" ]]
}

# Minimal rootfs: static busybox, one symlink per applet, users root and sbx.
make_busybox_rootfs() { # dir
  local root=$1 busybox applet
  busybox=$(readlink -f /bin/busybox 2>/dev/null || true)
  [[ -x ${busybox} ]] || die "/bin/busybox not found; run scripts/install-deps.sh first (package busybox-static)"
  if ldd "${busybox}" >/dev/null 2>&1; then
    die "${busybox} is dynamically linked; install busybox-static instead of busybox"
  fi

  mkdir -p "${root}"/{bin,sbin,usr/bin,usr/sbin,etc,root,home/sbx,tmp,proc,sys,dev,var}
  cp "${busybox}" "${root}/bin/busybox"
  chmod 0755 "${root}/bin/busybox"
  while read -r applet; do
    [[ -n ${applet} && ${applet} != busybox ]] || continue
    ln -sfn busybox "${root}/bin/${applet}"
  done < <("${busybox}" --list)
  [[ -L ${root}/bin/sh ]] || die "busybox has no 'sh' applet"
  ln -sfn /bin/busybox "${root}/usr/bin/env" # for '#!/usr/bin/env' scripts

  cat >"${root}/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
sbx:x:1000:1000:sbx:/home/sbx:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
  cat >"${root}/etc/group" <<'EOF'
root:x:0:
sbx:x:1000:
nogroup:x:65534:
EOF
  chmod 0644 "${root}/etc/passwd" "${root}/etc/group"
  chmod 1777 "${root}/tmp"
  chmod 0700 "${root}/root"
  chmod 0755 "${root}/home/sbx"
  chown 1000:1000 "${root}/home/sbx"
}

# Copies a host binary and every shared object `ldd` lists for it (including
# the dynamic loader) to the same absolute paths inside the rootfs.
add_host_binary() { # root binary
  local root=$1 bin=$2 line lib
  [[ -x ${bin} ]] || die "${bin} not found on the host"
  mkdir -p "${root}$(dirname "${bin}")"
  rm -f "${root}${bin}"
  cp -L "${bin}" "${root}${bin}"
  while read -r line; do
    lib=""
    if [[ ${line} =~ '=> '(/[^ ]+) ]]; then
      lib=${BASH_REMATCH[1]}
    elif [[ ${line} =~ ^(/[^ ]+) ]]; then
      lib=${BASH_REMATCH[1]}
    elif [[ ${line} == *'=> not found'* ]]; then
      die "ldd ${bin}: ${line}"
    fi
    [[ -n ${lib} ]] || continue # linux-vdso.so.1 has no file
    mkdir -p "${root}$(dirname "${lib}")"
    cp -L "${lib}" "${root}${lib}"
  done < <(ldd "${bin}")
}

import_rootfs() { # root image kind cmd [user]
  local root=$1 image=$2 kind=$3 cmd=$4 old_id new_id
  local user=() # the image's USER when one is given (else none: root)
  [[ -n ${5:-} ]] && user=(--change "USER $5")
  old_id=$("${DOCKER}" image inspect -f '{{.Id}}' "${image}" 2>/dev/null || true)
  new_id=$(tar --numeric-owner --sort=name -C "${root}" -cf - . \
    | "${DOCKER}" import \
      --change "ENV PATH=${IMAGE_PATH_ENV}" \
      "${user[@]}" \
      --change "CMD [\"${cmd}\"]" \
      --change "LABEL sbx.test-image=${kind} sbx.test-image.recipe=${IMAGE_RECIPE}" \
      --message "sbx test image (${kind}) from scripts/docker-up.sh" \
      - "${image}") || die "docker import of ${image} failed"
  log "imported ${image} (${new_id:0:19})"
  if [[ -n ${old_id} && ${old_id} != "${new_id}" ]]; then
    "${DOCKER}" image rm "${old_id}" >/dev/null 2>&1 || true # only if now unused
  fi
}

build_images() {
  local need_busybox=1 need_bash=1 need_empty=1 need_user=1 work
  if ((rebuild == 0)); then
    image_is_current "${BUSYBOX_IMAGE}" && need_busybox=0
    image_is_current "${BASH_IMAGE}" && need_bash=0
    image_is_current "${EMPTY_IMAGE}" && need_empty=0
    image_is_current "${USER_IMAGE}" && need_user=0
  fi
  if ((need_busybox + need_bash + need_empty + need_user == 0)); then
    log "images ${BUSYBOX_IMAGE}, ${BASH_IMAGE}, ${EMPTY_IMAGE} and ${USER_IMAGE} exist (recipe ${IMAGE_RECIPE})"
    return
  fi
  work=$(mktemp -d /tmp/sbx-rootfs.XXXXXX)
  # shellcheck disable=SC2064 # expand ${work} now
  trap "rm -rf '${work}'" EXIT
  if ((need_busybox)); then
    log "building ${BUSYBOX_IMAGE} from host busybox-static"
    make_busybox_rootfs "${work}/busybox"
    import_rootfs "${work}/busybox" "${BUSYBOX_IMAGE}" busybox /bin/sh
  fi
  if ((need_user)); then
    log "building ${USER_IMAGE} (busybox whose USER is sbx)"
    make_busybox_rootfs "${work}/user"
    import_rootfs "${work}/user" "${USER_IMAGE}" busybox-user /bin/sh sbx
  fi
  if ((need_bash)); then
    log "building ${BASH_IMAGE} (busybox + host /bin/bash and its libraries)"
    make_busybox_rootfs "${work}/bash"
    add_host_binary "${work}/bash" /bin/bash
    import_rootfs "${work}/bash" "${BASH_IMAGE}" bash /bin/bash
  fi
  if ((need_empty)); then
    # No shell, no date, no sleep: what local_docker's agent must do without (a TTL, a clear
    # error for a command that needs a shell).
    log "building ${EMPTY_IMAGE} (no program: /etc/passwd and /etc/group only)"
    mkdir -p "${work}/empty/etc" "${work}/empty/tmp"
    chmod 1777 "${work}/empty/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"${work}/empty/etc/passwd"
    printf 'root:x:0:\n' >"${work}/empty/etc/group"
    import_rootfs "${work}/empty" "${EMPTY_IMAGE}" empty /bin/sh
  fi
  rm -rf "${work}"
  trap - EXIT
}

verify_images() {
  local out
  # shellcheck disable=SC2016 # $HOME expands inside the container
  out=$("${DOCKER}" run --rm --network none "${BUSYBOX_IMAGE}" \
    sh -c 'id -u; id -u sbx; stat -c %a /tmp; echo "$HOME"' 2>&1 | tr '\n' ' ') \
    || die "container from ${BUSYBOX_IMAGE} failed to run: ${out}"
  [[ ${out} == '0 1000 1777 /root ' ]] \
    || die "${BUSYBOX_IMAGE} looks wrong (want '0 1000 1777 /root', got '${out}'); try --rebuild"
  out=$("${DOCKER}" run --rm --network none "${BASH_IMAGE}" bash -c 'echo ok' 2>&1) \
    || die "container from ${BASH_IMAGE} failed to run: ${out}"
  [[ ${out} == ok ]] || die "${BASH_IMAGE}: bash -c 'echo ok' printed '${out}'; try --rebuild"
  log "verified: both images run containers (--network none)"
}

# -------------------------------------------------------------- registry ----

registry_http_code() {
  curl -s -o /dev/null -m 3 -w '%{http_code}' "http://${REG_ADDR}/v2/" 2>/dev/null || true
}

write_registry_config() {
  local tmp
  mkdir -p "$(dirname "${REG_CONF}")" "${REG_DATA}"
  tmp=$(mktemp)
  cat >"${tmp}" <<EOF
# Written by sbx scripts/docker-up.sh: a local test registry, loopback only,
# no auth, no TLS (docker treats 127.0.0.0/8 registries as insecure).
version: 0.1
log:
  level: info
  fields:
    service: sbx-registry
storage:
  cache:
    blobdescriptor: inmemory
  filesystem:
    rootdirectory: ${REG_DATA}
  delete:
    enabled: true
http:
  addr: ${REG_ADDR}
  headers:
    X-Content-Type-Options: [nosniff]
EOF
  if cmp -s "${tmp}" "${REG_CONF}"; then
    rm -f "${tmp}"
  else
    mv "${tmp}" "${REG_CONF}"
    chmod 0644 "${REG_CONF}"
    log "wrote ${REG_CONF}"
  fi
}

ensure_registry() {
  local code pid=""
  code=$(registry_http_code)
  case ${code} in
    200)
      log "registry answers on http://${REG_ADDR}/v2/"
      return
      ;;
    000 | "") ;;
    *) die "something on ${REG_ADDR} answers /v2/ with HTTP ${code} (not an open registry); stop it or free the port" ;;
  esac
  command -v docker-registry >/dev/null 2>&1 \
    || die "docker-registry not found; run scripts/install-deps.sh first (package docker-registry)"
  write_registry_config
  if pgrep -f "docker-registry serve ${REG_CONF}" >/dev/null; then
    log "docker-registry is running but does not answer yet; waiting"
  else
    mkdir -p "$(dirname "${REG_LOG}")"
    printf '\n=== %s: started by sbx scripts/docker-up.sh ===\n' "$(date -u +%FT%TZ)" >>"${REG_LOG}"
    log "starting docker-registry on ${REG_ADDR} (log: ${REG_LOG})"
    setsid nohup docker-registry serve "${REG_CONF}" >>"${REG_LOG}" 2>&1 </dev/null 9>&- &
    pid=$!
    disown
    echo "${pid}" >"${REG_PIDFILE}"
  fi
  local deadline=$((SECONDS + REG_WAIT))
  until [[ $(registry_http_code) == 200 ]]; do
    if { [[ -n ${pid} ]] && ! kill -0 "${pid}" 2>/dev/null; } || ((SECONDS >= deadline)); then
      printf 'docker-up: ERROR: registry did not answer on http://%s/v2/ within %s s\n' "${REG_ADDR}" "${REG_WAIT}" >&2
      printf -- '--- last lines of %s ---\n' "${REG_LOG}" >&2
      tail -n 30 "${REG_LOG}" >&2 || true
      exit 1
    fi
    sleep 0.3
  done
  log "registry is up${pid:+ (docker-registry pid ${pid})}"
}

push_busybox() {
  local local_digest remote_digest out
  "${DOCKER}" tag "${BUSYBOX_IMAGE}" "${REG_IMAGE}"
  local_digest=$("${DOCKER}" image inspect -f '{{range .RepoDigests}}{{println .}}{{end}}' "${REG_IMAGE}" \
    | sed -n "s|^${REG_ADDR}/${REG_REPO}@||p" | head -n 1)
  remote_digest=$(curl -sS -m 5 -I \
    -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
    "http://${REG_ADDR}/v2/${REG_REPO}/manifests/latest" 2>/dev/null \
    | tr -d '\r' | sed -n 's/^[Dd]ocker-[Cc]ontent-[Dd]igest: //p')
  if [[ -n ${local_digest} && ${local_digest} == "${remote_digest}" ]]; then
    log "registry already has ${REG_IMAGE} (${remote_digest:0:19})"
    return
  fi
  log "pushing ${REG_IMAGE}"
  out=$("${DOCKER}" push "${REG_IMAGE}" 2>&1) || {
    printf '%s\n' "${out}" >&2
    die "docker push ${REG_IMAGE} failed"
  }
  curl -fsS -m 5 "http://${REG_ADDR}/v2/${REG_REPO}/tags/list" | grep -q '"latest"' \
    || die "registry does not list ${REG_REPO}:latest after the push"
  log "pushed ${REG_IMAGE}"
}

# ------------------------------------------------------------------ main ----

ensure_daemon
build_images
verify_images
ensure_registry
push_busybox

api=$("${DOCKER}" version -f '{{.Server.APIVersion}}' 2>/dev/null || echo '?')
engine=$("${DOCKER}" version -f '{{.Server.Version}}' 2>/dev/null || echo '?')
driver=$("${DOCKER}" info -f '{{.Driver}}' 2>/dev/null || echo '?')
log "ready: Docker ${engine} (API ${api}, ${driver}) on ${SOCK}; images ${BUSYBOX_IMAGE} ${BASH_IMAGE} ${EMPTY_IMAGE} ${USER_IMAGE}; registry http://${REG_ADDR} with ${REG_REPO}:latest"

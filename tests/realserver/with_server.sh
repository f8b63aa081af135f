#!/usr/bin/env bash
# with_server.sh SETUP_DIR WORK_DIR [--internal] -- COMMAND [ARG...]
#
# Runs COMMAND against a fresh real OpenSandbox server (SETUP_DIR/venv from setup.sh; the execd
# image sbx-execd:local, or $SBX_EXECD_IMAGE, must exist: setup.sh builds it):
#   - the server listens on 127.0.0.1 on a free port, with a random API key, the Docker runtime;
#   - its sandboxes go on a Docker network made for this run alone (sbx-rs-RUN, label
#     sbx.realserver.run=RUN): a bridge whose published ports are bound to 127.0.0.1 only. With
#     --internal the network is `docker network create --internal` (no route out of it, and Docker
#     then publishes no port: only the server-proxy mode works). Network "none" is not possible:
#     the server reaches execd over TCP (published port or container IP);
#   - readiness: GET /health is polled until it answers (the server's exit ends the wait);
#   - COMMAND runs with SBX_REALSERVER_URL (http://127.0.0.1:PORT), SBX_REALSERVER_DOMAIN
#     (127.0.0.1:PORT), OPEN_SANDBOX_DOMAIN (the same), OPEN_SANDBOX_API_KEY (the key),
#     SBX_REALSERVER_NETWORK and SBX_REALSERVER_LOG (the server's log file) in its environment;
#   - then the server is stopped (SIGTERM, SIGKILL after 20 s) and every container still on the
#     run's network (a sandbox the command left) is removed, then the network. Nothing else is
#     touched: the network is the run's own, so its containers are this server's.
# WORK_DIR keeps server.toml, server.log and the server's HOME (its metadata store) for a look
# after a failure; it is ours only if empty or marked (.sbx-realserver-work).
# Exit status: COMMAND's, or 1 when the server could not be started.
set -Eeuo pipefail

die() {
  printf 'tests/realserver/with_server.sh: ERROR: %s\n' "$*" >&2
  exit 1
}
log() { printf 'with_server: %s\n' "$*" >&2; }

(($# >= 4)) || die "usage: with_server.sh SETUP_DIR WORK_DIR [--internal] -- COMMAND [ARG...]"
setup=$1 work=$2
shift 2
internal=()
while (($# > 0)) && [[ $1 != -- ]]; do
  case $1 in
  --internal) internal=(--internal) ;;
  *) die "unknown option $1" ;;
  esac
  shift
done
[[ ${1:-} == -- ]] || die "missing -- before the command"
shift
(($# > 0)) || die "no command after --"

server_bin=${setup}/venv/bin/opensandbox-server
[[ -x ${server_bin} ]] || die "no ${server_bin}: run tests/realserver/setup.sh first"
image=${SBX_EXECD_IMAGE:-sbx-execd:local}
docker image inspect "${image}" >/dev/null 2>&1 || die "no image ${image}: run setup.sh first"

mkdir -p "${work}"
work=$(cd "${work}" && pwd)
if [[ ! -e ${work}/.sbx-realserver-work ]]; then
  [[ -z $(ls -A "${work}") ]] || die "${work} is not empty and was not made by this script"
  : >"${work}/.sbx-realserver-work"
fi
rm -rf "${work}/home" # the last run's server HOME (ours: inside our marked WORK_DIR)
mkdir -p "${work}/home"

run=$(date +%s)-$$
network=sbx-rs-${run}
key=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

server= command= network_made=
stop() { # PID: SIGTERM, then SIGKILL after 20 s
  kill -0 "$1" 2>/dev/null || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 200); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  local rc=$? left
  trap - EXIT INT TERM
  trap '' PIPE # our output may go to a reader that is gone (killed with us): clean up anyway
  [[ -z ${command} ]] || stop "${command}" # still running when we were interrupted
  [[ -z ${server} ]] || stop "${server}"
  # The network goes once nothing is attached to it (tried again: a create the server sent just
  # before it stopped may still be completing in the daemon).
  for _ in ${network_made:+1 2 3}; do
    left=$(docker ps -aq --filter "network=${network}" 2>/dev/null || true)
    if [[ -n ${left} ]]; then
      # shellcheck disable=SC2086 # one id per word
      docker rm -f ${left} >/dev/null 2>&1 || true
      log "removed containers left on ${network}: $(echo "${left}" | tr '\n' ' ')" || true
    fi
    docker network rm "${network}" >/dev/null 2>&1 && break
    sleep 1
  done
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

docker network create "${internal[@]}" --label "sbx.realserver.run=${run}" "${network}" >/dev/null ||
  die "could not create the Docker network ${network}"
network_made=1

# The server's configuration (the key stays out of it: OPENSANDBOX_SERVER_API_KEY).
cat >"${work}/server.toml" <<TOML
# Written by tests/realserver/with_server.sh for run ${run}.
[server]
host = "127.0.0.1"
port = ${port}
max_sandbox_timeout_seconds = 86400

[log]
level = "INFO"

[runtime]
type = "docker"
execd_image = "${image}"

[docker]
network_mode = "${network}"
publish_host = "127.0.0.1"

[proxy]
resolve_internal = true

[store]
type = "sqlite"
path = "${work}/home/opensandbox.db"
TOML

started=$(date +%s%N)
OPENSANDBOX_SERVER_API_KEY=${key} HOME=${work}/home PYTHONDONTWRITEBYTECODE=1 \
  "${server_bin}" --config "${work}/server.toml" >"${work}/server.log" 2>&1 &
server=$!
url=http://127.0.0.1:${port}
until curl -fsS -m 2 -o /dev/null "${url}/health" 2>/dev/null; do
  if ! kill -0 "${server}" 2>/dev/null; then
    tail -n 30 "${work}/server.log" >&2
    die "the server exited during startup (log above: ${work}/server.log)"
  fi
  if (($(date +%s%N) - started > 120000000000)); then
    tail -n 30 "${work}/server.log" >&2
    die "the server did not answer ${url}/health within 120 s"
  fi
  sleep 0.1
done
log "server ${url} ready in $((($(date +%s%N) - started) / 1000000)) ms (network ${network}${internal:+, internal})"

# In the background and waited for: a signal to us then runs the cleanup at once, and bash prints
# no "Terminated" line for it (that write, to a reader killed with us, would end us by SIGPIPE
# before the cleanup). Its stdin is /dev/null.
SBX_REALSERVER_URL=${url} SBX_REALSERVER_DOMAIN=127.0.0.1:${port} \
  OPEN_SANDBOX_DOMAIN=127.0.0.1:${port} OPEN_SANDBOX_API_KEY=${key} \
  SBX_REALSERVER_NETWORK=${network} SBX_REALSERVER_LOG=${work}/server.log \
  "$@" &
command=$!
rc=0
wait "${command}" || rc=$?
command=
exit "${rc}"

#!/usr/bin/env bash
# smoke.sh [direct|proxy|both] — one sandbox's life on the real server, by hand with curl, run
# under with_server.sh (it reads SBX_REALSERVER_URL and OPEN_SANDBOX_API_KEY):
# create (sbx-busybox:latest, entrypoint sleep infinity, timeout 120 s), get, the execd endpoint
# in direct and server-proxy form, then through the chosen endpoint(s) (default both): GET /ping,
# POST /command, POST /files/upload, GET /files/download (byte-exact), GET /files/info; then pause
# (state Paused), resume (state Running, a command works again), delete (404 afterwards, the
# container gone). Each step prints ok or FAIL with what came back; exit status 1 if any failed.
set -Eeuo pipefail

modes=${1:-both}
: "${SBX_REALSERVER_URL:?run under with_server.sh}" "${OPEN_SANDBOX_API_KEY:?}"
api=${SBX_REALSERVER_URL}/v1
key_header="OPEN-SANDBOX-API-KEY: ${OPEN_SANDBOX_API_KEY}"
tmp=$(mktemp -d)
trap 'rm -rf "${tmp}"' EXIT
failures=0
ok() { printf 'ok    %s\n' "$*"; }
fail() {
  printf 'FAIL  %s\n' "$*"
  failures=$((failures + 1))
}
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
lifecycle() { curl -sS -m 120 -H "${key_header}" "$@"; }

t=$(date +%s%N)
created=$(lifecycle -H 'Content-Type: application/json' -d '{"image": {"uri": "sbx-busybox:latest"},
  "entrypoint": ["sleep", "infinity"], "timeout": 120, "resourceLimits": {},
  "metadata": {"test": "realserver-smoke"}}' "${api}/sandboxes")
id=$(json 'd["id"]' <<<"${created}" 2>/dev/null) || {
  fail "create: ${created}"
  exit 1
}
ok "create ${id} ($(ms "${t}") ms)"
state=$(lifecycle "${api}/sandboxes/${id}" | json 'd["status"]["state"]')
[[ ${state} == Running ]] && ok "get: Running" || fail "get: state ${state}"

direct=$(lifecycle "${api}/sandboxes/${id}/endpoints/44772" | json 'd["endpoint"]')
proxied=$(lifecycle "${api}/sandboxes/${id}/endpoints/44772?use_server_proxy=true" |
  json 'd["endpoint"]')
ok "endpoints: direct ${direct}, server proxy ${proxied}"

# execd through one endpoint: MODE BASE_URL [CURL_OPTIONS...] (the proxy needs the key too).
execd_checks() {
  local mode=$1 base=$2 out code t
  shift 2
  code=$(curl -sS -m 10 -o "${tmp}/ping" -w '%{http_code}' "$@" "${base}/ping" || true)
  [[ ${code} == 200 ]] && ok "${mode}: GET /ping" || fail "${mode}: GET /ping: ${code} $(cat "${tmp}/ping")"
  t=$(date +%s%N)
  out=$(curl -sS -m 30 -N "$@" -H 'Content-Type: application/json' \
    -d '{"command": "echo hello from $(uname -s); echo oops >&2; exit 3"}' "${base}/command" || true)
  if grep -q '"type":"stdout","text":"hello from Linux"' <<<"${out}" &&
    grep -q '"type":"stderr","text":"oops"' <<<"${out}" &&
    grep -q '"type":"error".*"evalue":"3"' <<<"${out}"; then
    ok "${mode}: POST /command ($(ms "${t}") ms): stdout, stderr, exit code 3"
  else
    fail "${mode}: POST /command: ${out}"
  fi
  head -c 70000 /dev/urandom >"${tmp}/up.bin"
  code=$(curl -sS -m 30 -o "${tmp}/upload" -w '%{http_code}' "$@" \
    -F 'metadata={"path": "/work/up.bin", "mode": 600};type=application/json' \
    -F "file=@${tmp}/up.bin;type=application/octet-stream" "${base}/files/upload" || true)
  [[ ${code} == 200 ]] && ok "${mode}: POST /files/upload" ||
    fail "${mode}: POST /files/upload: ${code} $(cat "${tmp}/upload")"
  code=$(curl -sS -m 30 -o "${tmp}/down.bin" -w '%{http_code}' "$@" \
    "${base}/files/download?path=/work/up.bin" || true)
  if [[ ${code} == 200 ]] && cmp -s "${tmp}/up.bin" "${tmp}/down.bin"; then
    ok "${mode}: GET /files/download: byte-exact"
  else
    fail "${mode}: GET /files/download: ${code} $(head -c 200 "${tmp}/down.bin")"
  fi
  out=$(curl -sS -m 10 "$@" "${base}/files/info?path=/work/up.bin" || true)
  grep -q '"size":70000' <<<"${out}" && grep -q '"mode":600' <<<"${out}" &&
    ok "${mode}: GET /files/info" || fail "${mode}: GET /files/info: ${out}"
}
[[ ${modes} == proxy ]] || execd_checks direct "http://${direct}"
[[ ${modes} == direct ]] || execd_checks proxy "http://${proxied}" -H "${key_header}"

# pause and resume (commands go through the server proxy: it works with every agent).
code=$(lifecycle -o /dev/null -w '%{http_code}' -X POST "${api}/sandboxes/${id}/pause")
state=$(lifecycle "${api}/sandboxes/${id}" | json 'd["status"]["state"]')
[[ ${code} == 202 && ${state} == Paused ]] && ok "pause: ${code}, state ${state}" ||
  fail "pause: ${code}, state ${state}"
code=$(lifecycle -o /dev/null -w '%{http_code}' -X POST "${api}/sandboxes/${id}/resume")
state=$(lifecycle "${api}/sandboxes/${id}" | json 'd["status"]["state"]')
[[ ${code} == 202 && ${state} == Running ]] && ok "resume: ${code}, state ${state}" ||
  fail "resume: ${code}, state ${state}"
out=$(curl -sS -m 30 -N -H "${key_header}" -H 'Content-Type: application/json' \
  -d '{"command": "echo resumed"}' "http://${proxied}/command" || true)
grep -q '"type":"stdout","text":"resumed"' <<<"${out}" && ok "a command after resume" ||
  fail "a command after resume: ${out}"

t=$(date +%s%N)
code=$(lifecycle -o /dev/null -w '%{http_code}' -X DELETE "${api}/sandboxes/${id}")
[[ ${code} == 204 ]] && ok "delete: 204 ($(ms "${t}") ms)" || fail "delete: ${code}"
code=$(lifecycle -o /dev/null -w '%{http_code}' "${api}/sandboxes/${id}")
[[ ${code} == 404 ]] && ok "get after delete: 404" || fail "get after delete: ${code}"
left=$(docker ps -aq --filter "label=opensandbox.io/id=${id}")
[[ -z ${left} ]] && ok "the container is gone" || fail "container ${left} is still there"

((failures == 0)) || {
  echo "smoke: ${failures} failure(s)"
  exit 1
}
echo "smoke: ok"

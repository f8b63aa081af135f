#!/usr/bin/env bash
# cli_flow.sh SBX OUT_DIR [PLUGIN_DIR] — the multi-step `sbx` CLI (create, exec, cp, status, pause,
# resume, close: one sandbox over several sbx processes, each naming it by its bare id) with the
# opensandbox plugin against the REAL server, run under with_server.sh (it reads
# SBX_REALSERVER_DOMAIN, SBX_REALSERVER_URL, OPEN_SANDBOX_API_KEY, SBX_REALSERVER_NETWORK). Direct
# mode: execd through the endpoint the server hands out; the plugin's config is run_suite.sh's.
# Why: the conformance suite drives one handle inside one process; a user of the CLI connects
# anew for every step from a bare id, so the workdir must come back from the sandbox's metadata
# (decision 216), and a paused sandbox must be seen as paused at once (its execd is frozen: it
# takes connections and never answers), for status and for exec, instead of waiting out a budget.
# Steps, each timed and checked (exit code and output), printed as ok or FAIL:
#   create --workdir /work --ttl 300; exec ID -- pwd (/work); cp up a text and a binary file,
#   exec on them in the workdir (stdout, stderr, exit code 3), cp down (byte-exact); cp with a
#   relative remote path, up and down (relative to the workdir); pause; status (paused, promptly);
#   exec and cp while paused (fail fast: exit 125, FAILED_PRECONDITION or "paused"); resume;
#   status (running); exec (the workdir and files are still there); close; status after close
#   (125, gone); a second sandbox created, paused and closed while paused; both confirmed gone by
#   the server's lifecycle API (GET /v1/sandboxes/ID is 404), no container left on the run's
#   network, the API key in no output.
# OUT_DIR keeps cli.json (the config) and each step's stdout/stderr (NN-step.{out,err}).
# SBX_REALSERVER_PROMPT_S (default 10) bounds "promptly" and "fail fast".
# Exit status 1 if any step failed. A sandbox this script created and did not see closed is
# deleted through the lifecycle API on exit.
set -Eeuo pipefail

(($# >= 2)) || {
  echo "usage: cli_flow.sh SBX OUT_DIR [PLUGIN_DIR]" >&2
  exit 2
}
sbx=$1 out=$2 plugin_dir=${3:-}
: "${SBX_REALSERVER_DOMAIN:?run under with_server.sh}" "${SBX_REALSERVER_URL:?}"
: "${OPEN_SANDBOX_API_KEY:?}" "${SBX_REALSERVER_NETWORK:?}"
mkdir -p "${out}"
out=$(cd "${out}" && pwd)
api=${SBX_REALSERVER_URL}/v1
key_header="OPEN-SANDBOX-API-KEY: ${OPEN_SANDBOX_API_KEY}"
# Bounds for "promptly" and "fails fast": a paused sandbox's execd never answers, and the plugin's
# request budget is 30 s (120 s in this config): well under that proves the pause was seen, not
# waited out. Generous for a loaded 2-core machine.
prompt_s=${SBX_REALSERVER_PROMPT_S:-10}

tmp=$(mktemp -d)
created=() # the ids this script made, deleted on exit unless seen gone
cleanup() {
  local rc=$? id
  trap - EXIT
  for id in "${created[@]}"; do
    curl -sS -m 60 -o /dev/null -X DELETE -H "${key_header}" "${api}/sandboxes/${id}" || true
  done
  rm -rf "${tmp}" # ours: made by mktemp above
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
forget() { # ID: seen gone, nothing to delete on exit
  local i
  for i in "${!created[@]}"; do [[ ${created[i]} != "$1" ]] || unset 'created[i]'; done
}

# The plugin's config, as run_suite.sh writes it for direct mode.
cat >"${out}/cli.json" <<JSON
{"providers": {"os": {"plugin": "opensandbox", "config": {
  "connection": {"domain": "${SBX_REALSERVER_DOMAIN}", "use_server_proxy": false,
                 "request_timeout_s": 120},
  "create": {"retries": 1, "retry_delay_s": 1, "skip_health_check": false},
  "attribution": {"team": "sbx-tests", "workload": "cli-flow-realserver"}
}}}}
JSON
rm -f "${out}"/[0-9][0-9]-*.out "${out}"/[0-9][0-9]-*.err # the last run's (ours: this script's names)

failures=0 n=0
ok() { printf 'ok    %-34s %6d ms  %s\n' "${name}" "${ms}" "$*"; }
fail() {
  printf 'FAIL  %-34s %6d ms  %s\n' "${name}" "${ms}" "$*"
  failures=$((failures + 1))
}
# step NAME ARGS...: runs `sbx ARGS` (config, plugin dir, provider added), its stdout in ${so}, its
# stderr in ${se} (both also kept in OUT_DIR), its exit code in ${rc}, its wall time in ${ms}.
step() {
  name=$1
  shift
  n=$((n + 1))
  local base t cmd=$1
  shift
  base=${out}/$(printf "%02d" "${n}")-${name//[^A-Za-z0-9._-]/_}
  t=$(date +%s%N)
  rc=0
  "${sbx}" "${cmd}" --config "${out}/cli.json" ${plugin_dir:+--plugin-dir "${plugin_dir}"} \
    --provider os "$@" >"${base}.out" 2>"${base}.err" </dev/null || rc=$?
  ms=$((($(date +%s%N) - t) / 1000000))
  so=$(cat "${base}.out") se=$(cat "${base}.err")
}
said() { printf '%s' "rc ${rc}, stdout [${so:0:300}], stderr [${se:0:600}]"; }
# GET /v1/sandboxes/ID through the lifecycle API: the HTTP status.
server_status() { curl -sS -m 60 -o /dev/null -w '%{http_code}' -H "${key_header}" "${api}/sandboxes/$1"; }
server_state() {
  curl -sS -m 60 -H "${key_header}" "${api}/sandboxes/$1" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["status"]["state"])' 2>/dev/null || true
}

# --- the first sandbox -----------------------------------------------------------------------
step "create" create --image sbx-busybox:latest --workdir /work --ttl 300 \
  --metadata flow=cli
id=${so}
if [[ ${rc} == 0 && ${id} =~ ^[A-Za-z0-9_.-]+$ ]]; then
  created+=("${id}")
  ok "id ${id}"
else
  fail "$(said)"
  exit 1
fi
state=$(server_state "${id}")
[[ ${state} == Running ]] || { fail "the server says ${state:-nothing} for ${id}"; }

step "exec pwd (bare id)" exec "${id}" -- pwd
[[ ${rc} == 0 && ${so} == /work ]] && ok "pwd: ${so}" || fail "want rc 0 and /work: $(said)"

printf 'hello from the cli flow\n' >"${tmp}/in.txt"
head -c 70000 /dev/urandom >"${tmp}/data.bin"
sbx_sum=$(sha256sum <"${tmp}/data.bin" | cut -d' ' -f1)
step "cp up (text)" cp "${tmp}/in.txt" "${id}:/work/in.txt"
[[ ${rc} == 0 ]] && ok || fail "$(said)"
step "cp up (binary)" cp "${tmp}/data.bin" "${id}:/work/data.bin"
[[ ${rc} == 0 ]] && ok || fail "$(said)"

step "exec on the files" exec "${id}" -- \
  'tr a-z A-Z < in.txt > out.txt && sha256sum data.bin && cat out.txt; echo oops >&2; exit 3'
if [[ ${rc} == 3 && ${so} == "${sbx_sum}  data.bin"$'\n'"HELLO FROM THE CLI FLOW" &&
  ${se} == oops ]]; then
  ok "stdout, stderr, exit code 3"
else
  fail "want rc 3, the sha256 of data.bin and HELLO...: $(said)"
fi

step "cp down (binary)" cp "${id}:/work/data.bin" "${tmp}/back.bin"
[[ ${rc} == 0 ]] && cmp -s "${tmp}/data.bin" "${tmp}/back.bin" && ok "70000 bytes, byte-exact" ||
  fail "$(said), $(stat -c %s "${tmp}/back.bin" 2>/dev/null || echo no) bytes back"

# A relative REMOTE is relative to the sandbox's workdir (sbx cp --help, docs/sandbox-semantics.md).
step "cp up (relative remote)" cp "${tmp}/in.txt" "${id}:rel.txt"
[[ ${rc} == 0 ]] && ok || fail "$(said)"
step "exec: rel.txt is in /work" exec "${id}" -- \
  'if [ -f /work/rel.txt ]; then cat /work/rel.txt; else echo "no /work/rel.txt"; ls -l /rel.txt; exit 1; fi'
[[ ${rc} == 0 && ${so} == "hello from the cli flow" ]] && ok ||
  fail "want /work/rel.txt: $(said)"
step "cp down (relative remote)" cp "${id}:out.txt" "${tmp}/out.txt"
[[ ${rc} == 0 && $(cat "${tmp}/out.txt" 2>/dev/null) == "HELLO FROM THE CLI FLOW" ]] && ok ||
  fail "want /work/out.txt: $(said), file [$(head -c 200 "${tmp}/out.txt" 2>/dev/null)]"

step "pause" pause "${id}"
state=$(server_state "${id}")
[[ ${rc} == 0 && ${state} == Paused ]] && ok "server state ${state}" || fail "$(said), server state ${state}"

step "status (paused)" status "${id}"
if [[ ${rc} == 0 && ${so} == paused ]] && ((ms < prompt_s * 1000)); then
  ok "${so}"
else
  fail "want rc 0 and paused within ${prompt_s} s: $(said)"
fi

step "exec while paused" exec "${id}" -- echo should-not-run
if [[ ${rc} == 125 && ${se} =~ FAILED_PRECONDITION|paused ]] && ((ms < prompt_s * 1000)) &&
  [[ ${so} != *should-not-run* ]]; then
  ok "fails fast: ${se//$'\n'/ }"
else
  fail "want rc 125 with FAILED_PRECONDITION or paused within ${prompt_s} s: $(said)"
fi

step "cp while paused" cp "${id}:/work/in.txt" "${tmp}/paused.txt"
if [[ ${rc} == 125 && ${se} =~ FAILED_PRECONDITION|paused && ! -e ${tmp}/paused.txt ]] &&
  ((ms < prompt_s * 1000)); then
  ok "fails fast: ${se//$'\n'/ }"
else
  fail "want rc 125 with FAILED_PRECONDITION or paused within ${prompt_s} s, no file: $(said)"
fi

step "resume" resume "${id}"
state=$(server_state "${id}")
[[ ${rc} == 0 && ${state} == Running ]] && ok "server state ${state}" || fail "$(said), server state ${state}"

step "status (running)" status "${id}"
[[ ${rc} == 0 && ${so} == running ]] && ok "${so}" || fail "want rc 0 and running: $(said)"

step "exec after resume" exec "${id}" -- 'pwd; cat out.txt'
[[ ${rc} == 0 && ${so} == "/work"$'\n'"HELLO FROM THE CLI FLOW" ]] && ok "the workdir and files" ||
  fail "want rc 0, /work and HELLO...: $(said)"

step "close" close "${id}"
[[ ${rc} == 0 ]] && ok || fail "$(said)"

step "status after close" status "${id}"
[[ ${rc} == 125 ]] && ok "gone: ${se//$'\n'/ }" || fail "want rc 125 (gone): $(said)"

# --- a second sandbox, closed while paused ---------------------------------------------------
step "create (second)" create --image sbx-busybox:latest --ttl 300 --metadata flow=cli-paused
id2=${so}
if [[ ${rc} == 0 && ${id2} =~ ^[A-Za-z0-9_.-]+$ ]]; then
  created+=("${id2}")
  ok "id ${id2}"

  step "pause (second)" pause "${id2}"
  state=$(server_state "${id2}")
  [[ ${rc} == 0 && ${state} == Paused ]] && ok "server state ${state}" ||
    fail "$(said), server state ${state}"

  step "close while paused" close "${id2}"
  [[ ${rc} == 0 ]] && ok || fail "$(said)"
else
  fail "$(said)"
fi

# --- the server's view: both gone, nothing left on the run's network -------------------------
name="server: both gone" ms=0
t=$(date +%s%N)
codes=
for i in ${id} ${id2:+${id2}}; do
  code=$(server_status "${i}")
  codes+=" ${i}=${code}"
  [[ ${code} != 404 ]] || forget "${i}"
done
ms=$((($(date +%s%N) - t) / 1000000))
[[ ${#created[@]} == 0 ]] && ok "GET /v1/sandboxes/ID:${codes}" || fail "GET /v1/sandboxes/ID:${codes}"

name="server: no container left"
t=$(date +%s%N)
left=$(docker ps -aq --filter "network=${SBX_REALSERVER_NETWORK}" | tr '\n' ' ')
ms=$((($(date +%s%N) - t) / 1000000))
[[ -z ${left} ]] && ok "network ${SBX_REALSERVER_NETWORK} empty" || fail "containers left: ${left}"

name="api key in no output" ms=0
if grep -aqF "${OPEN_SANDBOX_API_KEY}" "${out}"/[0-9][0-9]-*; then fail "the key appears in a step's output"; else ok; fi

((failures == 0)) || {
  echo "cli flow: ${failures} failure(s) (each step's output: ${out})"
  exit 1
}
echo "cli flow: ok"

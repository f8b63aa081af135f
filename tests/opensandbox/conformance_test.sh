#!/bin/sh
# The provider conformance suite against opensandbox -> `sbx serve` -> local_docker, over real
# HTTP on 127.0.0.1 and the real Docker daemon (containers on network "none").
#   conformance_test.sh SBX WORK_DIR
#
# The server runs with an API key (from $SBX_OS_TEST_KEY), so the plugin's direct execd calls must
# carry the endpoint's X-EXECD-ACCESS-TOKEN and its lifecycle calls the key. The whole suite runs in
# direct mode, a few cases again in server-proxy mode (a terminal's WebSocket among them). Three
# cases are left out, because the OpenSandbox protocol cannot carry what they check
# (docs/decisions.md):
#   exec.output,    execd sends output as lines without their terminator: a last line without a
#   files.startup   newline ("printf out", "cat" of a file without one) cannot be told from one
#                   with it, so it comes back with "\n" added;
#   lifecycle.ttl,  a TTL of 3 s: the server refuses TTLs under 60 s, the plugin rounds up to 60 s.
#   exec.sandbox-expired
# Every sandbox the run created (label sbx.run of this server) must be gone from the daemon at the
# end.
set -u
sbx=$1 work=$2
mkdir -p "$work"
image=sbx-busybox:latest
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }


cat > "$work/serve.json" <<JSON
{"providers": {"docker": {"plugin": "local_docker", "config": {}}}}
JSON
SBX_OS_TEST_KEY=test-key-$$-$(date +%s)
export SBX_OS_TEST_KEY
# Emptied here, not by the server's redirection: that happens in the child, maybe after the first
# read below, which would then find a previous run's address (a dead port) in the file.
: > "$work/serve.out"
: > "$work/serve.err"
"$sbx" serve --config "$work/serve.json" --provider docker --listen 127.0.0.1:0 \
  --api-key-env SBX_OS_TEST_KEY > "$work/serve.out" 2> "$work/serve.err" &
server=$!
stop_server() {
  kill -TERM "$server" 2>/dev/null
  wait "$server"
}

address=
i=0
while [ $i -lt 600 ]; do
  address=$(sed -n 's|.*listening on http://\([0-9.]*:[0-9]*\).*|\1|p' "$work/serve.out")
  [ -n "$address" ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
  i=$((i + 1))
done
if [ -z "$address" ]; then
  echo "sbx serve did not start:"
  cat "$work/serve.out" "$work/serve.err"
  stop_server
  exit 1
fi
echo "sbx serve listening on $address"
# Every sandbox of this server carries its run label (other users of the daemon have their own).
run_label=$(sed -n 's|.*sbx\.run=\([^)]*\)).*|\1|p' "$work/serve.out")
[ -n "$run_label" ] || fail "sbx serve printed no sbx.run"

# The plugin's config: the server's address, the key from the environment (OPEN_SANDBOX_API_KEY),
# the default pull-policy extensions (local_docker behind sbx serve honours them).
write_config() {  # FILE USE_SERVER_PROXY (also skips the /ping health check: the probe alone)
  cat > "$1" <<JSON
{"providers": {"os": {"plugin": "opensandbox", "config": {
  "connection": {"domain": "$address", "use_server_proxy": $2, "request_timeout_s": 120},
  "create": {"retries": 1, "retry_delay_s": 1, "skip_health_check": $2},
  "attribution": {"team": "sbx-tests", "workload": "conformance"}
}}}}
JSON
}
write_config "$work/direct.json" false
write_config "$work/proxy.json" true

run() {  # CONFIG PATTERN [SKIP]
  echo "== sbx conformance --only '$2'${3:+ --skip '$3'} ($1)"
  OPEN_SANDBOX_API_KEY=$SBX_OS_TEST_KEY SBX_LOG_LEVEL=debug "$sbx" conformance --config "$1" \
    --provider os --image "$image" --only "$2" ${3:+--skip} ${3:+"$3"} > "$work/suite.out" 2>&1
  rc=$?
  # The suite's lines (the plugin's debug log goes to suite.all, searched for the key below).
  grep -E '^(ok|FAILED|not offered|    |[0-9]+ cases? on|failed:)' "$work/suite.out"
  cat "$work/suite.out" >> "$work/suite.all"
  [ "$rc" = 0 ] || fail "conformance --only '$2' with $1"
}
: > "$work/suite.all"
for pattern in 'lifecycle.[!t]*' 'files.[!s]*' 'ext.*' 'labels.*'; do
  run "$work/direct.json" "$pattern"
done
run "$work/direct.json" 'exec.[!o]*' 'exec.sandbox-expired'
for pattern in 'exec.exit-code' 'exec.streaming' 'exec.sandbox-closed' 'files.round-trip' 'ext.pty.attach'; do
  run "$work/proxy.json" "$pattern"
done

# A probe that never passes: each attempt's sandbox is deleted on the server, the create is tried
# again (create.retries 1) and then fails with the probe's message; the server holds nothing.
cat > "$work/badprobe.json" <<JSON
{"providers": {"os": {"plugin": "opensandbox", "config": {
  "connection": {"domain": "$address"},
  "create": {"retries": 1, "retry_delay_s": 0.1, "connect_poll_s": 0.2},
  "probe": {"command": "echo not-yet", "expected_stdout": "ready", "timeout_s": 2, "deadline_s": 1.5}
}}}}
JSON
echo "== a create whose probe never passes"
OPEN_SANDBOX_API_KEY=$SBX_OS_TEST_KEY "$sbx" run --config "$work/badprobe.json" --provider os \
  --image "$image" --ttl 600 -- echo unreachable > "$work/badprobe.out" 2>&1
rc=$?
cat "$work/badprobe.out"
[ "$rc" != 0 ] || fail "a create whose probe fails succeeded"
grep -qF "failed create probe command before the startup deadline" "$work/badprobe.out" ||
  fail "the failed probe's message is missing"
grep -qF "unreachable" "$work/badprobe.out" && fail "the command ran after a failed create"
grep -qF "Retrying OpenSandbox sandbox create after attempt 1" "$work/badprobe.out" ||
  fail "the failed probe was not retried"
left=$(curl -s --noproxy "*" -H "OPEN-SANDBOX-API-KEY: $SBX_OS_TEST_KEY" "http://$address/v1/sandboxes")
case "$left" in
  *'"items":[]'*) ;;
  *) fail "the server still holds sandboxes after the failed creates: $left" ;;
esac
cat "$work/badprobe.out" >> "$work/suite.all"

# The key is a secret: never in the server's or the suite's logs.
if grep -qF "$SBX_OS_TEST_KEY" "$work/serve.out" "$work/serve.err" "$work/suite.all"; then
  fail "the API key appears in the server's or the suite's output"
fi

stop_server
left=$(docker ps -aq --filter "label=sbx.run=$run_label")
[ -z "$left" ] || fail "containers left behind: $(echo "$left" | tr '\n' ' ')"
[ "$failures" = 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "conformance.opensandbox: ok"

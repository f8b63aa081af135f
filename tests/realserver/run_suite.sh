#!/usr/bin/env bash
# run_suite.sh MODE SBX OUT_DIR [PLUGIN_DIR] — the provider conformance suite (every case) with
# the opensandbox plugin against the real server, run under with_server.sh (it reads
# SBX_REALSERVER_DOMAIN and OPEN_SANDBOX_API_KEY, the key the plugin sends). MODE is `direct`
# (execd through the endpoint the server hands out) or `proxy` (through the server's
# /sandboxes/{id}/proxy/44772). The plugin's config is the one tests/opensandbox/conformance_test.sh
# gives it for `sbx serve`. Writes OUT_DIR/MODE.json (the config), MODE.out (the suite's output,
# the plugin's debug log included, and a "check failed:" line for a sandbox left on the run's
# network or the key found in a log) and MODE.junit.xml. Exit status: the suite's.
set -Eeuo pipefail

(($# >= 3)) || {
  echo "usage: run_suite.sh direct|proxy SBX OUT_DIR [PLUGIN_DIR]" >&2
  exit 2
}
mode=$1 sbx=$2 out=$3 plugin_dir=${4:-}
: "${SBX_REALSERVER_DOMAIN:?run under with_server.sh}" "${OPEN_SANDBOX_API_KEY:?}"
: "${SBX_REALSERVER_NETWORK:?}" "${SBX_REALSERVER_LOG:?}"
case ${mode} in
direct) proxy=false ;;
proxy) proxy=true ;;
*)
  echo "run_suite.sh: MODE is direct or proxy, not ${mode}" >&2
  exit 2
  ;;
esac
mkdir -p "${out}"

# As in conformance_test.sh: the server's address, the key from the environment, one create
# retry; in proxy mode no /ping health check (the probe alone proves readiness).
cat >"${out}/${mode}.json" <<JSON
{"providers": {"os": {"plugin": "opensandbox", "config": {
  "connection": {"domain": "${SBX_REALSERVER_DOMAIN}", "use_server_proxy": ${proxy},
                 "request_timeout_s": 120},
  "create": {"retries": 1, "retry_delay_s": 1, "skip_health_check": ${proxy}},
  "attribution": {"team": "sbx-tests", "workload": "conformance-realserver"}
}}}}
JSON

# lifecycle.ttl and exec.sandbox-expired are not run: the server refuses a TTL under 60 s, so the
# cases can only fail, and waiting them out cost 34 s each per mode (conformance.sh lists them
# among the limits).
args=(conformance --config "${out}/${mode}.json" --provider os --image sbx-busybox:latest
  --skip lifecycle.ttl,exec.sandbox-expired --junit "${out}/${mode}.junit.xml")
[[ -z ${plugin_dir} ]] || args+=(--plugin-dir "${plugin_dir}")
rc=0
SBX_LOG_LEVEL=debug "${sbx}" "${args[@]}" >"${out}/${mode}.out" 2>&1 || rc=$?
# Checks of the whole run, as conformance_test.sh makes them, appended as "check failed:" lines:
# every sandbox closed (nothing left on the run's network), the key in no log.
left=$(docker ps -aq --filter "network=${SBX_REALSERVER_NETWORK}" | tr '\n' ' ')
[[ -z ${left} ]] || echo "check failed: sandbox containers left behind: ${left}" >>"${out}/${mode}.out"
if grep -aqF "${OPEN_SANDBOX_API_KEY}" "${out}/${mode}.out" "${SBX_REALSERVER_LOG}"; then
  echo "check failed: the API key appears in the suite's or the server's log" >>"${out}/${mode}.out"
fi
# The suite's own lines (the plugin's debug log stays in the file).
grep -aE '^(ok|FAILED|not offered|    |[0-9]+ cases? on|failed:|check failed:)' "${out}/${mode}.out" ||
  true
exit "${rc}"

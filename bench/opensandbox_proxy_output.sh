#!/usr/bin/env bash
# The real OpenSandbox server's two ways to a sandbox's execd, timed with plain curl (no sbx code
# on the client side): a command with large output (`seq 1 N`, 7,000,000 by default: 54 MB of
# lines, 433 MB of execd events) read straight from the sandbox's endpoint and through the
# server's /v1/sandboxes/{id}/proxy/44772, rounds alternating; prints each round's seconds and
# bytes. By hand (about ten minutes with the default N), under the real-server harness:
#   tests/realserver/with_server.sh build/realserver/setup WORK -- bench/opensandbox_proxy_output.sh [N] [ROUNDS]
# (setup as tests/realserver/README.md says). The sandbox it creates is deleted at the end, and
# with_server.sh removes whatever is left on its network.
set -euo pipefail
lines=${1:-7000000}
rounds=${2:-2}
key="OPEN-SANDBOX-API-KEY: ${OPEN_SANDBOX_API_KEY:?run under tests/realserver/with_server.sh}"
url=${SBX_REALSERVER_URL:?run under tests/realserver/with_server.sh}
field() { python3 -c "import sys, json; print(json.load(sys.stdin)$1)"; }

id=$(curl -sf -X POST "$url/v1/sandboxes" -H "$key" -H 'content-type: application/json' \
  -d '{"image":{"uri":"sbx-busybox:latest"},"entrypoint":["sleep","3600"],"timeout":3600,"resourceLimits":{"cpu":"1","memory":"512Mi"}}' |
  field "['id']")
trap 'curl -s -o /dev/null -X DELETE "$url/v1/sandboxes/$id" -H "$key"' EXIT
for _ in $(seq 1 120); do
  state=$(curl -sf "$url/v1/sandboxes/$id" -H "$key" | field "['status']['state']")
  [[ $state == Running ]] && break
  sleep 0.5
done
endpoint=$(curl -sf "$url/v1/sandboxes/$id/endpoints/44772" -H "$key" | field "['endpoint']")
out=$(mktemp)
trap 'rm -f "$out"; curl -s -o /dev/null -X DELETE "$url/v1/sandboxes/$id" -H "$key"' EXIT
body="{\"command\":\"seq 1 $lines\"}"
for ((r = 1; r <= rounds; r++)); do
  for mode in direct proxy; do
    # The API key goes to the server only, never to the sandbox's own endpoint.
    if [[ $mode == direct ]]; then
      target="http://$endpoint/command" auth=()
    else
      target="$url/v1/sandboxes/$id/proxy/44772/command" auth=(-H "$key")
    fi
    start=$(date +%s%N)
    curl -sf -N -X POST "$target" "${auth[@]}" -H 'content-type: application/json' -d "$body" \
      -o "$out"
    end=$(date +%s%N)
    printf '%s round %d: %.1f s, %d bytes of events\n' "$mode" "$r" \
      "$(awk "BEGIN { print ($end - $start) / 1e9 }")" "$(stat -c %s "$out")"
  done
done

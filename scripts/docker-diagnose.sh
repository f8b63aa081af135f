#!/usr/bin/env bash
# docker-diagnose.sh — prints, in about 60 lines, what a failed or stuck test
# run needs to know about the machine and its Docker daemon: load, disk,
# memory, open files, whether the daemon answers, its containers, what its
# goroutines have been waiting on for a minute or more (a goroutine dump, by
# SIGUSR1) and the last lines of its log. Every step is bounded in time, so it
# also reports on a daemon that no longer answers. Read-only, apart from the
# dump file dockerd writes under /var/run/docker.
#
# Usage: scripts/docker-diagnose.sh [WHY]
set -uo pipefail

SOCK=/var/run/docker.sock
DOCKERD_LOG=/var/log/sbx-dockerd.log
if [[ -x /usr/bin/docker ]]; then docker=/usr/bin/docker; else docker=docker; fi

section() { printf -- '--- %s\n' "$*"; }

printf '=== docker-diagnose: %s (%s)\n' "${1:-diagnostics}" "$(date -u +%FT%TZ)"
section "load, disk, memory"
uptime
df -h / /tmp /var/lib/docker 2>/dev/null | awk 'NR == 1 || !seen[$0]++'
free -m | head -2

section "the daemon"
ping=$(curl -sS -m 5 --unix-socket "${SOCK}" http://localhost/_ping 2>&1)
printf '_ping: %s\n' "${ping}"
dockerd_pid=$(pgrep -x dockerd | head -1)
if [[ -n ${dockerd_pid} ]]; then
  printf 'dockerd pid %s: %s open files (limit %s), %s threads\n' "${dockerd_pid}" \
    "$(find "/proc/${dockerd_pid}/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)" \
    "$(awk '/^Max open files/ { print $4 }' "/proc/${dockerd_pid}/limits" 2>/dev/null)" \
    "$(awk '/^Threads/ { print $2 }' "/proc/${dockerd_pid}/status" 2>/dev/null)"
else
  printf 'no dockerd process\n'
fi
printf 'processes in D state: %s\n' "$(ps -eo stat=,comm= | awk '$1 ~ /^D/ { printf "%s ", $2 }')"

section "containers (docker ps -a, 10 s at most)"
timeout 10 "${docker}" -H "unix://${SOCK}" ps -a --format '{{.ID}} {{.Image}} {{.Status}} {{.Names}}' 2>&1 |
  head -20 || printf '(no answer within 10 s)\n'

if [[ -n ${dockerd_pid} ]]; then
  section "dockerd: API requests waiting 1 minute or more (a goroutine dump, by SIGUSR1)"
  before=$(date +%s)
  kill -USR1 "${dockerd_pid}" 2>/dev/null
  dump=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.5
    dump=$(find /var/run/docker -maxdepth 1 -name 'goroutine-stacks-*.log' -newermt "@${before}" 2>/dev/null | tail -1)
    [[ -n ${dump} ]] && break
  done
  if [[ -z ${dump} ]]; then
    printf '(dockerd wrote no goroutine dump)\n'
  else
    printf '%s: %s goroutines\n' "${dump}" "$(grep -c '^goroutine ' "${dump}")"
    # A request handler (under net/http's conn.serve) blocked for minutes: its state and the
    # daemon's first three frames, counted.
    awk '
      function flush() { if (waiting && serving) print head " |" frames; waiting = serving = 0 }
      /^goroutine / { flush(); head = $0; sub(/^goroutine [0-9]+ /, "", head); sub(/:$/, "", head)
                      waiting = ($0 ~ /minutes?\]:$/); frames = ""; n = 0; next }
      /net\/http\.\(\*conn\)\.serve/ { serving = 1 }
      /^github\.com\/docker\// && !/middleware|api\/server\.\(\*Server\)/ && n < 3 { f = $0; sub(/\((0x|\{|\.\.\.|\)).*$/, "", f)
                                      sub(/^github\.com\/docker\/docker\//, "", f); frames = frames " " f; n++ }
      END { flush() }
    ' "${dump}" | sort | uniq -c | sort -rn | head -15
  fi
fi

section "the last lines of ${DOCKERD_LOG}"
tail -n 15 "${DOCKERD_LOG}" 2>/dev/null | cut -c1-300
printf '=== docker-diagnose: end\n'

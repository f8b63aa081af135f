#!/usr/bin/env bash
# `sbx shell ID --attach TERMINAL` from another process, on local_docker (its terminals live in the
# sandbox's agent): tmux runs two `sbx shell` processes in panes of its own server. Checks: the
# second process replays what the first printed and takes the terminal over (the first says so
# and exits 125), typed input reaches the terminal from the second, its exit code is the remote
# one, and the sandbox is closed at the end.
# Usage: shell_attach_test.sh SBX_CLI PLUGIN_DIR
set -euo pipefail
sbx_cli=$1 plugin_dir=$2

dir=$(mktemp -d "${TMPDIR:-/tmp}/sbx-shell-attach-XXXXXX")
socket="sbx-shell-attach-$$"
sbx=("${sbx_cli}" --plugin-dir "${plugin_dir}")
cleanup() {
  tmux -L "${socket}" kill-server 2>/dev/null || true
  [[ -n ${id:-} ]] && "${sbx[@]}" close "${id}" >/dev/null 2>&1 || true
  rm -f "${dir}/a.rc" "${dir}/b.rc" "${dir}/a.sh" "${dir}/b.sh"
  rmdir "${dir}" 2>/dev/null || echo "shell_attach_test: ${dir} is not empty" >&2
}
trap cleanup EXIT
pane() { tmux -L "${socket}" capture-pane -p -t "$1"; }
fail() {
  echo "shell_attach_test: FAIL: $*" >&2
  for p in a b; do echo "--- pane ${p}:" >&2; pane "${p}" >&2 || true; done
  exit 1
}
# Waits (at most 30 s) for pane $1 to show a line matching the regular expression $2.
wait_for() {
  local i
  for ((i = 0; i < 600; i++)); do
    pane "$1" 2>/dev/null | grep -Eq -- "$2" && return 0
    sleep 0.05
  done
  fail "pane $1 never showed /$2/"
}
keys() { tmux -L "${socket}" send-keys -t "$1" "${@:2}"; }

id=$("${sbx[@]}" create --image sbx-busybox:latest --ttl 600)

# Pane a: a new terminal. Each pane records sbx's exit status.
printf '%s\n' "${sbx[*]} shell ${id}" "echo \$? > ${dir}/a.rc" "echo pane-done" "sleep 600" \
  >"${dir}/a.sh"
tmux -L "${socket}" -f /dev/null new-session -d -s a -x 100 -y 30 "bash ${dir}/a.sh"
wait_for a '^sbx: terminal [0-9a-f]+ '
terminal=$(pane a | sed -n 's/^sbx: terminal \([0-9a-f]*\) .*/\1/p' | head -1)
keys a 'echo marker-$((6*7))' Enter
wait_for a '^marker-42'

# Pane b: another process comes back to it by id.
printf '%s\n' "${sbx[*]} shell ${id} --attach ${terminal}" "echo \$? > ${dir}/b.rc" \
  "echo pane-done" "sleep 600" >"${dir}/b.sh"
tmux -L "${socket}" new-session -d -s b -x 100 -y 30 "bash ${dir}/b.sh"
wait_for b '^marker-42'  # the agent's replay of what pane a's process saw
wait_for a 'another client took terminal'
wait_for a '^pane-done$'
[[ $(cat "${dir}/a.rc") == 125 ]] || fail "the taken-over sbx shell exited $(cat "${dir}/a.rc")"
keys b 'echo from-b-$((2*3))' Enter
wait_for b '^from-b-6'
keys b 'exit 3' Enter
wait_for b '^pane-done$'
[[ $(cat "${dir}/b.rc") == 3 ]] || fail "sbx shell --attach exited $(cat "${dir}/b.rc"), not 3"
"${sbx[@]}" close "${id}"
id=
echo "shell_attach_test: ok"

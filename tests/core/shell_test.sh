#!/usr/bin/env bash
# `sbx shell` on a real terminal: tmux runs it in a pane of its own server (its own socket), the
# test sends keys and reads the pane. Over test_processes (a sandbox directory under a root this
# test makes). Checks: echo through the TTY, the window size at the start and after a resize
# (SIGWINCH followed), Ctrl-C interrupting the remote command and not sbx, the remote exit code as
# sbx's own, the terminal's mode restored after sbx exits, --attach of an unknown terminal
# refused clearly, and nothing left behind.
# Usage: shell_test.sh SBX_CLI PLUGIN_DIR
set -euo pipefail
sbx_cli=$1 plugin_dir=$2

root=$(mktemp -d "${TMPDIR:-/tmp}/sbx-shell-test-XXXXXX")
socket="sbx-shell-test-$$"
cleanup() {
  tmux -L "${socket}" kill-server 2>/dev/null || true
  [[ -n ${id:-} ]] && TMPDIR=${root} "${sbx_cli}" --plugin-dir "${plugin_dir}" close \
    --provider test_processes "${id}" >/dev/null 2>&1 || true
  rm -f "${root}/rc" "${root}/stty-before" "${root}/stty-after" "${root}/run.sh"
  rmdir "${root}" 2>/dev/null || echo "shell_test: ${root} is not empty" >&2
}
trap cleanup EXIT
fail() { echo "shell_test: FAIL: $*" >&2; echo "--- pane:" >&2; pane >&2 || true; exit 1; }
pane() { tmux -L "${socket}" capture-pane -p -t shell; }
# Waits (at most 20 s) for the pane to show a line matching the regular expression $1.
wait_for() {
  local i
  for ((i = 0; i < 400; i++)); do
    pane | grep -Eq -- "$1" && return 0
    sleep 0.05
  done
  fail "the pane never showed /$1/"
}
keys() { tmux -L "${socket}" send-keys -t shell "$@"; }

sbx=("${sbx_cli}" --plugin-dir "${plugin_dir}")
id=$(TMPDIR=${root} "${sbx[@]}" create --provider test_processes)

# The pane runs sbx shell between two `stty -g` of the same terminal, then records its status.
cat >"${root}/run.sh" <<SCRIPT
stty -g > "${root}/stty-before"
TMPDIR=${root} ${sbx[*]} shell --provider test_processes ${id}
echo \$? > "${root}/rc.tmp"
stty -g > "${root}/stty-after"
mv "${root}/rc.tmp" "${root}/rc"
echo pane-done
sleep 600
SCRIPT
tmux -L "${socket}" -f /dev/null new-session -d -s shell -x 100 -y 30 "bash ${root}/run.sh"

wait_for '^sbx: terminal t'
keys 'echo hello-$((6*7))' Enter
wait_for '^hello-42$'
keys 'stty size' Enter
wait_for '^30 100$'
tmux -L "${socket}" resize-window -t shell -x 90 -y 20
keys 'stty size' Enter
wait_for '^20 90$'
keys 'sleep 61; echo not-interrupted' Enter
# Ctrl-C once the remote sleep runs (test_processes' commands are host processes).
for ((i = 0; i < 400; i++)); do
  pgrep -f '^sleep 61$' >/dev/null && break
  sleep 0.05
done
pgrep -f '^sleep 61$' >/dev/null || fail "the remote sleep never started"
keys C-c
# Type on once the shell is back at a bare prompt: keys sent while the remote tty still ran the
# sleep are echoed by the line discipline before ash redraws, and the output line merges with it.
for ((i = 0; i < 400; i++)); do
  pgrep -f '^sleep 61$' >/dev/null || break
  sleep 0.05
done
wait_for '^#$'
keys 'echo after-ctrl-c' Enter
wait_for '^after-ctrl-c$'
pane | grep -q '^not-interrupted$' && fail "Ctrl-C did not interrupt the remote sleep"
keys 'exit 7' Enter
wait_for '^pane-done$'
[[ $(cat "${root}/rc") == 7 ]] || fail "sbx shell exited $(cat "${root}/rc"), not the remote 7"
cmp -s "${root}/stty-before" "${root}/stty-after" || fail "the terminal's mode was not restored"

# An unknown terminal: a clear message and 125.
set +e
out=$(TMPDIR=${root} "${sbx[@]}" shell --provider test_processes "${id}" --attach t999-9 </dev/null 2>&1)
rc=$?
set -e
[[ ${rc} == 125 ]] || fail "--attach of an unknown terminal exited ${rc}: ${out}"
grep -q 'terminal t999-9 not found' <<<"${out}" || fail "unclear message: ${out}"
echo "shell_test: ok"

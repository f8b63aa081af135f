#!/bin/sh
# bootstrap.sh — the sandbox's entrypoint under the real OpenSandbox server (Docker runtime).
#
# The server copies this file from the execd image (/bootstrap.sh) to /opt/opensandbox/bootstrap.sh
# in every sandbox container, next to /opt/opensandbox/execd (our sbx-agent), and creates the
# container with this script as ENTRYPOINT and the create request's `entrypoint` array as CMD, so
# the user's program arrives here as "$@". It runs under the sandbox image's /bin/sh: plain POSIX
# sh, no external program (minimal images have no dirname, no mkdir).
#
# The agent replaces this shell (exec) and becomes the container's PID 1: it serves execd's HTTP
# API on port 44772 (the port the server publishes and proxies to) and starts the user's program
# as its child after `--`. It forwards docker stop's signals to that program, reaps orphans, and
# exits with the program's exit code when it ends, as the container would have. (execd's own
# bootstrap offers two topologies, selected by EXECD_INIT; ours is always "agent as init".)
#
# The server's Docker runtime passes no access token (its endpoints carry no
# X-EXECD-ACCESS-TOKEN header), so the agent runs without one, as execd does there; an operator
# who sets SBX_AGENT_TOKEN through the server's [docker].sandbox_env turns the agent's check on
# (the agent reads that variable and keeps it from the commands' environments).
set -eu

case $0 in
  */*) here=${0%/*} ;;             # /opt/opensandbox, where the server put execd beside us
  *) here=/opt/opensandbox ;;
esac
listen=tcp:0.0.0.0:44772           # execd's port: the server publishes it and proxies to it

# As execd's bootstrap: EXECD_ENVS names a file whose KEY=VALUE lines every command gets (the
# agent reads it for each command, under the request's envs), /opt/opensandbox/.env unless the
# sandbox's env names another; it is made empty when missing (where that cannot be, commands run
# without it).
EXECD_ENVS=${EXECD_ENVS:-$here/.env}
[ -e "$EXECD_ENVS" ] || { : > "$EXECD_ENVS"; } 2>/dev/null || true
export EXECD_ENVS

if [ "$#" -gt 0 ]; then
  exec "$here/execd" --listen "$listen" -- "$@"
fi
exec "$here/execd" --listen "$listen"  # no entrypoint: the agent alone keeps the sandbox alive

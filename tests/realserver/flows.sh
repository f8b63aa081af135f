#!/usr/bin/env bash
# flows.sh SBX AGENT WORK_DIR [PLUGIN_DIR] — two user flows against the REAL OpenSandbox server
# 1.1.1 whose execd is AGENT (our sbx-agent), each on a server of its own (with_server.sh); what
# the ctest realserver.flows runs:
#   cli     cli_flow.sh: the multi-step `sbx` CLI (create, exec, cp, pause, status, resume,
#           close, a sandbox closed while paused) through the opensandbox plugin in direct mode,
#           each step a new sbx process naming the sandbox by its bare id.
#   python  python_sdk_flow.py: the official Python SDK (opensandbox==1.1.1, pinned in
#           tests/clients/requirements.txt) in direct and server-proxy mode: create with an
#           entrypoint, commands, files, kill; nothing left on the server afterwards.
# Why: realserver.conformance drives the plugin through one handle in one process; these are the
# paths a user takes: a CLI that reconnects from an id at every step (the workdir from the
# sandbox's metadata, a paused sandbox seen at once), and the official client talking to the
# agent as its execd.
# The SDK is installed by tests/clients/setup.sh into WORK_DIR/clients (cached by its stamp, the
# same pins as tests/clients). Results: WORK_DIR/results/cli-flow/ (each step's output),
# WORK_DIR/results/python-flow.out; server logs in WORK_DIR/flow-{cli,python}/.
# SBX_REALSERVER_FLOWS (default "cli python") picks the flows. Exit status 1 if any flow failed.
set -Eeuo pipefail

(($# >= 3)) || {
  echo "usage: flows.sh SBX AGENT WORK_DIR [PLUGIN_DIR]" >&2
  exit 2
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sbx=$1 agent=$2 work=$3 plugin_dir=${4:-}
mkdir -p "${work}"
work=$(cd "${work}" && pwd)
results=${work}/results
"${here}/setup.sh" "${work}/setup" "${agent}"
mkdir -p "${results}"

problems=()
for flow in ${SBX_REALSERVER_FLOWS:-cli python}; do
  echo "=== ${flow} flow"
  started=$(date +%s%N)
  rc=0
  case ${flow} in
  cli)
    "${here}/with_server.sh" "${work}/setup" "${work}/flow-cli" -- \
      "${here}/cli_flow.sh" "${sbx}" "${results}/cli-flow" ${plugin_dir:+"${plugin_dir}"} || rc=$?
    ;;
  python)
    if ! "${here}/../clients/setup.sh" "${work}/clients"; then
      problems+=("python: the official Python SDK could not be installed (above)")
      continue
    fi
    PYTHONDONTWRITEBYTECODE=1 "${here}/with_server.sh" "${work}/setup" "${work}/flow-python" -- \
      "${work}/clients/venv/bin/python" "${here}/python_sdk_flow.py" both 2>&1 |
      tee "${results}/python-flow.out" || rc=$?
    ;;
  *)
    problems+=("unknown flow ${flow} (SBX_REALSERVER_FLOWS: cli, python)")
    continue
    ;;
  esac
  echo "(${flow} flow: $((($(date +%s%N) - started) / 1000000)) ms, exit status ${rc})"
  ((rc == 0)) || problems+=("${flow}: the flow failed (exit status ${rc}, its FAIL lines above)")
done

if ((${#problems[@]} > 0)); then
  echo "=== realserver flows: ${#problems[@]} problem(s)"
  printf '  %s\n' "${problems[@]}"
  exit 1
fi
echo "=== realserver flows: ok"

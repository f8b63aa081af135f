"""The official OpenSandbox Python SDK (PyPI opensandbox==1.1.1, tests/clients/requirements.txt)
against the REAL OpenSandbox server, whose execd is our sbx-agent: run under with_server.sh, which
sets OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY (the SDK's own variables) and
SBX_REALSERVER_NETWORK.

Why: tests/clients proves `sbx serve` against the official clients; this proves the agent's execd
fidelity against the official client where it matters, behind the real server: the SDK resolves
the endpoint the server hands out, polls /ping, and speaks execd's command and file APIs to the
agent (direct mode: 127.0.0.1:PORT/proxy/44772; server-proxy mode: /v1/sandboxes/ID/proxy/44772).

    python_sdk_flow.py [direct|proxy|both]      (default both, one sandbox per mode)

Cases for each mode, in order, timed: create (image sbx-busybox:latest, an entrypoint of our own;
state, metadata, entrypoint, the execd endpoint, /ping), the entrypoint ran with its arguments,
a command's stdout and exit code, a command with a nonzero exit (stderr, the error event),
write_file/read_file round trips (text, every byte value, a range, file info, seen by a command),
kill (get_info and a second kill are 404). Then, once: nothing is left, neither on the server
(its list, every state) nor on the run's Docker network.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

# The ordered case runner of tests/clients (prints PASS/FAIL NAME (N s), then "N passed, N failed").
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "harness"))
from runner import case, check, check_eq, run  # noqa: E402

from opensandbox import Sandbox, SandboxManager  # noqa: E402
from opensandbox.config import ConnectionConfig  # noqa: E402
from opensandbox.exceptions import SandboxApiException  # noqa: E402
from opensandbox.models.execd import RunCommandOpts  # noqa: E402
from opensandbox.models.sandboxes import SandboxFilter  # noqa: E402

IMAGE = "sbx-busybox:latest"
# Ours, so a check can see it ran with its arguments intact (through the server's bootstrap and
# the agent, which runs it after `--`): it leaves a marker, then sleeps as the sandbox's workload.
ENTRYPOINT = ["sh", "-c", 'echo "entrypoint ran: $0 $1" > /tmp/entrypoint.txt; exec sleep infinity',
              "first arg", "second"]
METADATA = {"suite": "realserver", "flow": "python-sdk"}


class State:
    def __init__(self, mode: str):
        self.mode = mode
        self.sandbox: Sandbox | None = None
        self.killed = False

    def config(self) -> ConnectionConfig:
        # Domain and key from OPEN_SANDBOX_DOMAIN / OPEN_SANDBOX_API_KEY, as a user's would.
        return ConnectionConfig(use_server_proxy=self.mode == "proxy",
                                request_timeout=timedelta(seconds=120))

    def box(self) -> Sandbox:
        check(self.sandbox is not None, "no sandbox (create failed)")
        return self.sandbox

    async def cleanup(self):
        if self.sandbox is not None and not self.killed:
            try:
                await self.sandbox.kill()
            finally:
                await self.sandbox.close()


@case
async def create(state: State):
    sandbox = await Sandbox.create(
        IMAGE,
        entrypoint=ENTRYPOINT,
        timeout=timedelta(minutes=10),
        metadata=METADATA,
        connection_config=state.config(),
        ready_timeout=timedelta(seconds=60),
    )
    state.sandbox = sandbox
    check(sandbox.id, "no sandbox id")
    info = await sandbox.get_info()
    check_eq(info.status.state, "Running", "state after create")
    check_eq(info.entrypoint, ENTRYPOINT, "entrypoint")
    check(all(info.metadata.get(k) == v for k, v in METADATA.items()),
          f"metadata {info.metadata} lacks {METADATA}")
    check(info.expires_at is not None, "no expiresAt with a timeout")
    endpoint = await sandbox.get_endpoint(44772)
    domain = os.environ["OPEN_SANDBOX_DOMAIN"]
    if state.mode == "proxy":
        check_eq(endpoint.endpoint, f"{domain}/v1/sandboxes/{sandbox.id}/proxy/44772",
                 "server-proxy execd endpoint")
    else:
        # The Docker runtime publishes 44772 on 127.0.0.1 at a port of Docker's choosing.
        host, _, rest = endpoint.endpoint.partition(":")
        check(host == "127.0.0.1" and rest.endswith("/proxy/44772") and rest != domain,
              f"direct execd endpoint {endpoint.endpoint}")
    check(await sandbox.is_healthy(), "ping failed")
    print(f"  {state.mode}: sandbox {sandbox.id}, execd at {endpoint.endpoint}")


@case
async def entrypoint_ran(state: State):
    commands = state.box().commands
    # The agent starts the entrypoint as the sandbox starts; wait for its marker (bounded).
    deadline = time.monotonic() + 20
    while True:
        execution = await commands.run("cat /tmp/entrypoint.txt 2>/dev/null")
        if execution.exit_code == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    check_eq([m.text for m in execution.logs.stdout], ["entrypoint ran: first arg second"],
             "the entrypoint's marker")
    execution = await commands.run("ps -o args | grep -x 'sleep infinity'")
    check_eq(execution.exit_code, 0, "the entrypoint's sleep is running")


@case
async def command_stdout_and_exit_code(state: State):
    execution = await state.box().commands.run("echo hello; echo from $(uname -s)")
    check_eq([m.text for m in execution.logs.stdout], ["hello", "from Linux"], "stdout lines")
    check_eq(execution.logs.stderr, [], "stderr")
    check_eq(execution.exit_code, 0, "exit code")
    check(execution.error is None, f"unexpected error {execution.error}")
    check(execution.complete is not None, "no execution_complete")
    check(execution.id, "no command id from init")


@case
async def nonzero_exit(state: State):
    execution = await state.box().commands.run("echo out; echo oops >&2; exit 3")
    check_eq([m.text for m in execution.logs.stdout], ["out"], "stdout")
    check_eq([m.text for m in execution.logs.stderr], ["oops"], "stderr")
    check_eq(execution.exit_code, 3, "exit code")
    check(execution.error is not None, "no error event")
    check_eq(execution.error.name, "CommandExecError", "error name")
    check_eq(execution.error.value, "3", "error value")
    check(execution.complete is None, "execution_complete after an error")


@case
async def write_and_read_files(state: State):
    box = state.box()
    files = box.files
    await files.write_file("/tmp/flow/hello.txt", "hello file\n", mode=644)
    check_eq(await files.read_file("/tmp/flow/hello.txt"), "hello file\n", "text read back")
    check_eq(await files.read_bytes("/tmp/flow/hello.txt", range_header="bytes=6-"), b"file\n",
             "range read")
    every_byte = bytes(range(256)) * 300  # 76800 bytes: NUL, CR, LF, invalid UTF-8 included
    await files.write_file("/tmp/flow/bytes.bin", every_byte, mode=600)
    check(await files.read_bytes("/tmp/flow/bytes.bin") == every_byte, "bytes not read back exact")
    info = await files.get_file_info(["/tmp/flow/hello.txt", "/tmp/flow/bytes.bin"])
    check_eq(info["/tmp/flow/hello.txt"].size, 11, "size of hello.txt")
    check_eq(info["/tmp/flow/bytes.bin"].size, len(every_byte), "size of bytes.bin")
    check_eq(info["/tmp/flow/bytes.bin"].mode, 600, "mode of bytes.bin")
    execution = await box.commands.run("cat /tmp/flow/hello.txt; wc -c < /tmp/flow/bytes.bin")
    check_eq([m.text.strip() for m in execution.logs.stdout], ["hello file", str(len(every_byte))],
             "the files seen by a command")


@case
async def execd_envs_file(state: State):
    # The bootstrap names the file in EXECD_ENVS; a command writes a line, the next sees it, and a
    # request's envs win over the file's.
    commands = state.box().commands
    execution = await commands.run('echo "FROM_FILE=file" >> "$EXECD_ENVS"; echo "$EXECD_ENVS"')
    check_eq([m.text for m in execution.logs.stdout], ["/opt/opensandbox/.env"], "EXECD_ENVS")
    execution = await commands.run('echo "$FROM_FILE"')
    check_eq([m.text for m in execution.logs.stdout], ["file"], "a variable from the file")
    execution = await commands.run('echo "$FROM_FILE"',
                                   opts=RunCommandOpts(envs={"FROM_FILE": "request"}))
    check_eq([m.text for m in execution.logs.stdout], ["request"], "the request's envs over the file's")


@case
async def kill(state: State):
    box = state.box()
    await box.kill()
    state.killed = True
    try:
        await box.get_info()
        check(False, "get_info after kill did not fail")
    except SandboxApiException as e:
        check_eq(e.status_code, 404, "get_info after kill")
    try:
        await box.kill()
        check(False, "a second kill did not fail")
    except SandboxApiException as e:
        check_eq(e.status_code, 404, "second kill")
    await box.close()


async def listed_by_server() -> list[str]:
    """The sandboxes the server still lists, in any state."""
    manager = await SandboxManager.create(ConnectionConfig(request_timeout=timedelta(seconds=60)))
    try:
        listed = await manager.list_sandbox_infos(SandboxFilter(page_size=100))
        return [f"the server still lists {i.id} ({i.status.state})" for i in listed.sandbox_infos]
    finally:
        await manager.close()


def leftovers() -> list[str]:
    """What is left: sandboxes the server lists and containers on the run's network."""
    problems = asyncio.run(listed_by_server())
    network = os.environ.get("SBX_REALSERVER_NETWORK")
    if network:
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"network={network}"],
                              capture_output=True, text=True, check=True).stdout.split()
        problems += [f"container {c} left on {network}" for c in left]
    return problems


def main() -> int:
    which = sys.argv[1] if len(sys.argv) > 1 else "both"
    modes = {"direct": ["direct"], "proxy": ["proxy"], "both": ["direct", "proxy"]}.get(which)
    if modes is None:
        print(f"usage: python_sdk_flow.py [direct|proxy|both], not {which}", file=sys.stderr)
        return 2
    rc = 0
    for mode in modes:
        print(f"=== the Python SDK, {mode} mode", flush=True)
        rc |= run(State(mode))
    start = time.monotonic()
    problems = leftovers()
    took = time.monotonic() - start
    for p in problems:
        print(f"  {p}")
    print(f"{'PASS' if not problems else 'FAIL'} nothing left on the server ({took:.1f} s)",
          flush=True)
    return 1 if rc or problems else 0


if __name__ == "__main__":
    sys.exit(main())

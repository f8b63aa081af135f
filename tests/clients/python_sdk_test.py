"""The official Python SDK (PyPI opensandbox, pinned in requirements.txt) against `sbx serve`.

Run by harness/with_serve.py, which starts the server and sets OPEN_SANDBOX_DOMAIN,
OPEN_SANDBOX_API_KEY (when the server has a key), SBX_CLIENTS_USE_SERVER_PROXY and
SBX_CLIENTS_RECORD. Every HTTP exchange the SDK makes is recorded (harness/record.py) and
validated against the OpenAPI specs afterwards.

    python_sdk_test.py [--big]     (--big: also the 1 GiB file round trip)

Cases, in order, on one sandbox (busybox image sbx-busybox:latest, the SDK's default entrypoint
and resources): create (the SDK then resolves the execd and egress endpoints and polls
execd's /ping), a command's stdout and exit code, set_env, 300k lines, a failing command, a timeout, a background
command with status and logs, write and read a file (and a byte range of it), the 1 GiB round
trip, renew, pause/resume, kill.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "harness"))
import record  # noqa: E402

record.install()  # before the SDK creates its transports

from runner import case, check, check_eq, run  # noqa: E402

from opensandbox import Sandbox  # noqa: E402
from opensandbox.config import ConnectionConfig  # noqa: E402
from opensandbox.exceptions import SandboxApiException  # noqa: E402
from opensandbox.models.execd import RunCommandOpts  # noqa: E402

IMAGE = "sbx-busybox:latest"
GIB = 1 << 30


class State:
    def __init__(self):
        self.use_server_proxy = os.environ.get("SBX_CLIENTS_USE_SERVER_PROXY") == "1"
        self.work = Path(os.environ.get("SBX_CLIENTS_WORK", "/tmp"))
        self.sandbox: Sandbox | None = None
        self.killed = False

    def config(self) -> ConnectionConfig:
        # Domain and API key come from OPEN_SANDBOX_DOMAIN / OPEN_SANDBOX_API_KEY, as a user's
        # would; only the proxy mode and a longer request timeout (a busy CI machine) are set.
        return ConnectionConfig(use_server_proxy=self.use_server_proxy,
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
        timeout=timedelta(minutes=20),
        metadata={"suite": "clients", "client": "python"},
        connection_config=state.config(),
        ready_timeout=timedelta(seconds=60),
    )
    state.sandbox = sandbox
    check(sandbox.id, "no sandbox id")
    info = await sandbox.get_info()
    check_eq(info.status.state, "Running", "state after create")
    check_eq(info.metadata, {"suite": "clients", "client": "python"}, "metadata")
    check_eq(info.entrypoint, ["tail", "-f", "/dev/null"], "entrypoint")
    check(info.expires_at is not None, "no expiresAt with a timeout")
    endpoint = await sandbox.get_endpoint(44772)
    expected = f"{os.environ['OPEN_SANDBOX_DOMAIN']}"
    if state.use_server_proxy:
        expected += f"/v1/sandboxes/{sandbox.id}/proxy/44772"
    else:
        expected += f"/sandboxes/{sandbox.id}/proxy/44772"
    check_eq(endpoint.endpoint, expected, "execd endpoint")
    if os.environ.get("OPEN_SANDBOX_API_KEY"):
        # With a key, the execd paths need the token the endpoint hands out, in both modes (the
        # SDK sends the Endpoint's headers on every execd call, and never the key); the commands
        # below prove it works.
        names = {k.lower() for k in endpoint.headers}
        check("x-execd-access-token" in names, f"no X-EXECD-ACCESS-TOKEN in {endpoint.headers}")
    check(await sandbox.is_healthy(), "ping failed")


@case
async def command_stdout_and_exit_code(state: State):
    execution = await state.box().commands.run("echo hello; echo world")
    check_eq([m.text for m in execution.logs.stdout], ["hello", "world"], "stdout lines")
    check_eq(execution.logs.stderr, [], "stderr")
    check_eq(execution.exit_code, 0, "exit code")
    check(execution.error is None, f"unexpected error {execution.error}")
    check(execution.complete is not None, "no execution_complete")
    check(execution.id, "no command id from init")


@case
async def set_env(state: State):
    # Issue 35: EXECD_ENVS was unset in the sandboxes sbx serve made, so set_env always failed. It
    # names execd's env file there as on the real server; every later command loads the file, and a
    # command's own envs win over it.
    box = state.box()
    await box.commands.set_env("SBX_QUOTED", 'it\'s "quoted"')  # the double-quoted form
    await box.commands.set_env("SBX_LITERAL", "a $b  c")  # the single-quoted, literal form
    await box.commands.set_env("SBX_PLAIN", "first")
    await box.commands.set_env("SBX_PLAIN", "last wins")
    execution = await box.commands.run('printf "%s|%s|%s" "$SBX_QUOTED" "$SBX_LITERAL" "$SBX_PLAIN"')
    check_eq([m.text for m in execution.logs.stdout], ['it\'s "quoted"|a $b  c|last wins'],
             "the file's values")
    execution = await box.commands.run('printf "%s" "$SBX_PLAIN"',
                                       opts=RunCommandOpts(envs={"SBX_PLAIN": "the request's"}))
    check_eq([m.text for m in execution.logs.stdout], ["the request's"], "a command's envs win")


@case
async def three_hundred_thousand_lines(state: State):
    # Issue 35: this much output was cut (connection reset) once the SDK, parsing about 10k events a
    # second, let more than 4 MiB wait at the server. The output is held at the provider now
    # (docs/flow-control.md): every line arrives, in order, with default settings.
    execution = await state.box().commands.run("seq 1 300000")
    lines = [m.text for m in execution.logs.stdout]
    check_eq(len(lines), 300000, "number of stdout lines")
    check(lines == [str(i) for i in range(1, 300001)], "the lines of seq 1 300000, in order")
    check_eq(execution.exit_code, 0, "exit code")
    check(execution.error is None, f"unexpected error {execution.error}")


@case
async def failing_command(state: State):
    execution = await state.box().commands.run("echo out; echo oops >&2; exit 3")
    check_eq([m.text for m in execution.logs.stdout], ["out"], "stdout")
    check_eq([m.text for m in execution.logs.stderr], ["oops"], "stderr")
    check_eq(execution.exit_code, 3, "exit code")
    check(execution.error is not None, "no error event")
    check_eq(execution.error.name, "CommandExecError", "error name")
    check_eq(execution.error.value, "3", "error value")
    check(execution.complete is None, "execution_complete after an error")


@case
async def command_timeout(state: State):
    start = time.monotonic()
    execution = await state.box().commands.run(
        "echo start; sleep 60; echo never", opts=RunCommandOpts(timeout=timedelta(seconds=2)))
    elapsed = time.monotonic() - start
    check_eq([m.text for m in execution.logs.stdout], ["start"], "stdout")
    check(execution.error is not None, "no error event after the timeout")
    check_eq(execution.error.value, "-1", "error value of a timeout kill")
    check_eq(execution.exit_code, -1, "exit code")
    # Not a performance bound: the command sleeps 60 s, so ending well before proves the kill.
    check(elapsed < 45, f"the command was not killed at its timeout ({elapsed:.1f} s)")


@case
async def background_command(state: State):
    commands = state.box().commands
    execution = await commands.run("echo bg; sleep 1; echo done",
                                   opts=RunCommandOpts(background=True))
    check(execution.id, "no id for a background command")
    check(execution.exit_code is None, "a background command has no exit code at once")
    deadline = time.monotonic() + 60
    status = await commands.get_command_status(execution.id)
    while status.running and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        status = await commands.get_command_status(execution.id)
    check_eq(status.running, False, "still running after 60 s")
    check_eq(status.exit_code, 0, "background exit code")
    check_eq(status.id, execution.id, "status id")
    logs = await commands.get_background_command_logs(execution.id, cursor=0)
    check_eq(logs.content, "bg\ndone\n", "logs")
    check_eq(logs.cursor, len("bg\ndone\n"), "tail cursor")
    more = await commands.get_background_command_logs(execution.id, cursor=logs.cursor)
    check_eq(more.content, "", "logs after the cursor")


@case
async def write_and_read_file(state: State):
    files = state.box().files
    await files.write_file("/tmp/clients/hello.txt", "hello file\n", mode=644)
    check_eq(await files.read_file("/tmp/clients/hello.txt"), "hello file\n", "read back")
    check_eq(await files.read_bytes("/tmp/clients/hello.txt", range_header="bytes=6-"),
             b"file\n", "range read")
    info = await files.get_file_info(["/tmp/clients/hello.txt"])
    entry = info["/tmp/clients/hello.txt"]
    check_eq(entry.size, 11, "size")
    execution = await state.box().commands.run("cat /tmp/clients/hello.txt")
    check_eq([m.text for m in execution.logs.stdout], ["hello file"], "cat in the sandbox")


def _big_file(path: Path) -> str:
    """1 GiB of distinct 1 MiB blocks (no two alike, so a misplaced block is seen); its sha256."""
    seed = hashlib.sha256(b"sbx clients 1 GiB").digest() * (1 << 15)  # 1 MiB
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(GIB >> 20):
            block = i.to_bytes(8, "big") + seed[8:]
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


@case
async def one_gib_round_trip(state: State):
    if "--big" not in sys.argv:
        print("  (the 1 GiB round trip runs in the --big configurations)")
        return
    box = state.box()
    local = state.work / "big.bin"
    want = _big_file(local)
    try:
        with open(local, "rb") as f:
            await box.files.write_file("/tmp/big.bin", f, mode=644)
        execution = await box.commands.run("sha256sum /tmp/big.bin; stat -c %s /tmp/big.bin")
        out = [m.text for m in execution.logs.stdout]
        check_eq(execution.exit_code, 0, f"sha256sum in the sandbox ({execution.error})")
        check_eq(out, [f"{want}  /tmp/big.bin", str(GIB)], "hash and size in the sandbox")
        digest = hashlib.sha256()
        size = 0
        async for chunk in await box.files.read_bytes_stream("/tmp/big.bin"):
            digest.update(chunk)
            size += len(chunk)
        check_eq(size, GIB, "downloaded size")
        check_eq(digest.hexdigest(), want, "downloaded sha256")
        await box.commands.run("rm -f /tmp/big.bin")
    finally:
        local.unlink(missing_ok=True)


@case
async def renew(state: State):
    box = state.box()
    before = datetime.now(timezone.utc)
    try:
        response = await box.renew(timedelta(minutes=45))
    except SandboxApiException as e:
        # The issue asks for renew through the SDK on local_docker; the server answers 501 when
        # the provider lacks sbx.renew/1, which is a failure here, said plainly.
        raise AssertionError(f"renew refused ({e.status_code}): {e} (does the provider offer "
                             "sbx.renew/1?)") from e
    want = before + timedelta(minutes=45)
    check(abs((response.expires_at - want).total_seconds()) < 120,
          f"renewed to {response.expires_at}, asked {want}")
    info = await box.get_info()
    check(abs((info.expires_at - response.expires_at).total_seconds()) < 1,
          f"get_info says {info.expires_at}, renew said {response.expires_at}")


@case
async def pause_and_resume(state: State):
    box = state.box()
    await box.pause()
    check_eq((await box.get_info()).status.state, "Paused", "state after pause")
    resumed = await Sandbox.resume(box.id, connection_config=state.config(),
                                   resume_timeout=timedelta(seconds=60))
    try:
        check_eq((await resumed.get_info()).status.state, "Running", "state after resume")
        execution = await resumed.commands.run("echo after-resume")
        check_eq([m.text for m in execution.logs.stdout], ["after-resume"], "stdout")
        check_eq(await resumed.files.read_file("/tmp/clients/hello.txt"), "hello file\n",
                 "a file written before the pause")
    finally:
        await resumed.close()


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


if __name__ == "__main__":
    sys.exit(run(State()))

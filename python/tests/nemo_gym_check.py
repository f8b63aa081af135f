"""NeMo Gym 0.7.0, unchanged, on the package's provider (ctest python_nemo_gym_test).

Runs under NeMo Gym's venv (tests/clients/nemo_gym_venv.sh) with PYTHONPATH at the build's
package, whose dist-info publishes the entry point `sbx` of `nemo_gym.sandbox_providers`, as an
installed wheel does. Settings come from the environment (NeMo Gym parses sys.argv with Hydra):
SBX_PLUGIN_DIR (the build's plugins), SBX_NEMO_IMAGE (default sbx-busybox:latest).

Checks, each printed as "ok NAME" or "FAIL NAME: why" (exit 1 on any failure): NeMo Gym's
registry finds the provider by its entry point and its capability protocols see it; through
AsyncSandbox: create with spec fields, exec with cwd, env, timeout and user, a non-zero exit, a
timeout, a 1 MiB output, upload and download of a binary file, status, pause and resume, a
descriptor serialised here and connected in another process, stop twice, exec after stop (NeMo
Gym's own error); the endpoint of a declared port reaching a server in the sandbox;
preserve_background_services; terminals (the size asked for, typed input, attach with takeover
and replay, the first holder failing, the exit code, pipe mode with env); the sync Sandbox
wrapper; NeMo Gym's create error for a daemon not there.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from nemo_gym.sandbox.api import AsyncSandbox, Sandbox
from nemo_gym.sandbox.providers import base
from nemo_gym.sandbox.providers.registry import create_provider

import sbx.nemo_gym

failures: list[str] = []
PLUGIN_DIR = os.environ["SBX_PLUGIN_DIR"]
IMAGE = os.environ.get("SBX_NEMO_IMAGE", "sbx-busybox:latest")
CONFIG = {"sbx": {"provider": "local_docker", "plugin_dirs": [PLUGIN_DIR],
                  "labels": {"sbx.python-test": "nemo_gym_check"}}}


def check(name: str, ok: bool, why: object = "") -> None:
    if ok:
        print(f"ok {name}", flush=True)
    else:
        print(f"FAIL {name}: {why}", flush=True)
        failures.append(name)


async def main() -> None:
    provider = create_provider(CONFIG)
    check("the registry finds the entry point", isinstance(provider, sbx.nemo_gym.SbxProvider),
          type(provider))
    check("capabilities", isinstance(provider, base.SupportsSandboxPauseResume)
          and isinstance(provider, base.ConnectableProvider)
          and isinstance(provider, base.SupportsSandboxEndpoint)
          and isinstance(provider, base.SupportsSandboxPty)
          and isinstance(provider, base.SupportsSandboxPtyAttach)
          and isinstance(provider, base.SupportsSandboxBackgroundServices))

    spec = base.SandboxSpec(image=IMAGE, ttl_s=600, workdir="/work", env={"FROM_SPEC": "yes"},
                            files={"/work/hello.txt": "hi\n"}, metadata={"case": "nemo"},
                            resources={"cpu": 1, "memory_mib": 256})
    box = await AsyncSandbox(provider, spec, owns_provider=False).start()
    r = await box.exec("cat hello.txt; echo $FROM_SPEC-$X; pwd", env={"X": "y"})
    check("create with spec fields, exec with env", r.stdout == "hi\nyes-y\n/work\n", r)
    r = await box.exec("pwd", cwd="/tmp")
    check("exec cwd", r.stdout == "/tmp\n", r)
    r = await box.exec("id -un", user="nobody")
    check("exec user", r.stdout == "nobody\n", r)
    r = await box.exec("echo out; echo err >&2; exit 7")
    check("a non-zero exit is a result",
          (r.stdout, r.stderr, r.return_code) == ("out\n", "err\n", 7), r)
    r = await box.exec("sleep 30", timeout_s=0.5)
    check("a timeout", (r.return_code, r.error_type) == (125, "timeout"), r)
    r = await box.exec("head -c 1048576 /dev/zero | tr '\\0' a")
    check("a 1 MiB output", r.stdout == "a" * (1 << 20), len(r.stdout or ""))
    with tempfile.TemporaryDirectory() as tmp:
        data = os.urandom(300_000) + bytes(range(256))
        (Path(tmp) / "in.bin").write_bytes(data)
        await box.upload(Path(tmp) / "in.bin", "/work/blob.bin")
        await box.download("/work/blob.bin", Path(tmp) / "out.bin")
        check("upload and download of a binary file", (Path(tmp) / "out.bin").read_bytes() == data)
    check("status running", await box.status() == base.SandboxStatus.RUNNING)
    await box.pause()
    check("paused", await box.status() == base.SandboxStatus.PAUSED)
    await box.resume()
    check("resumed", (await box.exec("echo back")).stdout == "back\n")

    # preserve_background_services: a service one run starts outlives the run.
    r = await box.exec("(sleep 60 >/dev/null 2>&1 &); echo started", preserve_background_services=True)
    later = await box.exec("ps -o args | grep -c '^sleep 60$'")
    check("preserve_background_services", r.stdout == "started\n" and later.stdout == "1\n",
          (r, later))

    # Terminals: the size asked for, typed input, pipe mode, takeover with a replay, the exit code.
    term = await box.pty.create("stty size; cat", rows=30, cols=100)
    seen = b""
    while b"30 100" not in seen:
        seen += await term.read(timeout_s=30)
    check("pty: the size asked for", b"30 100" in seen)  # a timeout above raises
    await term.write(b"typed\n")
    while seen.count(b"typed") < 2:  # the echo and cat's copy
        seen += await term.read(timeout_s=30)
    check("pty: typed input", seen.count(b"typed") >= 2)
    other = await box.pty.attach(term.session_id, takeover=True, since=0)
    replay = b""
    while b"typed" not in replay:
        replay += await other.read(timeout_s=30)
    check("pty: attach takes over and replays", b"30 100" in replay)
    try:
        while await term.read(timeout_s=30):
            pass
        check("pty: the first holder fails", False, "it read on")
    except base.SandboxPtyError:
        check("pty: the first holder fails", True)
    await other.write(b"\x04")
    check("pty: the exit code", await other.wait_exit(timeout_s=30) == 0)
    await other.close()
    await term.close()
    try:  # issue 35: an attachment to nothing was handed out, failing only when read
        await box.pty.attach("no-such-terminal", since=0)
        check("pty: attaching to an unknown id raises", False, "an attachment came back")
    except base.SandboxPtyError:
        check("pty: attaching to an unknown id raises", True)
    pipe = await box.pty.create("echo out-$X; echo err >&2; exit 5", env={"X": "y"}, pty=False)
    out, err = b"", b""
    while chunk := await pipe.read(timeout_s=30):
        out += chunk
    while chunk := await pipe.read_stderr(timeout_s=30):
        err += chunk
    check("pty: pipe mode, env, stdout and stderr apart",
          (out, err, await pipe.wait_exit(timeout_s=30)) == (b"out-y\n", b"err\n", 5), (out, err))
    await pipe.close()

    descriptor = await box.serialize()
    other = subprocess.run(
        [sys.executable, "-c", CONNECT_SCRIPT], input=json.dumps(descriptor), text=True,
        capture_output=True, timeout=120, env=os.environ)
    check("serialize here, connect in another process", other.returncode == 0
          and other.stdout == "hi\n", other.stdout + other.stderr)
    check("still running after the other process", await box.status() == base.SandboxStatus.RUNNING)

    await box.stop()
    await box.stop()
    check("stopped", await box.status() == base.SandboxStatus.STOPPED)
    try:
        await box.exec("true")
        check("exec after stop", False, "no error")
    except RuntimeError as e:
        check("exec after stop", "not been started" in str(e), e)

    bridge = create_provider({"sbx": {"provider": "local_docker", "plugin_dirs": [PLUGIN_DIR],
                                      "config": {"create": {"network": "bridge"}},
                                      "labels": {"sbx.python-test": "nemo_gym_check"}}})
    served = await AsyncSandbox(bridge, base.SandboxSpec(
        image=IMAGE, ttl_s=600, ports=(8000,), files={"/www/index.html": "served\n"})).start()
    try:
        await served.exec("httpd -p 8000 -h /www")
        endpoint = await served.endpoint(8000)
        body = ""
        for _ in range(50):  # httpd binds after it was started
            try:
                body = await asyncio.to_thread(lambda: urllib.request.urlopen(
                    endpoint.endpoint + "/index.html", timeout=5).read().decode())
                break
            except OSError:
                await asyncio.sleep(0.1)
        check("the endpoint reaches a server in the sandbox",
              isinstance(endpoint, base.SandboxEndpoint) and body == "served\n", (endpoint, body))
    finally:
        await served.stop()

    def sync_wrapper() -> str:
        with Sandbox(CONFIG, base.SandboxSpec(image=IMAGE, ttl_s=600)).start() as s:
            return s.exec("echo sync").stdout

    check("the sync Sandbox wrapper", await asyncio.to_thread(sync_wrapper) == "sync\n")

    gone = create_provider({"sbx": {"provider": "local_docker", "plugin_dirs": [PLUGIN_DIR],
                                    "config": {"socket": "/nonexistent/docker.sock"}}})
    try:
        await AsyncSandbox(gone, base.SandboxSpec(image=IMAGE)).start()
        check("NeMo Gym's create error", False, "no error")
    except base.SandboxCreateError as e:
        check("NeMo Gym's create error", "/nonexistent/docker.sock" in str(e), e)
    await provider.aclose()


CONNECT_SCRIPT = """
import asyncio, json, os, sys
from nemo_gym.sandbox.api import AsyncSandbox
from nemo_gym.sandbox.providers.registry import create_provider
async def main():
    provider = create_provider({"sbx": {"provider": "local_docker",
                                        "plugin_dirs": [os.environ["SBX_PLUGIN_DIR"]]}})
    box = await AsyncSandbox.connect(json.loads(sys.stdin.read()), provider=provider)
    print((await box.exec("cat hello.txt")).stdout, end="")
    await provider.aclose()  # without stop(): the sandbox stays the first process's
asyncio.run(main())
"""

if __name__ == "__main__":
    asyncio.run(main())
    print("all passed" if not failures else f"{len(failures)} failed: {', '.join(failures)}")
    sys.exit(1 if failures else 0)

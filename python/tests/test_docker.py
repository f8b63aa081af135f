"""The package's API over local_docker on the real Docker daemon (image sbx-busybox:latest):
spec fields, users, renew, pause and resume, a handle serialised in one process and connected in
another, closing twice, an endpoint reaching a server in the sandbox, and a daemon that is not
there."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import sbx
from conftest import IMAGE, PLUGIN_DIR, docker_sandboxes


def run(coro):
    return asyncio.run(coro)


def test_create_with_spec_fields_exec_as_a_user(docker: sbx.Provider) -> None:
    async def main() -> None:
        box = await docker.create(
            sbx.SandboxSpec(
                image=IMAGE,
                ttl_s=600,
                workdir="/work",
                env={"GREETING": "hi"},
                files={"/work/note.txt": "from the spec\n"},
                metadata={"case": "spec-fields"},
                resources={"cpu": 1, "memory_mib": 256},
            )
        )
        try:
            r = await docker.exec(box, "pwd; echo $GREETING; cat note.txt")
            assert r == sbx.SandboxExecResult("/work\nhi\nfrom the spec\n", "", 0, None)
            assert (await docker.exec(box, "id -un", user="nobody")).stdout == "nobody\n"
            assert (await docker.exec(box, "id -u", user=65534)).stdout == "65534\n"
            r = await docker.exec(box, "sleep 30", timeout_s=0.5)
            assert r.error_type == "timeout"
            assert docker.supports(box, "sbx.pause/1")
            # renew moves the expiry the spec's ttl_s set, both ways, and says where it is now
            before = time.time()
            expires_at = await docker.renew(box, 1200)
            assert before + 1200 - 1 <= expires_at <= time.time() + 1200 + 1
            expires_at = docker.blocking.renew(box, 300)
            assert before + 300 - 1 <= expires_at <= time.time() + 300 + 1
            assert await docker.status(box) is sbx.SandboxStatus.RUNNING
        finally:
            await docker.close(box)
        await docker.close(box)
        with pytest.raises(sbx.FailedPreconditionError):
            await docker.exec(box, "true")

    run(main())


def test_pause_resume_and_a_handle_connected_in_another_process(docker: sbx.Provider) -> None:
    async def main() -> None:
        box = await docker.create(sbx.SandboxSpec(image=IMAGE, ttl_s=600))
        try:
            await docker.pause(box)
            assert await docker.status(box) is sbx.SandboxStatus.PAUSED
            with pytest.raises(sbx.FailedPreconditionError, match="paused"):
                await docker.exec(box, "true")
            await docker.resume(box)
            await docker.upload_bytes(box, b"kept\n", "/tmp/note")
            descriptor = await docker.serialize_handle(box)
            script = (
                "import asyncio, sbx, sys\n"
                "async def main():\n"
                "    host = sbx.Host({'providers': {'docker': {'plugin': 'local_docker'}}},\n"
                f"                    plugin_dirs=[{PLUGIN_DIR!r}])\n"
                "    p = host.provider('docker')\n"
                "    box = await p.connect(sys.stdin.read())\n"
                "    print((await p.exec(box, 'cat /tmp/note')).stdout, end='')\n"
                # dropped without close: a connected handle leaves its sandbox running
                "asyncio.run(main())\n"
            )
            out = await asyncio.to_thread(
                subprocess.run,
                [os.sys.executable, "-c", script],
                input=descriptor,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert out.returncode == 0, out.stderr
            assert out.stdout == "kept\n"
            assert await docker.status(box) is sbx.SandboxStatus.RUNNING
        finally:
            await docker.close(box)

    run(main())


def test_a_daemon_that_is_not_there(tmp_path: Path) -> None:
    socket = tmp_path / "no-docker.sock"
    host = sbx.Host(
        {"providers": {"docker": {"plugin": "local_docker", "config": {"socket": str(socket)}}}},
        plugin_dirs=[PLUGIN_DIR],
        use_default_plugin_dirs=False,
    )
    docker = host.provider("docker")
    with pytest.raises(sbx.SandboxCreateError) as caught:
        docker.blocking.create(sbx.SandboxSpec(image=IMAGE))
    assert str(socket) in str(caught.value)
    assert caught.value.status == "UNAVAILABLE"


def test_the_endpoint_reaches_a_server_in_the_sandbox() -> None:
    """A declared port, published on 127.0.0.1 (network bridge): the endpoint's URL reaches the
    sandbox's httpd; an undeclared port is refused."""
    label = "test_the_endpoint"
    host = sbx.Host(
        {"providers": {"bridge": {"plugin": "local_docker",
                                  "config": {"create": {"network": "bridge"}}}}},
        plugin_dirs=[PLUGIN_DIR],
        use_default_plugin_dirs=False,
        labels={"sbx.python-test": label},
    )
    bridge = host.provider("bridge")

    async def main() -> None:
        box = await bridge.create(sbx.SandboxSpec(
            image=IMAGE, ttl_s=600, ports=[8000], files={"/www/index.html": "hello\n"}))
        try:
            assert (await bridge.exec(box, "httpd -p 8000 -h /www")).return_code == 0
            endpoint = await bridge.endpoint(box, 8000)
            assert endpoint.endpoint.startswith("http://127.0.0.1:"), endpoint
            body = ""
            for _ in range(50):  # httpd binds after it was started
                try:
                    body = await asyncio.to_thread(
                        lambda: urllib.request.urlopen(endpoint.endpoint + "/index.html",
                                                       timeout=5).read().decode())
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            assert body == "hello\n"
            with pytest.raises(sbx.InvalidArgumentError):
                await bridge.endpoint(box, 7000)
        finally:
            await bridge.close(box)

    run(main())
    del bridge, host
    assert docker_sandboxes("sbx.python-test=" + label) == []

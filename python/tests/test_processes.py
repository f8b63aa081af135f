"""The package's API over the test_processes plugin (sandboxes are host processes in directories
under the test's own root): results, errors, streaming, cancellation, concurrency, files, the
blocking forms, and bad input that must give an exception rather than a crash."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import subprocess
import threading
from pathlib import Path

import pytest

import sbx
from conftest import BAD_PLUGIN_DIR, TEST_PLUGIN_DIR, native_threads, open_fds, settled


def run(coro):  # one event loop per test
    return asyncio.run(coro)


def test_exec_results_cwd_env_timeout(processes: sbx.Provider) -> None:
    async def main() -> None:
        box = await processes.create(sbx.SandboxSpec(env={"FROM_SPEC": "spec"}))
        try:
            r = await processes.exec(box, "echo out-$FROM_SPEC-$X; echo err >&2; exit 3", env={"X": "y"})
            assert r == sbx.SandboxExecResult("out-spec-y\n", "err\n", 3, None)
            await processes.exec(box, "mkdir -p sub")
            r = await processes.exec(box, "pwd", cwd="sub")
            assert r.return_code == 0 and r.stdout.rstrip().endswith("/sub")
            r = await processes.exec(box, "echo before; sleep 30", timeout_s=0.5)
            assert (r.return_code, r.error_type) == (125, "timeout")
            assert r.stdout == "before\n"
            assert await processes.status(box) is sbx.SandboxStatus.RUNNING
        finally:
            await processes.close(box)
        assert await processes.status(box) is sbx.SandboxStatus.STOPPED
        await processes.close(box)  # twice: nothing happens
        with pytest.raises(sbx.FailedPreconditionError, match="closed"):
            await processes.exec(box, "true")

    run(main())


def test_output_streams_while_the_command_runs(processes: sbx.Provider) -> None:
    async def main() -> None:
        box = await processes.create()
        try:
            stream = processes.exec_stream(
                box, "echo first; while [ ! -e go ]; do sleep 0.02; done; echo second >&2"
            )
            seen = []
            async for item in stream:
                seen.append(item)
                if item == ("stdout", b"first\n"):  # the command waits for us: it still runs
                    await processes.upload_bytes(box, b"", "go")
            assert seen == [("stdout", b"first\n"), ("stderr", b"second\n")]
            assert (await stream.result()).return_code == 0
        finally:
            await processes.close(box)

    run(main())


def test_cancelling_the_task_kills_the_command(processes: sbx.Provider, root: Path) -> None:
    marker = f"sleep 3{os.getpid() % 1000}.5"

    def running() -> bool:
        return subprocess.run(["pgrep", "-f", "^" + marker], capture_output=True).returncode == 0

    async def main() -> None:
        box = await processes.create()
        try:
            task = asyncio.ensure_future(processes.exec(box, marker))
            for _ in range(200):
                if running():
                    break
                await asyncio.sleep(0.02)
            assert running()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not running(), "the cancelled command still runs"
        finally:
            await processes.close(box)

    run(main())


def test_200_concurrent_commands_from_one_loop_without_a_thread_each(processes: sbx.Provider) -> None:
    async def main() -> None:
        box = await processes.create()
        try:
            before = threading.active_count()
            results = await asyncio.gather(
                *(processes.exec(box, f"echo {i}") for i in range(200))
            )
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(200)]
            assert threading.active_count() == before  # no Python thread per call
        finally:
            await processes.close(box)

    run(main())


def test_binary_file_round_trip(processes: sbx.Provider, tmp_path: Path) -> None:
    data = os.urandom(1 << 20) + bytes(range(256))
    source = tmp_path / "in.bin"
    source.write_bytes(data)
    target = tmp_path / "out" / "back.bin"

    async def main() -> None:
        box = await processes.create()
        try:
            await processes.upload_file(box, source, "dir/file.bin")
            r = await processes.exec(box, "sha256sum dir/file.bin")
            assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
            await processes.download_file(box, "dir/file.bin", target)
            assert target.read_bytes() == data
            with pytest.raises(sbx.NotFoundError):
                await processes.download_file(box, "no/such/file", tmp_path / "none")
            assert not (tmp_path / "none").exists()
        finally:
            await processes.close(box)

    run(main())


def test_blocking_forms(processes: sbx.Provider) -> None:
    box = processes.blocking.create()
    try:
        assert processes.blocking.exec(box, "echo $((6*7))").stdout == "42\n"
        assert processes.blocking.status(box) is sbx.SandboxStatus.RUNNING
        with pytest.raises(sbx.UnimplementedError, match="host's user"):
            processes.blocking.exec(box, "true", user="nobody-here")
    finally:
        processes.blocking.close(box)


def test_serialize_and_connect_in_another_process(processes: sbx.Provider, root: Path) -> None:
    box = processes.blocking.create()
    try:
        descriptor = processes.blocking.serialize_handle(box)
        script = (
            "import sbx, sys\n"
            f"host = sbx.Host({{'providers': {{'p': {{'plugin': 'test_processes', 'config': "
            f"{{'root': {str(root)!r}}}}}}}}}, plugin_dirs=[{TEST_PLUGIN_DIR!r}])\n"
            "p = host.provider('p')\n"
            "box = p.blocking.connect(sys.stdin.read())\n"
            "print(p.blocking.exec(box, 'cat note').stdout, end='')\n"
            "p.blocking.close(box)\n"
        )
        processes.blocking.upload_bytes(box, b"from the first process\n", "note")
        out = subprocess.run(
            [os.sys.executable, "-c", script],
            input=descriptor,
            capture_output=True,
            text=True,
            timeout=60,
            env=os.environ,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout == "from the first process\n"
        assert processes.blocking.status(box) is sbx.SandboxStatus.STOPPED  # closed over there
    finally:
        processes.blocking.close(box)


def test_bad_input_is_an_exception_not_a_crash(processes: sbx.Provider, tmp_path: Path) -> None:
    with pytest.raises(sbx.InvalidArgumentError):
        sbx.Host({"providers": {"p": {"plugin": "test_processes", "config": {"nope": 1}}}},
                 plugin_dirs=[TEST_PLUGIN_DIR], use_default_plugin_dirs=False).provider("p")
    with pytest.raises(sbx.InvalidArgumentError, match="cannot read the config file"):
        sbx.Host(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{ not json")
    with pytest.raises(sbx.InvalidArgumentError, match="bad.json"):
        sbx.Host(tmp_path / "bad.json")
    host = sbx.Host(plugin_dirs=[BAD_PLUGIN_DIR], use_default_plugin_dirs=False)
    # A plugin whose constructor crashes is read by the probe process, never loaded here.
    with pytest.raises(sbx.SandboxError) as caught:
        host.provider("crashes_on_load")
    assert "crashes_on_load" in str(caught.value)
    with pytest.raises(sbx.SandboxError, match="no-such-provider"):
        host.provider("no-such-provider")

    async def main() -> None:
        with pytest.raises(sbx.InvalidArgumentError):
            await processes.exec(sbx.SandboxHandle("x", "p", raw=None), "true")
        with pytest.raises(sbx.InvalidArgumentError):
            await processes.create(sbx.SandboxSpec(ttl_s=-1))

    run(main())


def test_bad_arguments_are_value_or_type_errors_naming_them(processes: sbx.Provider) -> None:
    """Numbers that cannot be durations, values of the wrong type and a spec that is no spec are
    ValueError or TypeError naming the argument, before anything reaches the host."""
    box = processes.blocking.create(sbx.SandboxSpec(ttl_s=600))
    try:
        for bad in (1e300, float("nan"), float("inf"), 0, -5):
            with pytest.raises(ValueError, match="ttl_s"):
                processes.blocking.renew(box, bad)
        with pytest.raises(TypeError, match="ttl_s"):
            processes.blocking.renew(box, "60")
        with pytest.raises(ValueError, match="timeout_s"):
            processes.blocking.exec(box, "true", timeout_s=float("nan"))
        with pytest.raises(TypeError, match="command"):
            processes.blocking.exec(box, 42)
        assert processes.blocking.renew(box, 300) > 0  # a good one still works
    finally:
        processes.blocking.close(box)
    for field in ("ttl_s", "ready_timeout_s"):
        with pytest.raises(ValueError, match=field):
            processes.blocking.create(sbx.SandboxSpec(**{field: float("nan")}))
    with pytest.raises(TypeError, match="spec"):
        processes.blocking.create(42)
    with pytest.raises(TypeError, match="spec.image"):
        processes.blocking.create(sbx.SandboxSpec(image=42))
    with pytest.raises(ValueError, match="image"):
        processes.blocking.create(sbx.SandboxSpec(image="x" * 10_000_000))


def test_hosts_leave_no_thread_or_descriptor(root: Path) -> None:
    """A host, its sandboxes and its commands leave nothing once dropped: hosts used one after
    another add no thread (but the host library's process-wide ones) and no file descriptor."""

    def use_a_host() -> None:
        host = sbx.Host(
            {"providers": {"p": {"plugin": "test_processes", "config": {"root": str(root)}}}},
            plugin_dirs=[TEST_PLUGIN_DIR],
            use_default_plugin_dirs=False,
        )
        p = host.provider("p")

        async def main() -> None:
            boxes = await asyncio.gather(*(p.create() for _ in range(4)))
            await asyncio.gather(*(p.exec(b, "echo hi") for b in boxes for _ in range(10)))
            stream = p.exec_stream(boxes[0], "echo streamed")
            assert [item async for item in stream] == [("stdout", b"streamed\n")]
            await asyncio.gather(*(p.close(b) for b in boxes))

        run(main())
        p.blocking.close(p.blocking.create())

    use_a_host()
    gc.collect()
    threads, fds = native_threads(), open_fds()
    for _ in range(3):
        use_a_host()
        gc.collect()
    assert settled(lambda: native_threads() == threads), "a host's threads outlived it"
    assert settled(lambda: open_fds() == fds), "descriptors were left open"
    assert list(root.iterdir()) == []

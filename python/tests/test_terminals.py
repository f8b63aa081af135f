"""Sessions (sbx.session/1) and terminals (sbx.pty/1) through the package, over test_processes
(host processes on host pseudo-terminals, in the test's own root) and over local_docker with its
agent: state carried across runs, a background job outliving its session, a TTY's echo and size,
pipe mode's streams and exit code, takeover and replay, close while reading."""

from __future__ import annotations

import asyncio
import gc

import pytest

import sbx
from conftest import IMAGE


def run(coro):
    return asyncio.run(coro)


async def read_until(attachment: sbx.Attachment, needle: bytes, timeout_s: float = 30) -> bytes:
    seen = b""

    async def more() -> None:
        nonlocal seen
        while needle not in seen:
            item = await attachment.next()
            if item is None:
                return
            seen += item[2]

    await asyncio.wait_for(more(), timeout_s)
    return seen


def test_a_session_keeps_its_state_and_its_background_jobs(processes: sbx.Provider) -> None:
    async def main() -> None:
        box = await processes.create()
        try:
            session = await processes.open_session(box)
            await processes.exec(box, "mkdir -p sub")
            r = await session.run("cd sub; export GREETING=hi; (sleep 30 >/dev/null 2>&1 &) ; true")
            assert r.return_code == 0
            r = await session.run("pwd; echo $GREETING")
            assert r.stdout.endswith("/sub\nhi\n"), r
            again = processes.session(box, session.id)  # the same session, by its id
            assert (await again.run("echo $GREETING")).stdout == "hi\n"
            assert (await session.run("exit 4")).return_code == 4
            await session.close()
            r = await processes.exec(box, "pgrep -f '^sleep 30$' >/dev/null && echo alive")
            assert r.stdout == "alive\n", "the background job did not outlive its session"
            await processes.exec(box, "pkill -f '^sleep 30$'; true")
        finally:
            await processes.close(box)

    run(main())


def test_a_terminal_echoes_and_follows_its_size(processes: sbx.Provider) -> None:
    async def main() -> None:
        box = await processes.create()
        try:
            terminal = await processes.open_pty(box, "stty size; cat", rows=30, cols=100)
            reading = terminal.attach(since=0)
            assert b"30 100" in await read_until(reading, b"30 100")
            await terminal.write(b"typed\n")
            assert (await read_until(reading, b"typed\r\ntyped")).count(b"typed") >= 2  # echo
            await terminal.resize(20, 90)
            await terminal.close()
            with pytest.raises(sbx.NotFoundError):
                await reading.exit_code()
        finally:
            await processes.close(box)

    run(main())


def test_pipe_mode_and_the_exit_code(processes: sbx.Provider) -> None:
    async def main() -> None:
        box = await processes.create()
        try:
            terminal = await processes.open_pty(
                box, "echo out-$X; echo err >&2; read line; echo got-$line; exit 3",
                env={"X": "y"}, tty=False)
            reading = terminal.attach(since=0)
            await terminal.write(b"in\n")
            seen = [(stream, data) async for stream, _, data in reading]
            assert b"".join(d for s, d in seen if s == "stdout") == b"out-y\ngot-in\n"
            assert b"".join(d for s, d in seen if s == "stderr") == b"err\n"
            assert await reading.exit_code() == 3
        finally:
            await processes.close(box)

    run(main())


def test_takeover_and_replay_on_local_docker(docker: sbx.Provider) -> None:
    async def main() -> None:
        box = await docker.create(sbx.SandboxSpec(image=IMAGE, ttl_s=600))
        try:
            terminal = await docker.open_pty(box, "echo first-line; cat")
            first = terminal.attach(since=0)
            await read_until(first, b"first-line")
            refused = terminal.attach(since=0, takeover=False)
            with pytest.raises(sbx.FailedPreconditionError):
                await refused.exit_code()
            second = docker.pty(box, terminal.id).attach(since=0)  # by id, taking it over
            assert b"first-line" in await read_until(second, b"first-line")  # the replay
            with pytest.raises(sbx.FailedPreconditionError) as taken:
                await first.exit_code()
            assert taken.value.reason == "taken_over"
            await terminal.write(b"\x04")  # end of input: cat exits
            assert await second.exit_code() == 0
        finally:
            await docker.close(box)

    run(main())


def test_an_ended_attachment_whose_outcome_nobody_asks_logs_nothing(
        processes: sbx.Provider, caplog: pytest.LogCaptureFixture) -> None:
    # Issue 35: a detached or closed attachment's error, never awaited, was logged by asyncio as
    # "Future exception was never retrieved" (three lines per NeMo Gym run): it is part of the
    # stream's end, there for whoever asks, and no failure of anyone's.
    async def main() -> None:
        box = await processes.create()
        try:
            terminal = await processes.open_pty(box, "cat")
            detached = terminal.attach(since=0)
            detached.detach()
            while await detached.next() is not None:
                pass
            closed = terminal.attach(since=0)
            await terminal.close()
            while await closed.next() is not None:
                pass
            del detached, closed
        finally:
            await processes.close(box)

    with caplog.at_level("ERROR", logger="asyncio"):
        run(main())
        gc.collect()
    assert "never retrieved" not in caplog.text, caplog.text


def test_attached_says_when_the_attachment_is_in_place_or_why_not(processes: sbx.Provider) -> None:
    # Issue 35: attaching to an unknown id gave an attachment that failed only when read; NeMo
    # Gym's own providers raise at attach (ABI 1.3's on_attached lets the package tell).
    async def main() -> None:
        box = await processes.create()
        try:
            unknown = processes.pty(box, "no-such-terminal").attach(since=0)
            with pytest.raises(sbx.NotFoundError):
                await unknown.attached()
            terminal = await processes.open_pty(box, "echo ready; cat")
            first = terminal.attach(since=0)
            await first.attached()
            assert b"ready" in await read_until(first, b"ready")
            refused = terminal.attach(since=0, takeover=False)
            with pytest.raises(sbx.FailedPreconditionError):
                await refused.attached()
            await terminal.close()
        finally:
            await processes.close(box)

    run(main())

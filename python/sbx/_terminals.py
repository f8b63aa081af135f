"""Persistent shells (sbx.session/1) and terminals (sbx.pty/1) from Python.

A :class:`Session` is a shell whose working directory, exported variables and background jobs
carry from one command to the next. A :class:`Terminal` is a command (or the user's shell) on a
TTY, or in pipe mode; its output is read through an :class:`Attachment`, at most one at a time
(another client may take the terminal over; the evicted attachment then fails with
``FailedPreconditionError`` whose ``reason`` is ``"taken_over"``), replaying from an offset.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ._calls import Streamed, await_op, exec_result
from ._types import SandboxExecResult

class Session:
    """A persistent shell in a sandbox (sbx.session/1). A run's ``cwd`` and ``env`` act as
    ``cd`` and ``export`` typed first, so they carry on; closing kills runs still going, never
    the background jobs they started."""

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def id(self) -> str:
        """The session's id (another client reaches it with ``Provider.session``)."""
        return str(self._native.id)

    async def run(
        self,
        command: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> SandboxExecResult:
        """Runs one command in the session; its exit code and output, as exec's."""
        timeout = None if timeout_s is None else float(timeout_s)
        return await await_op(
            self._native.run, command, cwd, dict(env or {}), timeout, None, convert=exec_result
        )

    async def close(self) -> None:
        """Ends the session: its runs still going are killed, its background jobs live on."""
        await await_op(self._native.close)


class Attachment:
    """A terminal's output as an async iterator of ``(stream, offset, bytes)``, ``stream`` being
    ``"stdout"`` or (pipe mode only) ``"stderr"``, and ``offset`` the first byte's place in the
    terminal's output; then ``await attachment.exit_code()``. :meth:`detach` stops reading (the
    process goes on). Unread output is kept in memory."""

    def __init__(self, native: Any, since: int | None, takeover: bool) -> None:
        loop = asyncio.get_running_loop()
        self._in_place: asyncio.Future[None] = loop.create_future()

        def in_place() -> None:  # a host thread, with the GIL
            try:
                loop.call_soon_threadsafe(
                    lambda: self._in_place.done() or self._in_place.set_result(None))
            except RuntimeError:  # the loop is closed
                pass

        self._call = Streamed(
            native.attach,
            since,
            takeover,
            in_place,
            make_item=lambda stream, offset, data: (
                "stderr" if stream == 2 else "stdout", offset, data),
        )

    async def attached(self) -> None:
        """Returns once the attachment is in place (the terminal exists and this attachment holds
        it); raises what ended it instead when it failed at once: NotFoundError for an unknown
        terminal, FailedPreconditionError for one held elsewhere without takeover."""
        outcome = asyncio.ensure_future(self._call.outcome(cancel_with_task=False))
        try:
            done, _ = await asyncio.wait({self._in_place, outcome},
                                         return_when=asyncio.FIRST_COMPLETED)
            if self._in_place in done:
                return
            await outcome  # ended first: its error, or an exit before being told (a 1.2 plugin)
        finally:
            outcome.cancel()

    def __aiter__(self) -> AsyncIterator[tuple[str, int, bytes]]:
        return self._call.items()

    async def next(self) -> tuple[str, int, bytes] | None:
        """The next output, or None once the attachment ended (then see :meth:`exit_code`)."""
        return await self._call.next()

    def detach(self) -> None:
        """Stops reading; the process goes on (a later attach reaches it)."""
        self._call.cancel()

    async def exit_code(self) -> int:
        """The process's exit code (128 + the signal for a killed one), once it exited. Raises
        when the attachment ended otherwise: taken over by another client
        (FailedPreconditionError, reason ``"taken_over"``), the terminal closed
        (NotFoundError), or a detach (CancelledError)."""
        return int(await self._call.outcome(cancel_with_task=False))


class Terminal:
    """A terminal in a sandbox (sbx.pty/1), running once opened; known by its id to every client
    of the sandbox where the provider keeps terminals in the sandbox (local_docker with its
    agent, opensandbox)."""

    def __init__(self, native: Any, tty: bool | None = None) -> None:
        self._native = native
        self.tty = tty  # None: not known (a terminal reached by id)

    @property
    def id(self) -> str:
        return str(self._native.id)

    def attach(self, *, since: int | None = 0, takeover: bool = True) -> Attachment:
        """Starts reading: from offset ``since`` of the output (0: all that is kept; None: only
        what comes next), taking the terminal over from another attachment unless ``takeover``
        is False (then a held terminal refuses at once). Call it from a running event loop."""
        return Attachment(self._native, since, takeover)

    async def write(self, data: bytes) -> None:
        """Sends bytes to the terminal's input, in the order the writes were made."""
        await await_op(self._native.write, bytes(data))

    async def resize(self, rows: int, cols: int) -> None:
        """A new window size (ignored in pipe mode)."""
        await await_op(self._native.resize, int(rows), int(cols))

    async def close(self) -> None:
        """Kills the process if it still runs and forgets the terminal; an attachment ends with
        NotFoundError."""
        await await_op(self._native.close)

"""How the package turns the module's calls (sbx._sbx: each takes done(value, error) and returns an
Op) into awaitables and blocking calls, and the host's errors into exceptions."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from . import _sbx
from ._errors import error_from
from ._types import SandboxExecResult

T = TypeVar("T")
# A native call: its arguments, then done(value, error); returns an _sbx.Op.
Start = Callable[..., Any]


def native_call(fn: Callable[..., T], *args: Any) -> T:
    """A synchronous native call, its HostError as the package's exception."""
    try:
        return fn(*args)
    except _sbx.HostError as e:
        raise error_from(e.args[0]) from None


async def await_op(start: Start, *args: Any, convert: Callable[[Any], T] = lambda v: v) -> T:
    """Starts a native call and awaits its outcome; a cancelled task cancels the operation and
    waits for its end before it sees the cancellation."""
    loop = asyncio.get_running_loop()
    result: asyncio.Future[Any] = loop.create_future()
    ended: asyncio.Future[None] = loop.create_future()  # the operation's end, even if cancelled

    def settle(value: Any, error: Any) -> None:
        ended.set_result(None)
        if result.done():
            return
        if error is not None:
            result.set_exception(error_from(error))
        else:
            result.set_result(value)

    def done(value: Any, error: Any) -> None:  # a host thread, with the GIL
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    op = native_call(start, *args, done)
    try:
        value = await result
    except asyncio.CancelledError:
        op.cancel()
        # The operation ends soon after (the host bounds it); its done() says when.
        await asyncio.shield(ended)
        raise
    return convert(value)


def blocking(start: Start, *args: Any, convert: Callable[[Any], T] = lambda v: v) -> T:
    """Starts a native call and waits for its outcome (the GIL released while it waits)."""
    ended = threading.Event()
    outcome: list[Any] = []

    def done(value: Any, error: Any) -> None:
        outcome[:] = [value, error]
        ended.set()

    op = native_call(start, *args, done)
    try:
        ended.wait()
    except BaseException:  # KeyboardInterrupt: stop the operation, then let it through
        op.cancel()
        ended.wait()
        raise
    value, error = outcome
    if error is not None:
        raise error_from(error)
    return convert(value)


class Streamed:
    """A native call that delivers items (output) on a host thread before its outcome: the items
    go to an asyncio queue (None after the last), the outcome to a future, both on the loop of
    the thread that made it. ``start(*args, on_item, done)`` is the native call; ``make_item``
    turns the native callback's arguments into the item."""

    def __init__(self, start: Start, *args: Any, make_item: Callable[..., Any]) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._outcome: asyncio.Future[Any] = self._loop.create_future()
        # The outcome is there for whoever asks (outcome()); the items' end already told the
        # reader. An error nobody asked for (a detach's, a closed terminal's) is no failure, and
        # asyncio would log it as "Future exception was never retrieved": mark it seen.
        self._outcome.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._ended: asyncio.Future[None] = self._loop.create_future()

        def on_item(*native: Any) -> None:  # a host thread, with the GIL
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, make_item(*native))
            except RuntimeError:  # the loop is closed
                pass

        def settle(value: Any, error: Any) -> None:
            self._ended.set_result(None)
            self._queue.put_nowait(None)
            if self._outcome.done():
                return
            if error is not None:
                self._outcome.set_exception(error_from(error))
            else:
                self._outcome.set_result(value)

        def done(value: Any, error: Any) -> None:
            try:
                self._loop.call_soon_threadsafe(settle, value, error)
            except RuntimeError:
                pass

        self._op = native_call(start, *args, on_item, done)

    async def next(self) -> Any:
        """The next item, or None once the call ended (every later call too)."""
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)
        return item

    async def items(self) -> AsyncIterator[Any]:
        while (item := await self.next()) is not None:
            yield item

    def cancel(self) -> None:
        self._op.cancel()

    async def outcome(self, *, cancel_with_task: bool) -> Any:
        """The call's value (or its error). With ``cancel_with_task``, a cancelled awaiting task
        cancels the call and waits for its end before it sees the cancellation."""
        try:
            return await asyncio.shield(self._outcome)
        except asyncio.CancelledError:
            if cancel_with_task:
                self._op.cancel()
                await asyncio.shield(self._ended)
            raise


def exec_result(value: dict[str, Any]) -> SandboxExecResult:
    return SandboxExecResult(
        stdout=value["stdout"].decode("utf-8", "replace"),
        stderr=value["stderr"].decode("utf-8", "replace"),
        return_code=value["return_code"],
        error_type=value["error_type"],
    )

"""Host and Provider: sbx's host API for Python, asynchronous first.

Every asynchronous call starts the host's operation at once and returns an awaitable completed
from the host's completion callback through the event loop's ``call_soon_threadsafe``: no Python
thread runs per call, and the GIL is not held while the host works. Cancelling the awaiting task
cancels the operation (a cancelled command is killed in the sandbox) and waits for its end before
the task sees ``asyncio.CancelledError``. ``Provider.blocking`` has the same calls for scripts.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import _sbx
from ._calls import await_op as _await
from ._calls import blocking as _blocking
from ._calls import exec_result as _result
from ._calls import native_call as _native_call
from ._calls import Streamed
from ._errors import InvalidArgumentError
from ._terminals import Session, Terminal
from ._types import (
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxSpec,
    SandboxStatus,
)

# What a wheel puts inside the package (python/CMakeLists.txt): the in-tree plugins and the probe.
_PACKAGE = Path(__file__).resolve().parent
_PACKAGED_PLUGINS = _PACKAGE / "plugins"
_PACKAGED_PROBE = _PACKAGE / "libexec" / "sbx-plugin-probe"


def _config_text(config: Mapping[str, Any] | str | os.PathLike[str] | None) -> tuple[str, str]:
    if config is None:
        return "{}", "config"
    if isinstance(config, Mapping):
        return json.dumps(config), "config"
    path = Path(config)
    try:
        return path.read_text(), str(path)
    except OSError as e:
        raise InvalidArgumentError(f"cannot read the config file {path}: {e.strerror}") from None


def _native(handle: SandboxHandle) -> Any:
    if not isinstance(handle, SandboxHandle) or not isinstance(handle.raw, _sbx.Sandbox):
        raise InvalidArgumentError("not a handle of an sbx provider: " + repr(handle))
    return handle.raw


def _handle(native: Any) -> SandboxHandle:
    return SandboxHandle(sandbox_id=native.id, provider_name=native.provider_name, raw=native)


def _spec_json(spec: SandboxSpec | Mapping[str, Any] | None) -> str:
    if spec is None:
        spec = SandboxSpec()
    elif isinstance(spec, Mapping):
        spec = SandboxSpec(**dict(spec))
    elif not isinstance(spec, SandboxSpec):
        raise TypeError(f"spec must be a SandboxSpec, a mapping or None, not {type(spec).__name__}")
    return json.dumps(spec.to_json(), allow_nan=False)


# The longest duration taken (2^31 - 1 s, about 68 years: the longest TTL a provider takes).
_MAX_SECONDS = 2147483647.0


def _seconds(name: str, value: Any, *, optional: bool = False) -> float | None:
    """A duration argument in seconds: a finite number > 0 and at most about 68 years (None when
    ``optional``); else a TypeError or ValueError naming the argument."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0 or seconds > _MAX_SECONDS:
        raise InvalidArgumentError(
            f"{name} must be a number of seconds > 0 and at most {_MAX_SECONDS:.0f}, got {value!r}"
        )
    return seconds


def _user(user: str | int | None) -> str | None:
    return None if user is None else str(user)


def _exec_args(
    handle: SandboxHandle,
    command: str,
    cwd: str | None,
    env: Mapping[str, str] | None,
    timeout_s: float | None,
    user: str | int | None,
) -> tuple[Any, ...]:
    """The native exec and its arguments before ``on_output`` and ``done``."""
    if not isinstance(command, str):
        raise TypeError(f"command must be a str, not {type(command).__name__}")
    timeout = _seconds("timeout_s", timeout_s, optional=True)
    return (_native(handle).exec, command, cwd, dict(env or {}), timeout, _user(user))


def _endpoint(pair: tuple[str, dict[str, str]]) -> SandboxEndpoint:
    return SandboxEndpoint(endpoint=pair[0], headers=dict(pair[1]))


class ExecStream:
    """A running command's output as an async iterator of ``(stream, bytes)``, ``stream`` being
    ``"stdout"`` or ``"stderr"``, in the order the provider delivered it; then
    ``await stream.result()``. Leaving it unread keeps the output in memory (no back-pressure);
    ``cancel()`` (or cancelling the task that awaits ``result()``) kills the command."""

    def __init__(self, exec_args: tuple[Any, ...]) -> None:
        self._call = Streamed(
            *exec_args,
            make_item=lambda stream, data: ("stderr" if stream == 2 else "stdout", data),
        )

    def __aiter__(self) -> AsyncIterator[tuple[str, bytes]]:
        return self._call.items()

    def cancel(self) -> None:
        """Asks the provider to stop the command (it is killed in the sandbox)."""
        self._call.cancel()

    async def result(self) -> SandboxExecResult:
        """The command's outcome (its output is what the iterator gave; here it is empty)."""
        return _result(await self._call.outcome(cancel_with_task=True))


class Provider:
    """A configured provider (NeMo Gym's ``SandboxProvider`` shape): every call takes the
    :class:`SandboxHandle` that :meth:`create` or :meth:`connect` returned."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.blocking = BlockingProvider(self)

    @property
    def name(self) -> str:
        """The provider's name in the config (or its plugin's id)."""
        return str(self._native.name)

    async def create(self, spec: SandboxSpec | Mapping[str, Any] | None = None) -> SandboxHandle:
        """Creates a sandbox ready to run commands; SandboxCreateError (or its verification
        subclass) when the provider could not."""
        return await _await(self._native.create, _spec_json(spec), convert=_handle)

    async def connect(self, descriptor: str) -> SandboxHandle:
        """The sandbox a :meth:`serialize_handle` descriptor names, from this or another
        process (sbx.connect/1)."""
        return await _await(self._native.connect, descriptor, convert=_handle)

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        """Runs a shell command; a non-zero exit, a timeout (125, "timeout") and a command the
        sandbox could not start (125, "sandbox") are results, not errors."""
        args = _exec_args(handle, command, cwd, env, timeout_s, user)
        return await _await(*args, None, convert=_result)

    def exec_stream(
        self,
        handle: SandboxHandle,
        command: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        user: str | int | None = None,
    ) -> ExecStream:
        """Starts a command whose output is read while it runs (see :class:`ExecStream`). Call
        it from a running event loop."""
        return ExecStream(_exec_args(handle, command, cwd, env, timeout_s, user))

    async def upload_file(
        self, handle: SandboxHandle, source_path: str | os.PathLike[str], target_path: str
    ) -> None:
        """Copies a local file in, with its permission bits."""
        await _await(_native(handle).upload, os.fspath(source_path), target_path)

    async def upload_bytes(self, handle: SandboxHandle, data: bytes, target_path: str) -> None:
        """Writes ``data`` to a sandbox file (mode 0644)."""
        await _await(_native(handle).upload_bytes, bytes(data), target_path)

    async def download_file(
        self, handle: SandboxHandle, source_path: str, target_path: str | os.PathLike[str]
    ) -> None:
        """Copies one sandbox file to a local path; it appears complete or not at all."""
        await _await(_native(handle).download, source_path, os.fspath(target_path))

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """The sandbox's state (STOPPED once closed)."""
        return await _await(_native(handle).status, convert=SandboxStatus)

    async def close(self, handle: SandboxHandle) -> None:
        """Ends the sandbox; closing twice does nothing."""
        await _await(_native(handle).close)

    async def pause(self, handle: SandboxHandle) -> None:
        """Freezes every process of the sandbox (sbx.pause/1)."""
        await _await(_native(handle).pause)

    async def resume(self, handle: SandboxHandle) -> None:
        """Thaws a paused sandbox (sbx.pause/1)."""
        await _await(_native(handle).resume)

    async def serialize_handle(self, handle: SandboxHandle) -> str:
        """A descriptor (JSON text, no secret) that :meth:`connect` turns back into a handle,
        in this process or another (sbx.connect/1)."""
        return await _await(_native(handle).serialize)

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """The route to a service on a port the spec declared."""
        return _endpoint(await _await(_native(handle).endpoint, int(port)))

    async def renew(self, handle: SandboxHandle, ttl_s: float) -> float:
        """Moves the sandbox's expiry to ``ttl_s`` from now; the expiry in force (Unix
        seconds)."""
        return float(await _await(_native(handle).renew, _seconds("ttl_s", ttl_s)))

    async def open_session(
        self,
        handle: SandboxHandle,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | int | None = None,
    ) -> Session:
        """A persistent shell (sbx.session/1): its cwd, exported variables and background jobs
        carry from one run to the next. UnimplementedError when the provider has none."""
        native = _native(handle)
        return await _await(
            native.open_session, cwd, dict(env or {}), _user(user), convert=Session
        )

    def session(self, handle: SandboxHandle, session_id: str) -> Session:
        """A session opened before (by this or another client), by its id."""
        return Session(_native_call(_native(handle).session, session_id))

    async def open_pty(
        self,
        handle: SandboxHandle,
        command: str | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | int | None = None,
        rows: int = 24,
        cols: int = 80,
        tty: bool = True,
    ) -> Terminal:
        """A terminal (sbx.pty/1) running ``command`` (by ``sh -c``; None: the user's shell) on
        a TTY of rows x cols, or in pipe mode (``tty=False``: stdout and stderr apart).
        UnimplementedError when the provider has none."""
        native = _native(handle)
        return await _await(
            native.open_pty, command, cwd, dict(env or {}), _user(user), int(rows), int(cols),
            bool(tty), convert=lambda pty: Terminal(pty, tty))

    def pty(self, handle: SandboxHandle, terminal_id: str) -> Terminal:
        """A terminal opened before (by this or another client), by its id."""
        return Terminal(_native_call(_native(handle).pty, terminal_id))

    def supports(self, handle: SandboxHandle, extension_id: str) -> bool:
        """Whether the sandbox's provider offers an extension (``"sbx.pause/1"``...)."""
        return bool(_native(handle).supports(extension_id))


class BlockingProvider:
    """:class:`Provider`'s calls as blocking functions (for scripts): each waits with the GIL
    released; Ctrl-C cancels the operation, waits for its end, then raises."""

    def __init__(self, provider: Provider) -> None:
        self._p = provider

    def create(self, spec: SandboxSpec | Mapping[str, Any] | None = None) -> SandboxHandle:
        """Creates a sandbox ready to run commands (see :meth:`Provider.create`)."""
        return _blocking(self._p._native.create, _spec_json(spec), convert=_handle)

    def connect(self, descriptor: str) -> SandboxHandle:
        """The sandbox a descriptor names (see :meth:`Provider.connect`)."""
        return _blocking(self._p._native.connect, descriptor, convert=_handle)

    def exec(
        self,
        handle: SandboxHandle,
        command: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        """Runs a shell command; a non-zero exit or a timeout is a result."""
        args = _exec_args(handle, command, cwd, env, timeout_s, user)
        return _blocking(*args, None, convert=_result)

    def upload_file(
        self, handle: SandboxHandle, source_path: str | os.PathLike[str], target_path: str
    ) -> None:
        """Copies a local file in, with its permission bits."""
        _blocking(_native(handle).upload, os.fspath(source_path), target_path)

    def upload_bytes(self, handle: SandboxHandle, data: bytes, target_path: str) -> None:
        """Writes ``data`` to a sandbox file (mode 0644)."""
        _blocking(_native(handle).upload_bytes, bytes(data), target_path)

    def download_file(
        self, handle: SandboxHandle, source_path: str, target_path: str | os.PathLike[str]
    ) -> None:
        """Copies one sandbox file to a local path; complete or not at all."""
        _blocking(_native(handle).download, source_path, os.fspath(target_path))

    def status(self, handle: SandboxHandle) -> SandboxStatus:
        """The sandbox's state (STOPPED once closed)."""
        return _blocking(_native(handle).status, convert=SandboxStatus)

    def close(self, handle: SandboxHandle) -> None:
        """Ends the sandbox; closing twice does nothing."""
        _blocking(_native(handle).close)

    def pause(self, handle: SandboxHandle) -> None:
        """Freezes every process of the sandbox (sbx.pause/1)."""
        _blocking(_native(handle).pause)

    def resume(self, handle: SandboxHandle) -> None:
        """Thaws a paused sandbox (sbx.pause/1)."""
        _blocking(_native(handle).resume)

    def serialize_handle(self, handle: SandboxHandle) -> str:
        """A descriptor that :meth:`connect` turns back into a handle."""
        return _blocking(_native(handle).serialize)

    def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """The route to a service on a port the spec declared."""
        return _endpoint(_blocking(_native(handle).endpoint, int(port)))

    def renew(self, handle: SandboxHandle, ttl_s: float) -> float:
        """Moves the sandbox's expiry to ``ttl_s`` from now; the expiry in force."""
        return float(_blocking(_native(handle).renew, _seconds("ttl_s", ttl_s)))


class Host:
    """The sbx host: its config (a dict, or a path to the same JSON ``sbx --config`` reads) and
    the directories its plugins are found in (before the defaults: the wheel's own plugins, then
    the host's, unless ``use_default_plugin_dirs`` is False). A plugin that fails to load, a bad config or an
    unknown provider raise the package's exceptions with the host's message."""

    def __init__(
        self,
        config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        plugin_dirs: Sequence[str | os.PathLike[str]] = (),
        use_default_plugin_dirs: bool = True,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        text, origin = _config_text(config)
        dirs = [os.fspath(d) for d in plugin_dirs]
        if use_default_plugin_dirs and _PACKAGED_PLUGINS.is_dir():
            dirs.append(os.fspath(_PACKAGED_PLUGINS))  # the wheel's, after the caller's
        probe = os.fspath(_PACKAGED_PROBE) if _PACKAGED_PROBE.exists() else ""
        self._native = _native_call(
            _sbx.Host, text, origin, dirs, use_default_plugin_dirs, dict(labels or {}), probe
        )

    def provider(self, name: str) -> Provider:
        """The provider block ``name`` of the config (or a plugin of that id), loaded and
        initialised on first use."""
        return Provider(_native_call(self._native.provider, name))

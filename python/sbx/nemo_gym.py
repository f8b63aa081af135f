"""sbx as a NeMo Gym sandbox provider (the entry point ``sbx`` of ``nemo_gym.sandbox_providers``).

NeMo Gym 0.7.0, unchanged, finds it by name::

    from nemo_gym.sandbox.providers.registry import create_provider
    provider = create_provider({"sbx": {"provider": "local_docker", "config": {"agent": True}}})

and its ``Sandbox`` / ``AsyncSandbox`` wrappers run on it. ``provider`` names a plugin (its
``config`` is that plugin's config), or, with ``host_config`` (a dict or the path of the JSON
``sbx --config`` reads), a provider block of that config. ``plugin_dirs`` are searched before the
defaults. It implements ``SandboxProvider``, pause/resume, ``ConnectableProvider`` (a handle
serialised in one process is connected in another), the endpoint capability, terminals
(``create_pty``, ``attach_pty``: sbx.pty/1) and ``exec_with_background_services`` (a run of an
sbx.session/1 session, whose background jobs outlive it), with NeMo Gym's own dataclasses, enum
and errors: this module imports ``nemo_gym``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.providers import base  # type: ignore[import-not-found]

from ._errors import FailedPreconditionError, NotFoundError, SandboxError
from ._host import Host, Provider
from ._terminals import Attachment, Terminal
from ._types import SandboxHandle as _Handle
from ._types import SandboxSpec as _Spec


class SbxProvider:
    """A NeMo Gym provider over one sbx provider (see the module's docstring)."""

    name = "sbx"

    def __init__(
        self,
        provider: str = "local_docker",
        config: Mapping[str, Any] | None = None,
        *,
        host_config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        plugin_dirs: Sequence[str | os.PathLike[str]] = (),
        labels: Mapping[str, str] | None = None,
    ) -> None:
        if host_config is None:
            block: dict[str, Any] = {"plugin": provider}
            if config:
                block["config"] = dict(config)
            host_config = {"providers": {provider: block}}
        elif config:
            raise TypeError("sbx provider: give either host_config or config, not both")
        self._host: Host | None = Host(host_config, plugin_dirs=plugin_dirs, labels=labels)
        self._provider: Provider | None = self._host.provider(provider)

    def _p(self) -> Provider:
        if self._provider is None:
            raise RuntimeError("the sbx provider was closed (aclose)")
        return self._provider

    @staticmethod
    def _ours(handle: base.SandboxHandle) -> _Handle:
        raw = getattr(handle, "raw", None)
        if not isinstance(raw, _Handle):
            raise TypeError("not a handle of the sbx provider: " + repr(handle))
        return raw

    def _theirs(self, handle: _Handle) -> base.SandboxHandle:
        return base.SandboxHandle(sandbox_id=handle.sandbox_id, provider_name=self.name, raw=handle)

    async def create(self, spec: base.SandboxSpec) -> base.SandboxHandle:
        resources = spec.resources
        ours = _Spec(
            image=spec.image,
            ttl_s=spec.ttl_s,
            ready_timeout_s=spec.ready_timeout_s,
            workdir=spec.workdir,
            env=dict(spec.env),
            files=dict(spec.files),
            metadata=dict(spec.metadata),
            resources={k: getattr(resources, k) for k in ("cpu", "memory_mib", "disk_gib", "gpu",
                                                          "gpu_type")},
            entrypoint=list(spec.entrypoint) if spec.entrypoint is not None else None,
            provider_options=dict(spec.provider_options),
            ports=tuple(getattr(spec, "ports", ()) or ()),
        )
        return self._theirs(await self._p().create(ours))

    async def exec(
        self,
        handle: base.SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        user: str | int | None = None,
    ) -> base.SandboxExecResult:
        r = await self._p().exec(
            self._ours(handle), command, cwd=cwd, env=env, timeout_s=timeout_s, user=user
        )
        return base.SandboxExecResult(r.stdout, r.stderr, r.return_code, r.error_type)

    async def upload_file(self, handle: base.SandboxHandle, source_path: Path, target_path: str) -> None:
        await self._p().upload_file(self._ours(handle), source_path, target_path)

    async def download_file(self, handle: base.SandboxHandle, source_path: str, target_path: Path) -> None:
        await self._p().download_file(self._ours(handle), source_path, target_path)

    async def status(self, handle: base.SandboxHandle) -> base.SandboxStatus:
        return base.SandboxStatus((await self._p().status(self._ours(handle))).value)

    async def close(self, handle: base.SandboxHandle) -> None:
        await self._p().close(self._ours(handle))

    async def pause(self, handle: base.SandboxHandle) -> None:
        await self._p().pause(self._ours(handle))

    async def resume(self, handle: base.SandboxHandle) -> None:
        await self._p().resume(self._ours(handle))

    async def endpoint(self, handle: base.SandboxHandle, port: int) -> base.SandboxEndpoint:
        e = await self._p().endpoint(self._ours(handle), port)
        return base.SandboxEndpoint(endpoint=e.endpoint, headers=dict(e.headers))

    async def serialize_handle(
        self, handle: base.SandboxHandle, *, scope: str | None = None
    ) -> dict[str, Any]:
        """The sandbox's sbx descriptor (no secret); ``scope`` is not used."""
        return {"sbx": json.loads(await self._p().serialize_handle(self._ours(handle)))}

    async def connect(self, descriptor: Mapping[str, Any]) -> base.SandboxHandle:
        if "sbx" not in descriptor:
            raise ValueError("not a descriptor of the sbx provider (no 'sbx' key)")
        return self._theirs(await self._p().connect(json.dumps(descriptor["sbx"])))

    async def aclose(self) -> None:
        """Drops the host; sandboxes not closed are closed with their handles."""
        self._provider = None
        self._host = None

    async def exec_with_background_services(
        self,
        handle: base.SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        timeout_s: float | None = None,
    ) -> base.SandboxExecResult:
        """The command as a run of a session of its own (sbx.session/1): what it starts in the
        background, its output redirected, outlives the run and the session."""
        p, ours = self._p(), self._ours(handle)
        session = await p.open_session(ours, cwd=cwd)
        try:
            r = await session.run(command, timeout_s=timeout_s)
        finally:
            await session.close()
        return base.SandboxExecResult(r.stdout, r.stderr, r.return_code, r.error_type)

    async def create_pty(self, handle: base.SandboxHandle, spec: base.SandboxPtySpec) -> "PtySession":
        p, ours = self._p(), self._ours(handle)
        terminal = await p.open_pty(ours, spec.command, cwd=spec.cwd, env=spec.env or {},
                                    user=spec.user, rows=spec.rows, cols=spec.cols, tty=spec.pty)
        return PtySession(p, ours, terminal, terminal.attach(since=0), owned=True,
                          mode="pty" if spec.pty else "pipe")

    async def attach_pty(
        self,
        handle: base.SandboxHandle,
        session_id: str,
        *,
        takeover: bool = True,
        since: int | None = None,
    ) -> "PtySession":
        p, ours = self._p(), self._ours(handle)
        terminal = p.pty(ours, session_id)
        attachment = terminal.attach(since=since, takeover=takeover)
        try:
            await attachment.attached()  # as NeMo Gym's own providers: an unknown id raises here
        except (NotFoundError, FailedPreconditionError, SandboxError) as e:
            raise base.SandboxPtyError(f"PTY session {session_id}: {e}") from e
        return PtySession(p, ours, terminal, attachment, owned=False, mode=None)


# What a TTY's line discipline turns into a signal for the foreground job (sbx.pty/1 carries
# input, not signals).
_SIGNAL_KEYS = {"SIGINT": b"\x03", "SIGQUIT": b"\x1c", "SIGTSTP": b"\x1a"}


class PtySession:
    """NeMo Gym's ``SandboxPtySession`` over an sbx terminal and its attachment."""

    def __init__(self, provider: Provider, handle: Any, terminal: Terminal, attachment: Attachment,
                 *, owned: bool, mode: str | None) -> None:
        self._provider = provider
        self._handle = handle
        self._terminal = terminal
        self._attachment = attachment
        self._owned = owned  # created here: close() ends it; attached: close() detaches
        self._closed = False
        self.session_id = terminal.id
        self.mode = mode
        self._out: asyncio.Queue[bytes] = asyncio.Queue()
        self._err: asyncio.Queue[bytes] = asyncio.Queue()
        self._pump = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while (item := await self._attachment.next()) is not None:
            stream, _, data = item
            if stream == "stderr":
                self.mode = "pipe"
            (self._err if stream == "stderr" else self._out).put_nowait(data)
        self._out.put_nowait(b"")
        self._err.put_nowait(b"")

    @property
    def closed(self) -> bool:
        return self._closed

    async def _read(self, queue: asyncio.Queue[bytes], timeout_s: float | None) -> bytes:
        try:
            data = await asyncio.wait_for(queue.get(), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no output from terminal {self.session_id} in {timeout_s} s") from None
        if data == b"":
            queue.put_nowait(b"")  # every later read sees the end too
            await self._exit_code()  # raises SandboxPtyError when it did not exit
        return data

    async def read(self, *, timeout_s: float | None = None) -> bytes:
        return await self._read(self._out, timeout_s)

    async def read_stderr(self, *, timeout_s: float | None = None) -> bytes:
        return await self._read(self._err, timeout_s)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while data := await self.read():
            yield data

    async def write(self, data: bytes) -> None:
        await self._terminal.write(data)

    async def resize(self, rows: int, cols: int) -> None:
        await self._terminal.resize(rows, cols)

    async def send_signal(self, signal: str) -> None:
        """SIGINT, SIGQUIT and SIGTSTP as the keys a TTY turns into them; others refused."""
        key = _SIGNAL_KEYS.get(signal.upper())
        if key is None or self.mode == "pipe":
            raise ValueError(f"sbx terminals take {', '.join(_SIGNAL_KEYS)} on a TTY only, not {signal}")
        await self._terminal.write(key)

    async def _exit_code(self) -> int:
        try:
            return await self._attachment.exit_code()
        except (FailedPreconditionError, NotFoundError, SandboxError) as e:
            raise base.SandboxPtyError(f"terminal {self.session_id}: {e}") from e

    async def wait_exit(self, *, timeout_s: float | None = None) -> int:
        try:
            return await asyncio.wait_for(self._exit_code(), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"terminal {self.session_id} did not exit in {timeout_s} s") from None

    async def run_detached(self, command: str, *, poll_interval_s: float = 15.0) -> tuple[bytes, int | None]:
        """Runs ``command`` on a terminal of its own (merged output, its exit code)."""
        terminal = await self._provider.open_pty(self._handle, command)
        attachment = terminal.attach(since=0)
        output = b"".join([data async for _, _, data in attachment])
        try:
            return output, await attachment.exit_code()
        finally:
            try:
                await terminal.close()
            except NotFoundError:
                pass

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owned:
            try:
                await self._terminal.close()
            except NotFoundError:
                pass
        else:
            self._attachment.detach()
        self._pump.cancel()

    async def __aenter__(self) -> "PtySession":
        return self

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        await self.close()

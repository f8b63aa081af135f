"""sbx as a NeMo Gym sandbox provider (the entry point ``sbx`` of ``nemo_gym.sandbox_providers``).

NeMo Gym 0.7.0, unchanged, finds it by name::

    from nemo_gym.sandbox.providers.registry import create_provider
    provider = create_provider({"sbx": {"provider": "local_docker", "config": {"agent": True}}})

and its ``Sandbox`` / ``AsyncSandbox`` wrappers run on it. ``provider`` names a plugin (its
``config`` is that plugin's config), or, with ``host_config`` (a dict or the path of the JSON
``sbx --config`` reads), a provider block of that config. ``plugin_dirs`` are searched before the
defaults. It implements ``SandboxProvider``, pause/resume, ``ConnectableProvider`` (a handle
serialised in one process is connected in another) and the endpoint capability, with NeMo Gym's
own dataclasses, enum and create errors: this module imports ``nemo_gym``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.providers import base  # type: ignore[import-not-found]

from ._host import Host, Provider
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

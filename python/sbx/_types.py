"""The values of NeMo Gym's provider-neutral sandbox contract, as sbx's Python API takes and
returns them (the same fields and meanings as ``nemo_gym.sandbox.providers.base``)."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ._errors import InvalidArgumentError


@dataclass(frozen=True)
class SandboxResources:
    """A resource request; None leaves it to the provider."""

    cpu: float | None = None
    memory_mib: int | None = None
    disk_gib: int | None = None
    gpu: int | None = None
    gpu_type: str | None = None

    @classmethod
    def from_mapping(cls, resources: Mapping[str, Any] | None) -> SandboxResources:
        return cls(**dict(resources or {}))


@dataclass(frozen=True)
class SandboxSpec:
    """What to create. ``files`` (remote path to text) are written before create returns;
    ``ports`` are the services :meth:`~sbx.Provider.endpoint` may reach."""

    image: str | None = None
    ttl_s: float | None = None
    ready_timeout_s: float | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    resources: SandboxResources | Mapping[str, Any] = field(default_factory=SandboxResources)
    entrypoint: list[str] | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    ports: tuple[int, ...] | list[int] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """The spec as the host's JSON (sbx::SandboxSpec::from_json), unset fields left out."""
        resources = self.resources
        if isinstance(resources, Mapping):
            resources = SandboxResources.from_mapping(resources)
        out: dict[str, Any] = {
            "env": dict(self.env),
            "files": dict(self.files),
            "metadata": dict(self.metadata),
            "resources": {k: v for k, v in asdict(resources).items() if v is not None},
            "provider_options": dict(self.provider_options),
        }
        for name in ("ttl_s", "ready_timeout_s"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"spec.{name} must be a number of seconds, not {type(value).__name__}")
            if not math.isfinite(value) or value <= 0:
                raise InvalidArgumentError(f"spec.{name} must be a finite number of seconds > 0, got {value!r}")
        for name in ("image", "workdir"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"spec.{name} must be a str, not {type(value).__name__}")
        for name in ("image", "ttl_s", "ready_timeout_s", "workdir", "entrypoint"):
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if name == "entrypoint" else value
        if self.ports:
            out["ports"] = list(self.ports)
        return out


class SandboxStatus(str, enum.Enum):
    """A sandbox's lifecycle state."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    ERROR = "error"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SandboxExecResult:
    """A command's outcome. ``return_code`` is the process's exit code when it ran; with
    ``error_type`` set (``"timeout"``, ``"sandbox"``) it is the host's sentinel 125."""

    stdout: str | None
    stderr: str | None
    return_code: int
    error_type: str | None = None


ExecResult = SandboxExecResult


@dataclass
class SandboxHandle:
    """A created (or connected) sandbox. ``raw`` is the package's own state: pass the handle back
    to its provider rather than using it."""

    sandbox_id: str
    provider_name: str
    raw: Any = field(repr=False, compare=False)


@dataclass(frozen=True)
class SandboxEndpoint:
    """How to reach a service on a declared port: its absolute URL and the headers to send."""

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)

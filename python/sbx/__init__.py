"""sbx: sandbox providers for Python hosts, in process.

The package loads the same provider plugins (``.so`` files) as the ``sbx`` command and C++ hosts,
through libsbx's host API, and mirrors NeMo Gym's sandbox contract::

    import asyncio, sbx

    async def main():
        host = sbx.Host({"providers": {"docker": {"plugin": "local_docker"}}})
        docker = host.provider("docker")
        box = await docker.create(sbx.SandboxSpec(image="python:3.12-slim"))
        try:
            print((await docker.exec(box, "echo hello")).stdout)
        finally:
            await docker.close(box)

    asyncio.run(main())

Every call is asynchronous; ``provider.blocking`` has the same calls for scripts. Errors are
:class:`SandboxError` subclasses (NeMo Gym's own create errors when ``nemo_gym`` is importable).
"""

from ._errors import (
    CancelledError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SandboxCreateError,
    SandboxCreateVerificationError,
    SandboxError,
    SandboxTimeoutError,
    UnavailableError,
    UnimplementedError,
)
from ._host import BlockingProvider, ExecStream, Host, Provider
from ._terminals import Attachment, Session, Terminal
from ._types import (
    SandboxEndpoint,
    ExecResult,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)

__all__ = [
    "Attachment",
    "BlockingProvider",
    "CancelledError",
    "SandboxEndpoint",
    "ExecResult",
    "ExecStream",
    "FailedPreconditionError",
    "Host",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "Provider",
    "ResourceExhaustedError",
    "SandboxCreateError",
    "SandboxCreateVerificationError",
    "SandboxError",
    "SandboxExecResult",
    "SandboxHandle",
    "SandboxResources",
    "SandboxSpec",
    "SandboxStatus",
    "SandboxTimeoutError",
    "Session",
    "Terminal",
    "UnavailableError",
    "UnimplementedError",
]

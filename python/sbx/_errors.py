"""sbx's errors as Python exceptions: one hierarchy, with NeMo Gym's names and meanings.

Every exception the package raises for a failed operation is a :class:`SandboxError` (or, for a
failed create, NeMo Gym's own ``SandboxCreateError`` / ``SandboxCreateVerificationError`` when
``nemo_gym`` is importable: those classes themselves are raised, so a NeMo Gym host's ``except``
clauses catch them). Each carries the host's classification: ``status`` (``"NOT_FOUND"``...),
``reason`` (the provider's finer code, or ``""``) and ``retryable``. A non-zero exit of a command
is not an error: it is a :class:`~sbx.SandboxExecResult`.
"""

from __future__ import annotations

from typing import Any


class SandboxError(RuntimeError):
    """A failed sbx operation; ``status``, ``reason`` and ``retryable`` say why."""

    status: str = "INTERNAL"
    reason: str = ""
    retryable: bool = False


class InvalidArgumentError(SandboxError, ValueError):
    """A bad spec, request, config or option (do not retry)."""


class NotFoundError(SandboxError, LookupError):
    """The sandbox, file, image or provider does not exist."""


class SandboxTimeoutError(SandboxError, TimeoutError):
    """A deadline passed before the backend answered."""


class CancelledError(SandboxError):
    """The operation was cancelled (by the host, or a cancelled task)."""


class UnavailableError(SandboxError, ConnectionError):
    """The backend is unreachable or overloaded (usually retryable)."""


class ResourceExhaustedError(SandboxError):
    """A quota, a rate limit, a full disk."""


class FailedPreconditionError(SandboxError):
    """The state does not allow it (a paused or closed sandbox, a plugin that did not load)."""


class UnimplementedError(SandboxError, NotImplementedError):
    """The provider does not offer this call or option."""


class PermissionDeniedError(SandboxError, PermissionError):
    """Credentials or permissions refused."""


class InternalError(SandboxError):
    """A bug, or an answer of the backend nobody expected."""


def _nemo_gym_create_errors() -> tuple[type[Exception], type[Exception]] | None:
    try:
        from nemo_gym.sandbox.providers.base import (  # type: ignore[import-not-found]
            SandboxCreateError as NemoCreateError,
            SandboxCreateVerificationError as NemoVerificationError,
        )
    except Exception:  # not installed, or a NeMo Gym without them
        return None
    return NemoCreateError, NemoVerificationError


_nemo = _nemo_gym_create_errors()
if _nemo is not None:
    SandboxCreateError: type[Exception] = _nemo[0]
    SandboxCreateVerificationError: type[Exception] = _nemo[1]
else:

    class SandboxCreateError(SandboxError):  # type: ignore[no-redef]
        """A provider could not create a sandbox (NeMo Gym's SandboxCreateError)."""

    class SandboxCreateVerificationError(SandboxCreateError):  # type: ignore[no-redef]
        """A new sandbox failed its readiness checks (NeMo Gym's SandboxCreateVerificationError)."""


_BY_STATUS: dict[str, type[SandboxError]] = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "NOT_FOUND": NotFoundError,
    "TIMEOUT": SandboxTimeoutError,
    "CANCELLED": CancelledError,
    "UNAVAILABLE": UnavailableError,
    "RESOURCE_EXHAUSTED": ResourceExhaustedError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "UNIMPLEMENTED": UnimplementedError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "INTERNAL": InternalError,
}


def error_from(details: dict[str, Any]) -> Exception:
    """The exception for an error the host reported (the dict the module passes)."""
    status = str(details.get("status", "INTERNAL"))
    message = str(details.get("message", "unknown error"))
    cls: type[Exception]
    if details.get("create_failure") and status != "CANCELLED":
        if status == "CREATE_VERIFICATION_FAILED":
            cls = SandboxCreateVerificationError
        else:
            cls = SandboxCreateError
    else:
        cls = _BY_STATUS.get(status, InternalError)
    error = cls(message)
    error.status = status  # type: ignore[attr-defined]
    error.reason = str(details.get("reason", ""))  # type: ignore[attr-defined]
    error.retryable = bool(details.get("retryable", False))  # type: ignore[attr-defined]
    return error

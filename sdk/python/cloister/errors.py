"""Exceptions raised by the Cloister client.

Every failure is a :class:`cloister.Error`; its subclass says what kind of failure it was (the
gRPC/absl status code) and ``str(error)`` is the reason given by whoever refused the call: the
enclave, ``cloisterd`` or this client. Catch the subclass you can handle, for example::

    try:
        outputs = client.infer("cls", {"x": image})
    except cloister.ResourceExhausted:      # over the tenant's quota or rate: back off
        time.sleep(1)
    except cloister.DeadlineExceeded:       # took longer than the timeout
        ...

Several classes also derive from the built-in exception Python code expects for that kind of
failure (``InvalidArgument`` is a ``ValueError``, ``NotFound`` a ``LookupError``,
``DeadlineExceeded`` a ``TimeoutError``, ``Unavailable`` a ``ConnectionError``,
``PermissionDenied`` a ``PermissionError``).

Where a program should act on why a call failed, ``error.reason`` names it (``None`` when there
is no such reason): ``"SESSION_LOST"`` and ``"EVIDENCE_STALE"`` (the client attests again and
retries idempotent calls on its own), ``"NOTHING_STORED"`` (an upload may be sent again),
``"OVERLOADED"`` (a rate or queue limit: back off), ``"QUOTA_EXCEEDED"`` and ``"TOO_LARGE"``
(sending again does not help).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Type

from .types import Check, Verdict

__all__ = [
    "Error",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
    "AttestationError",
]


class Error(Exception):
    """Base class of every error the Cloister client raises.

    Attributes:
        code: the status code name, e.g. ``"RESOURCE_EXHAUSTED"``.
        message: the reason, one line.
        reason: the machine-readable reason, e.g. ``"OVERLOADED"``, or ``None``.
    """

    code: str = "UNKNOWN"

    def __init__(self, message: str, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


class Cancelled(Error):
    """The call was cancelled."""

    code = "CANCELLED"


class Unknown(Error):
    """A failure without a more specific code."""

    code = "UNKNOWN"


class InvalidArgument(Error, ValueError):
    """Bad input: a wrong tensor name, datatype or shape, an empty model name, a bad file."""

    code = "INVALID_ARGUMENT"


class DeadlineExceeded(Error, TimeoutError):
    """The call did not finish within its timeout (or the request's scheduling deadline)."""

    code = "DEADLINE_EXCEEDED"


class NotFound(Error, LookupError):
    """No such model (for this identity key), file or session."""

    code = "NOT_FOUND"


class AlreadyExists(Error, FileExistsError):
    """The thing to create exists already, e.g. the key file of generate_key."""

    code = "ALREADY_EXISTS"


class PermissionDenied(Error, PermissionError):
    """Not allowed: a file that cannot be read or created, a request that is not yours."""

    code = "PERMISSION_DENIED"


class ResourceExhausted(Error):
    """Over a limit of the tenant: request rate, queue, payload size, model quota, sessions."""

    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(Error):
    """The system is not in a state to do this (e.g. a key file readable by others)."""

    code = "FAILED_PRECONDITION"


class Aborted(Error):
    """The operation was aborted (e.g. a model file changed while it was uploaded)."""

    code = "ABORTED"


class OutOfRange(Error):
    """A value outside its valid range."""

    code = "OUT_OF_RANGE"


class Unimplemented(Error):
    """Not supported by this server or client."""

    code = "UNIMPLEMENTED"


class Internal(Error):
    """An internal error of the server or the enclave."""

    code = "INTERNAL"


class Unavailable(Error, ConnectionError):
    """cloisterd cannot be reached or is shutting down; retrying later may succeed."""

    code = "UNAVAILABLE"


class DataLoss(Error):
    """A reply that does not decrypt or parse: tampering or corruption on the way."""

    code = "DATA_LOSS"


class Unauthenticated(Error):
    """Unknown tenant or wrong API token."""

    code = "UNAUTHENTICATED"


class AttestationError(Error):
    """The server's attestation evidence did not satisfy the policy; no session was opened.

    Attributes:
        verdict: the full :class:`Verdict` (every check, pass or fail), or ``None`` when the
            evidence could not even be parsed.
        failed_checks: the checks that failed, each with its name and the reason.
    """

    code = "FAILED_PRECONDITION"

    def __init__(self, message: str, verdict: Optional[Verdict] = None) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.failed_checks: List[Check] = verdict.failed_checks if verdict is not None else []


_BY_CODE: Dict[int, Type[Error]] = {
    1: Cancelled,
    2: Unknown,
    3: InvalidArgument,
    4: DeadlineExceeded,
    5: NotFound,
    6: AlreadyExists,
    7: PermissionDenied,
    8: ResourceExhausted,
    9: FailedPrecondition,
    10: Aborted,
    11: OutOfRange,
    12: Unimplemented,
    13: Internal,
    14: Unavailable,
    15: DataLoss,
    16: Unauthenticated,
}

_ATTESTATION_PREFIX = "attestation failed"


def _make_error(
    code: int,
    message: str,
    verdict: Optional[Tuple[bool, list, dict]] = None,
    reason: str = "",
) -> Error:
    """Builds the exception for a failed native call (called by cloister._native)."""
    if verdict is not None or (code == 9 and message.startswith(_ATTESTATION_PREFIX)):
        error: Error = AttestationError(
            message, Verdict._from_native(verdict) if verdict is not None else None
        )
    else:
        error = _BY_CODE.get(code, Unknown)(message)
    error.reason = reason or None
    return error

"""Every outcome of a data-plane exchange in one table: for each wire status, the exception it
stands for, the operations for which it is an answer the API reports rather than a failure, and
the reason the SDK counts a miss under; and for each exception the SDK turns into a miss, that
reason. The codec (``frame``), the SDK's protocol, its outcome accounting and its dispatcher all
read this table, so a status cannot mean one thing to one of them and another to the next.

Absence is a value and failure an exception (``errors``): NOT_FOUND is an answer everywhere;
NO_SPACE answers the single-key writes and reads (the caller reports "not stored" or a miss and
the connection stays usable) but fails a batch header; CHECKSUM_MISMATCH answers a write whose
bytes the server refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from gcache.errors import (
    AuthFailed,
    ChecksumMismatch,
    ConnectFailed,
    ConnectionLost,
    GCacheError,
    IOTimeout,
    NoSpace,
    ProtocolError,
    ServerError,
)
from gcache.frame import Header, Op, Status

_WRITES = frozenset({Op.PUT, Op.ALLOC, Op.COMMIT})
_EVERY_OP = frozenset(Op)


@dataclass(frozen=True, slots=True)
class Outcome:
    error: type[ServerError] | None    # what the status raises where it is a failure
    answers: frozenset[Op]             # operations for which it is an answer, not a failure
    miss: str | None                   # the SDK's miss reason when it makes a call miss


STATUSES: dict[Status, Outcome] = {
    Status.OK: Outcome(None, _EVERY_OP, None),
    Status.NOT_FOUND: Outcome(None, _EVERY_OP, "absent"),
    Status.NO_SPACE: Outcome(NoSpace, _WRITES | {Op.GET, Op.LEASE}, "no_space"),
    Status.CHECKSUM_MISMATCH: Outcome(ChecksumMismatch, _WRITES, "checksum"),
    Status.AUTH_REQUIRED: Outcome(AuthFailed, frozenset(), "auth"),
    Status.AUTH_FAILED: Outcome(AuthFailed, frozenset(), "auth"),
    # The server's word that it refuses what this side sent: a failed exchange (a miss in the
    # SDK), not a caller's bad argument.
    Status.BAD_REQUEST: Outcome(ServerError, frozenset(), "server_error"),
    Status.TOO_LARGE: Outcome(ServerError, frozenset(), "server_error"),
    Status.UNKNOWN_HANDLE: Outcome(ServerError, frozenset(), "server_error"),
    Status.INTERNAL: Outcome(ServerError, frozenset(), "server_error"),
}

# Exceptions an exchange can end in, most specific first; anything else is "server_error".
ERROR_MISSES: tuple[tuple[type[GCacheError], str], ...] = (
    (AuthFailed, "auth"),
    (IOTimeout, "timeout"),
    (ConnectFailed, "unreachable"),
    (ConnectionLost, "connection_lost"),
    (ProtocolError, "protocol"),
)


def raise_for_status(header: Header, context: str) -> None:
    """Raise the exception a failure status stands for, whatever the operation; OK and
    NOT_FOUND are not failures."""
    error = STATUSES[header.status].error
    if error is None:
        return
    if error is AuthFailed:
        raise AuthFailed(f"{context}: server answered {header.status.name}; check the cluster "
                         "token")
    if error is ServerError:
        raise ServerError(header.status.name, context)
    raise error(context)


def raise_unless_answer(header: Header, context: str) -> None:
    """``raise_for_status`` for a status that is not an answer to ``header.op``."""
    if header.op not in STATUSES[header.status].answers:
        raise_for_status(header, context)


def status_miss(status: Status) -> str:
    """The miss reason of a status that made a call miss."""
    return STATUSES[status].miss or "server_error"


def error_miss(exc: BaseException) -> str:
    """The miss reason of an exchange that ended in ``exc``."""
    return next((reason for kind, reason in ERROR_MISSES if isinstance(exc, kind)),
                "server_error")

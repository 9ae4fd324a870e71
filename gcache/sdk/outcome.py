"""How an exchange's result becomes what the API returns, with the hit and miss accounting."""

from __future__ import annotations

import logging
from typing import Literal, overload

from gcache.frame import Status
from gcache.outcomes import status_miss
from gcache.sdk.dispatch import Miss
from gcache.sdk.metrics import ClientStats
from gcache.sdk.protocol import ReadResult
from gcache.sdk.receive_buffers import RECEIVE_BUFFERS

log = logging.getLogger(__name__)
Answer = ReadResult | Status | Miss | None       # what a read's exchange ended in


def put_outcome(stats: ClientStats, status: Status | Miss, n_bytes: int) -> bool:
    """True when stored; a NO_SPACE or CHECKSUM_MISMATCH answer counts as a miss."""
    if isinstance(status, Miss):
        return False                              # counted where it failed
    if status == Status.OK:
        stats.stored(n_bytes)
        return True
    stats.miss(status_miss(status))
    return False


@overload
def read_outcome(stats: ClientStats, result: Answer, *,
                 want_bytes: Literal[True]) -> bytes | None: ...
@overload
def read_outcome(stats: ClientStats, result: Answer, *,
                 want_bytes: Literal[False]) -> int | None: ...
@overload
def read_outcome(stats: ClientStats, result: Answer, *,
                 want_bytes: bool) -> bytes | int | None: ...
def read_outcome(stats: ClientStats, result: Answer, *,
                 want_bytes: bool) -> bytes | int | None:
    """The value (bytes) or its length, or None for absent, failed and corrupt reads, and for
    a value the server could not bring up from its disk for want of memory (NO_SPACE)."""
    if isinstance(result, Miss):
        return None
    if result is None or isinstance(result, Status):
        stats.miss(status_miss(Status.NOT_FOUND if result is None else result))
        return None
    value = bytes(result.data[:result.length]) if want_bytes and result.checksum_ok else None
    if want_bytes:                 # the read landed in a lent buffer: copied out, it goes back
        RECEIVE_BUFFERS.give(result.data)
    if not result.checksum_ok:
        log.error("sdk.checksum_mismatch bytes=%d", result.length)
        stats.miss(status_miss(Status.CHECKSUM_MISMATCH))
        return None
    stats.hit(result.length)
    return value if want_bytes else result.length

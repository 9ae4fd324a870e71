"""The ``Exchange`` seam: how one link moves values. Every link gets one, chosen once per server
at the handshake (``gcache.sdk.routes``): ``tcp`` (values inside the frames), ``shm`` (copies
through the server's mapped arena) or ``nixl`` (NIXL READs and WRITEs of the server's
registered arena). The SDK's operations and batches are written against this Protocol only.

A batch runs in three phases so that the per-value work of several servers overlaps on the IO
threads: ``start_reads`` / ``start_writes`` on the link (one request per server); then, for
each ``Extent`` they returned, ``copy_out`` / ``copy_in`` on an IO thread; then ``end_reads`` /
``end_writes`` on the same link, which is held throughout (a server drops what a connection
leased or allocated when it closes). An exchange whose values travel inside the replies (TCP)
finishes in the first phase and returns no extents.

Every method may raise the GCache transport errors (the link is then closed and the keys are
misses); ``start_*`` may raise ``PoolExhausted`` before any IO when a CUDA buffer finds no
pinned staging in time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from gcache.buffer import BufferLike
from gcache.frame import Status
from gcache.sdk.ahead_hash import AheadHash
from gcache.sdk.leases import Extent
from gcache.sdk.protocol import Channel, ReadResult

ReadItem = ReadResult | Extent | Status | None       # None: absent; Status.NO_SPACE: on disk
WriteItem = Extent | Status


class Exchange(Protocol):
    name: str                    # "tcp", "shm" or "nixl": what stats and logs call the route
    reads_arena: bool            # reads copy out of the server's arena (not from its replies)

    def read(self, ch: Channel, key: bytes, out: BufferLike, *,
             verify: bool) -> ReadResult | Status | None:
        """One key into ``out`` (a writable byte view, a CUDA tensor, or None for a new
        buffer). None when absent, NO_SPACE when on disk with no room to bring it up now;
        InvalidRequest for an ``out`` smaller than the value."""

    def write(self, ch: Channel, key: bytes, value: BufferLike, *, group: int,
              flags: int = 0) -> Status:
        """One value (``flags``: the put's, ``FLAG_CONTENT_ADDRESSED``); OK, NO_SPACE or
        CHECKSUM_MISMATCH."""

    # A Sequence (covariant), not a list: a leasing exchange returns only its narrower items.
    def start_reads(self, ch: Channel, keys: Sequence[bytes], outs: Sequence[BufferLike] | None, *,
                    verify: bool) -> Sequence[ReadItem]:
        """A batch read's first phase: per key a result, or an Extent for ``copy_out``."""

    def copy_out(self, extent: Extent, out: BufferLike, *, verify: bool) -> bool:
        """One leased value into ``out``; False when its checksum does not hold."""

    def end_reads(self, ch: Channel, handles: Sequence[int]) -> None:
        """Let go of the leases ``start_reads`` took (no reply awaited)."""

    def start_writes(self, ch: Channel, keys: Sequence[bytes], values: Sequence[BufferLike], *,
                     group: int, flags: int = 0) -> list[WriteItem]:
        """A batch write's first phase: per key a final status, or an Extent for ``copy_in``."""

    def copy_in(self, extent: Extent, value: BufferLike,
                landed: Callable[[int, int], None] | None = None, *,
                ahead: AheadHash | None = None) -> int:
        """One value into its allocated extent; its checksum (finishing ``ahead``, the hash
        the caller began, where given). ``landed(start, size)``, called as each piece has
        landed, lets the server hash it meanwhile (``leases.written``)."""

    def end_writes(self, ch: Channel, handles: Sequence[int],
                   digests: Sequence[int]) -> list[Status]:
        """Commit the copied extents, in order."""

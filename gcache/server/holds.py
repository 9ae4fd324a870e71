"""The hot tier's holds: its leases and writes in flight, by the handle the wire protocol names.

Rules (every call is made under the tier's lock):
- Every lease and every pending write holds its span (``Segment.pins``) until RELEASE / COMMIT
  / abort, or until ``reap`` once the TTL has passed, so a dead client cannot hold memory for
  longer than that. A pending write whose bytes are being received when its TTL passes is not
  dropped under the receive (the bytes would land in reused memory): it is marked expired,
  refuses further writes and its COMMIT, and is dropped when that receive ends, which the
  connection's transfer deadline bounds.
- Holds the server takes for its own single-frame transfers (GET, PUT, batches) do not expire
  (``expires=False``): the handler gives them back, and a stalled peer is cut off by the
  connection's transfer deadline.
- A dropped pending write of a kept value (``FLAG_PINNED``) is uncounted from its span's kept
  figures: ALLOC counted it.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

from gcache.errors import InvalidRequest
from gcache.keys import checksum_stream
from gcache.server.arena import Segment
from gcache.server.handles import Hold
from gcache.server.tier_counters import TierCounters
from gcache.server.tier_protocol import Entry


class Holds:
    def __init__(self, ttl_s: float, counters: TierCounters, *,
                 unpin: Callable[[Segment], None],
                 uncount_kept: Callable[[Segment], None]) -> None:
        """``unpin``: let go of a span's pin; ``uncount_kept``: a kept write's span no longer
        counts it."""
        self.ttl_s = ttl_s
        self._counters = counters
        self._unpin, self._uncount_kept = unpin, uncount_kept
        self._by_handle: dict[int, Hold] = {}
        self._handles = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_handle)

    def add(self, entry: Entry, *, pending: bool, expires: bool = True) -> int:
        """Hold ``entry``'s span for a write (``pending``, hashed as it arrives in order) or a
        read; its handle."""
        handle = next(self._handles)
        entry.head.pins += 1
        deadline = time.monotonic() + self.ttl_s if expires else math.inf
        self._by_handle[handle] = Hold(entry, deadline, pending,
                                       hasher=checksum_stream() if pending else None)
        return handle

    def write(self, handle: int) -> Hold:
        """The write in flight ``handle`` names; InvalidRequest when there is none."""
        hold = self._by_handle.get(handle)
        if hold is None or not hold.pending or hold.expired:
            raise InvalidRequest(f"handle {handle} is not a write in flight")
        return hold

    def take_write(self, handle: int) -> Hold:
        """Remove a write in flight that no receive is filling, for its COMMIT (the caller
        unpins its span); InvalidRequest when there is none."""
        hold = self.write(handle)
        if hold.writers:
            raise InvalidRequest(f"handle {handle} is not a write in flight")
        del self._by_handle[handle]
        return hold

    def received(self, handle: int) -> bool:
        """A receive into ``handle``'s extent ended; False when its TTL passed meanwhile (it is
        dropped now, and the bytes just received count for nothing)."""
        hold = self._by_handle.get(handle)
        if hold is None:
            return False
        hold.hashing = False
        hold.writers -= 1
        if not hold.expired:
            return True
        if self._drop(handle, hold):
            self._counters.expired_pins += 1
        return False

    def abort(self, handle: int) -> None:
        hold = self._by_handle.get(handle)
        if hold is not None and hold.pending:
            self._drop(handle, hold)

    def lease(self, handle: int) -> Hold:
        """The read lease ``handle`` names; InvalidRequest when there is none."""
        hold = self._by_handle.get(handle)
        if hold is None or hold.pending:
            raise InvalidRequest(f"handle {handle} is not a read lease")
        return hold

    def release(self, handle: int) -> bool:
        """Give a read lease back; False when ``handle`` names none."""
        hold = self._by_handle.get(handle)
        if hold is None or hold.pending:
            return False
        del self._by_handle[handle]
        self._unpin(hold.entry.head)
        return True

    def reap(self, now_s: float) -> int:
        """Drop the holds whose TTL passed by ``now_s``; how many were found."""
        expired = [h for h, hold in self._by_handle.items()
                   if hold.expires_s <= now_s and not hold.expired]
        for handle in expired:
            if self._drop(handle, self._by_handle[handle]):
                self._counters.expired_pins += 1
        return len(expired)

    def _drop(self, handle: int, hold: Hold) -> bool:
        """Let go of ``handle`` now (True), or, while a receive is writing into its extent,
        mark it expired for ``received`` to drop when the receive ends (False)."""
        if hold.writers:
            hold.expired = True
            return False
        del self._by_handle[handle]
        self._unpin(hold.entry.head)
        if hold.pending and hold.entry.pinned:
            self._uncount_kept(hold.entry.head)
        return True

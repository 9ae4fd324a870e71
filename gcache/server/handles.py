"""The hot tier's ``Lease`` and ``Write``: a read or a write in flight, as an object that knows
its handle and gives itself back; and the tier's ``Hold`` of the span each one keeps.

Each is a thin face over the tier's hold of the span (``tier.HotTier``): the tier keeps the
holds (so its upkeep can reap the expired ones, and STAT can count them), these objects carry the
handle the wire protocol names and make views only when asked (a view is released before the
object is given back: an exported view would keep the arena from unmapping).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gcache.keys import Hasher
from gcache.server.tier_protocol import Entry, Fill

if TYPE_CHECKING:
    from gcache.server.tier import HotTier


@dataclass(slots=True)
class Hold:
    """A lease or a write in flight, holding its span."""

    entry: Entry
    expires_s: float           # time.monotonic() deadline
    pending: bool              # a write in flight (True) or a read lease (False)
    hasher: Hasher | None = None   # running xxh3 of in-order writes; None once order is lost
    hashed: int = 0            # bytes covered (or claimed) by ``hasher``
    hashing: bool = False      # a write feeding ``hasher`` is in flight
    writers: int = 0           # receives into the extent in progress (``write_target`` taken)
    expired: bool = False      # the TTL passed during a receive: dropped when it ends


class HotLease:
    __slots__ = ("_tier", "entry", "handle")

    def __init__(self, tier: HotTier, handle: int, entry: Entry) -> None:
        self._tier, self.handle, self.entry = tier, handle, entry

    def view(self, offset: int = 0, length: int | None = None) -> memoryview:
        return self._tier.read_view(self.handle, offset,
                                    self.entry.length - offset if length is None else length)

    def release(self) -> bool:
        return self._tier.release(self.handle)

    def __repr__(self) -> str:
        return f"HotLease(handle={self.handle}, key={self.entry.key[:64]!r})"


class HotWrite:
    __slots__ = ("_tier", "entry", "handle")

    def __init__(self, tier: HotTier, handle: int, entry: Entry) -> None:
        self._tier, self.handle, self.entry = tier, handle, entry

    def receive(self, offset: int, n_bytes: int, fill: Fill) -> bool:
        view, hasher = self._tier.write_target(self.handle, offset, n_bytes)
        try:
            fill(view, hasher)
        finally:
            view.release()
            in_time = self._tier.write_done(self.handle)
        return in_time

    def commit(self, expected: int) -> bool:
        return self._tier.commit(self.handle, expected)

    def abort(self) -> None:
        self._tier.abort(self.handle)

    def __repr__(self) -> str:
        return f"HotWrite(handle={self.handle}, key={self.entry.key[:64]!r})"

"""Kept values: a file's parts (put with ``FLAG_PINNED``), held in memory against eviction.

A kept value holds its span for as long as it is current (``Segment.kept`` counts them): the
span is never offered to eviction nor to the demoter, however old. The spans holding kept values
are bounded by a budget (``--pin-share`` of the hot tier), counted in whole spans, the memory a
held span keeps from eviction: past it a kept put is NoSpace, so KV traffic always has the rest
of the arena. A kept write counts from its ALLOC, so writes in flight at once cannot each pass
the check. A span holding a kept value is not moved: KV values that share it stay with it. The
mark is the record header's ``PINNED_BIT``, so a restart finds kept values again.

Pinned values count against their tenant: the spans holding a tenant's kept values (whole, as
for the budget) stay within its memory quota (when it has one), past which its kept put is
NoSpace too; they are never evicted, so without that a tenant could hold its neighbours'
reserved memory with files.

(The wire flag, the SDK argument and STAT's counters say "pinned", as the interface always has;
inside the server "pin" means only a lease or a write holding a span.) Not thread-safe: the
tier's lock guards it.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from gcache.errors import NoSpace
from gcache.server import record
from gcache.server.arena import Arena, Segment

if TYPE_CHECKING:
    from gcache.server.reclaim import Quotas


class Keep:
    def __init__(self, arena: Arena, budget_bytes: int, quotas: Quotas | None = None) -> None:
        self.arena = arena
        self.budget_bytes = budget_bytes
        self.quotas = quotas
        self._records: dict[bytes, int] = {}     # key -> record of the current kept values
        self.held_segments = 0                   # segments of the spans they hold
        self._owner_segments: collections.Counter[int] = collections.Counter()

    def __len__(self) -> int:
        return len(self._records)

    @property
    def held_bytes(self) -> int:
        return self.held_segments * self.arena.segment_size

    def held_by_owner(self, owner: int) -> int:
        """Bytes of the spans holding ``owner``'s kept values."""
        return self._owner_segments[owner] * self.arena.segment_size

    def check_budget(self, n_bytes: int, owner: int = 0) -> None:
        """Raise NoSpace when a kept record of ``n_bytes`` of ``owner``'s could take the spans
        holding kept values past the budget, or its owner's past its memory quota. Into the
        open segment, already held, it costs none."""
        open_ = self.arena.fits_open(n_bytes, owner)
        if open_ is not None and open_.kept:
            return
        span = self.arena.span_of(n_bytes)
        if (self.held_segments + span) * self.arena.segment_size > self.budget_bytes:
            raise NoSpace(f"the pin budget of {self.budget_bytes} bytes is spent: "
                          f"{self.held_segments} segment(s) of {self.arena.segment_size} "
                          f"bytes hold pinned values, and this one needs {span} more")
        quota = self.quotas.memory_quota(owner) if self.quotas is not None and owner else 0
        if quota and (self._owner_segments[owner] + span) * self.arena.segment_size > quota:
            raise NoSpace(f"tenant {owner}'s pinned values hold {self._owner_segments[owner]} "
                          f"segment(s) of {self.arena.segment_size} bytes; {span} more would "
                          f"pass its memory quota of {quota} bytes")

    def keep(self, key: bytes, offset: int, head: Segment) -> None:
        """The committed record at ``offset`` is ``key``'s kept value now."""
        self._records[key] = offset
        self.count(head)

    def drop(self, key: bytes) -> bool:
        """``key``'s kept record (if it had one) is no longer current; True when its span
        holds no kept value any more (it may be reclaimed now)."""
        offset = self._records.pop(key, None)
        return offset is not None and self.uncount(self.arena.segment_of(offset))

    def count(self, head: Segment) -> None:
        """One more kept value (or kept write in flight) in ``head``'s span."""
        head.kept += 1
        if head.kept == 1:
            self.held_segments += head.span
            self._owner_segments[head.owner] += head.span

    def uncount(self, head: Segment) -> bool:
        """One fewer; True when the span holds none any more (it may be reclaimed now)."""
        head.kept -= 1
        if head.kept == 0:
            self.held_segments -= head.span
            self._owner_segments[head.owner] -= head.span
            return True
        return False

    def keys(self, prefix: bytes, *, after: bytes = b"") -> list[bytes]:
        """The kept keys starting with ``prefix`` and sorting after ``after``, unsorted (the
        caller sorts a page outside the lock)."""
        return [k for k in self._records if k.startswith(prefix) and k > after]

    def is_kept(self, offset: int) -> bool:
        return record.is_pinned(self.arena.view, offset)

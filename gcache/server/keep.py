"""Kept values: a file's parts (put with ``FLAG_PINNED``), held in memory against eviction.

A kept value holds its span for as long as it is current (``Segment.kept`` counts them): the
span is never offered to eviction nor to the demoter, however old. The spans holding kept values
are bounded by a budget (``--pin-share`` of the hot tier), counted in whole spans, the memory a
held span keeps from eviction: past it a kept put is NoSpace, so KV traffic always has the rest
of the arena. A kept write counts from its ALLOC, so writes in flight at once cannot each pass
the check. A span holding a kept value is not moved: KV values that share it stay with it. The
mark is the record header's ``PINNED_BIT``, so a restart finds kept values again.

(The wire flag, the SDK argument and STAT's counters say "pinned", as the interface always has;
inside the server "pin" means only a lease or a write holding a span.) Not thread-safe: the
tier's lock guards it.
"""

from __future__ import annotations

from gcache.errors import NoSpace
from gcache.server import record
from gcache.server.arena import Arena, Segment


class Keep:
    def __init__(self, arena: Arena, budget_bytes: int) -> None:
        self.arena = arena
        self.budget_bytes = budget_bytes
        self._records: dict[bytes, int] = {}     # key -> record of the current kept values
        self.held_segments = 0                   # segments of the spans they hold

    def __len__(self) -> int:
        return len(self._records)

    @property
    def held_bytes(self) -> int:
        return self.held_segments * self.arena.segment_size

    def check_budget(self, n_bytes: int) -> None:
        """Raise NoSpace when a kept record of ``n_bytes`` could take the spans holding kept
        values past the budget. Into the open segment, already held, it costs none."""
        open_ = self.arena.fits_open(n_bytes)
        if open_ is not None and open_.kept:
            return
        span = self.arena.span_of(n_bytes)
        if (self.held_segments + span) * self.arena.segment_size > self.budget_bytes:
            raise NoSpace(f"the pin budget of {self.budget_bytes} bytes is spent: "
                          f"{self.held_segments} segment(s) of {self.arena.segment_size} "
                          f"bytes hold pinned values, and this one needs {span} more")

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

    def uncount(self, head: Segment) -> bool:
        """One fewer; True when the span holds none any more (it may be reclaimed now)."""
        head.kept -= 1
        if head.kept == 0:
            self.held_segments -= head.span
            return True
        return False

    def keys(self, prefix: bytes, *, after: bytes = b"") -> list[bytes]:
        """The kept keys starting with ``prefix`` and sorting after ``after``, unsorted (the
        caller sorts a page outside the lock)."""
        return [k for k in self._records if k.startswith(prefix) and k > after]

    def is_kept(self, offset: int) -> bool:
        return record.is_pinned(self.arena.view, offset)

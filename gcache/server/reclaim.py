"""Making room in the hot tier: claims that evict, second chances, and the demoter's side.

``gcache.eviction`` says which span goes and which values earn a second chance; this module
runs that rule over the arena and the index (all under the tier's lock, ``space``):
- **A claim** takes room in the open segment, or chooses a victim window among the arena's
  candidates, forgets the records of the spans it touches (``Index.forget_span``) and claims it.
  Without a cold tier the values read since they were written are copied aside first and
  re-appended after the record that needed the room, in the reopened segment and up to
  ``eviction.rescue_bound`` more reclaimed for them (a copy never takes a young span); one
  whose parent is gone by then is dropped. Behind a cold tier only clean spans are candidates
  (their values are on disk) and the last reusable segment is the cleaner's reserve.
- **Laggards.** A client's claim that finds no free room first cuts off the transfers into
  held room that lag (``transfers``) and waits a moment for their room to come back.
- **Waiting.** A claim that finds no room waits, within its ``wait_s``: behind a cold tier for
  the demoter to clean a span; otherwise up to ``PIN_WAIT_S`` for a pin on an older span to
  drop before it takes a young span (one a client committed into a moment ago), and refuses
  (NoSpace) when nothing is left. Once such a wait ran out in vain, claims refuse at once until
  some span is unpinned, so a batch of a thousand ALLOCs into a pinned arena takes one wait.
- **The demoter's side** (``tiered.Demoter``): pin the oldest dirty span, re-append its read
  values, and mark it clean once the rest is on disk.
- **Tenants.** Room is claimed for an owner (``tenant_keys.owner_of`` the key): its open
  segment, then a victim chosen with every owner's standing against its memory quota
  (``Quotas``; ``gcache.eviction`` says what that changes). A second chance goes back into its
  own owner's spans, and a parent is looked up among its child's owner's keys.
"""

from __future__ import annotations

import collections
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple, Protocol

from gcache.errors import NoSpace
from gcache.eviction import choose_victim, earns_second_chance, rescue_bound
from gcache.record_layout import record_size, value_offset
from gcache.server import record
from gcache.server.arena import Arena, Segment
from gcache.server.index import Index
from gcache.server.tenant_keys import owner_of, parent_key
from gcache.server.tier_counters import TierCounters
from gcache.server.tier_protocol import Entry

ALLOC_WAIT_S = 2.0       # longest a claim waits for the demoter before NoSpace
PIN_WAIT_S = 0.25        # longest a claim waits for a pin on an older span to drop
LAG_CHECK_S = 0.05       # meanwhile, how often it looks for transfers that came to lag


class Rescued(NamedTuple):
    """A value an eviction copied aside for a second chance."""

    key: bytes
    value: bytes
    checksum: int
    group: int
    parent: bytes


class Laggards(Protocol):
    """Transfers into held room that may be cut off when room is short (``transfers``)."""

    def cut_laggards(self) -> int:
        """Cut off every transfer that lags; returns how many (their room comes back as their
        connections wind down)."""


class Quotas(Protocol):
    """Each owner's memory quota on this server (``gcache.server.tenant_table``)."""

    def memory_quota(self, owner: int) -> int:
        """Bytes of the arena ``owner``'s spans may hold against other owners' claims; 0:
        none (all it holds is shared, reclaimed first)."""


class Reclaim:
    def __init__(self, arena: Arena, index: Index, counters: TierCounters,
                 space: threading.Condition, *, cold_backed: bool,
                 laggards: Laggards | None = None, quotas: Quotas | None = None) -> None:
        self.arena, self.index, self.counters, self.space = arena, index, counters, space
        self.cold_backed = cold_backed
        self.laggards = laggards
        self.quotas = quotas
        # values each owner lost to claims (no second chance): per-tenant evictions
        self.evicted_by_owner: collections.Counter[int] = collections.Counter()
        self._rescued: deque[Rescued] = deque()
        # keys waiting in ``_rescued`` (a parent waiting there is still held)
        self._rescuing: collections.Counter[bytes] = collections.Counter()
        self._pins_starved = False      # a wait for a pin ran out; none unpinned since
        # claims that evicted a young span without a cold tier: values acknowledged not long
        # before went, for want of an older span nothing pinned
        self.young_reclaims = 0

    # ---- claims (under the lock) ---------------------------------------------------------------

    def allocate(self, n_bytes: int, wait_s: float, owner: int = 0) -> tuple[Segment, int]:
        """Room for ``owner``'s record of ``n_bytes``: (span head, record offset), waiting as
        the module docstring says. Raises NoSpace."""
        if self._cut_laggards(n_bytes, owner):
            # Room is short and transfers that lag held some: wait for a handler to give
            # theirs back before evicting a value for want of it.
            self.space.wait(PIN_WAIT_S)
        started = time.monotonic()
        deadline, pins_deadline = started + wait_s, started + min(wait_s, PIN_WAIT_S)
        # Behind a cold tier a young span is clean, its values on disk: taking one costs a
        # promotion, never a value.
        waited_for_pins, young_ok = False, self.cold_backed
        while True:
            try:
                return self.claim(n_bytes, young_ok=young_ok, owner=owner)
            except NoSpace:
                now = time.monotonic()
                may_wait = (now < pins_deadline and n_bytes <= self.arena.size_bytes
                            and not self._pins_starved)
                if self.cold_backed and now < deadline and self.arena.has_dirty_unpinned():
                    self.space.notify_all()
                    self.space.wait(min(deadline - now, 0.05))
                elif not young_ok and not (may_wait and self._pins_hold_older(n_bytes, owner)):
                    young_ok = True                  # nothing to wait for: a young span, then
                elif may_wait:
                    waited_for_pins = True
                    # in slices: a holder that starts to lag meanwhile is cut off too
                    self._cut_laggards(n_bytes, owner)
                    if (not self.space.wait(min(pins_deadline - now, LAG_CHECK_S))
                            and time.monotonic() >= pins_deadline):
                        self.counters.pin_waits_expired += 1     # then a young span or NoSpace
                else:
                    self._pins_starved |= waited_for_pins        # and in vain
                    raise

    def _cut_laggards(self, n_bytes: int, owner: int = 0) -> int:
        """When ``n_bytes`` need a span and no free room is left, cut off the transfers into
        held room that lag (``transfers``); returns how many."""
        if (self.laggards is None or self.arena.fits_open(n_bytes, owner) is not None
                or self.arena.free_segments >= self.arena.span_of(n_bytes)):
            return 0
        return self.laggards.cut_laggards()

    def claim(self, n_bytes: int, *, use_reserve: bool = False, fresh: bool = True,
              young_ok: bool = True, owner: int = 0) -> tuple[Segment, int]:
        """Room for ``owner``'s ``n_bytes`` now, evicting as the rule says, then the second
        chances of what it evicted. ``fresh``: a client's value (a copy never takes a young
        span). ``use_reserve``: the demoter's re-appends may open the cleaner's reserve."""
        placed = self._claim_once(n_bytes, use_reserve=use_reserve, young_ok=fresh and young_ok,
                                  owner=owner)
        if self._rescued:
            head = placed[0]
            head.pins += 1          # the caller's record is not written yet: never reclaim it
            try:
                self._rescue()
            finally:
                head.pins -= 1
        return placed

    def _claim_once(self, n_bytes: int, *, use_reserve: bool = False,
                    young_ok: bool = True, owner: int = 0) -> tuple[Segment, int]:
        arena = self.arena
        if n_bytes > arena.size_bytes:
            raise NoSpace(f"{n_bytes} bytes exceed the arena's {arena.size_bytes}")
        placed = arena.allocate_open(n_bytes, owner)
        if placed is not None:
            return placed
        span = arena.span_of(n_bytes)
        if self.cold_backed and not use_reserve and arena.headroom_segments() <= span:
            raise NoSpace(f"{span} segment(s) needed; the last reusable one is the cleaner's")
        over, claimant_over = self._standing(owner, n_bytes)
        victim = choose_victim(arena.windows(span, clean_only=self.cold_backed,
                                             count_unreachable=not self.cold_backed,
                                             claimant=owner, over_quota=over),
                               young_ok=young_ok, claimant_over_quota=claimant_over)
        if victim is None:
            pinned, kept = arena.pinned_spans()
            raise NoSpace(f"no {span} unpinned consecutive segment(s) of {arena.segment_size} "
                          f"bytes to evict ({pinned} of {len(arena.segments)} spans pinned, "
                          f"{kept} holding pinned values"
                          f"{'' if young_ok else '; young ones spared'})")
        arena.seal_open(owner)       # only now: a refused claim keeps the open segment's room
        heads = arena.heads_in(victim.start, span)
        if not self.cold_backed:         # with a cold tier their values are on disk
            self.young_reclaims += any(arena.is_young(h) for h in heads)
        for head in heads:
            self._evict(head)
        return arena.claim(victim.start, n_bytes, owner)

    def _standing(self, owner: int, n_bytes: int) -> tuple[frozenset[int] | None, bool | None]:
        """The owners over their memory quota or without one (None: no quotas at all), and
        whether ``owner`` is at its own once it holds ``n_bytes`` more (None: it has none)."""
        if self.quotas is None:
            return None, None
        held, quota = self.arena.held, self.quotas.memory_quota
        over = frozenset(o for o, n in held.items() if n > quota(o))
        mine = quota(owner)
        return over, (held[owner] + n_bytes > mine) if mine else None

    def _pins_hold_older(self, n_bytes: int, owner: int = 0) -> bool:
        """Whether a window with no young span would be free for ``n_bytes`` but for pins: then
        a wait for a pin to drop may spare the young spans."""
        over, claimant_over = self._standing(owner, n_bytes)
        windows = self.arena.windows(self.arena.span_of(n_bytes), ignore_pins=True,
                                     clean_only=self.cold_backed, claimant=owner,
                                     over_quota=over)
        return choose_victim(windows, young_ok=False,
                             claimant_over_quota=claimant_over) is not None

    def _evict(self, head: Segment) -> None:
        """Forget a span's records before the arena frees it; without a cold tier, copy aside
        the values read since they were written (one-segment spans: a large value is not
        re-appended). In a clean span they are on disk or were re-appended by the demoter."""
        removed = self.index.forget_span(head)
        if not self.cold_backed:
            kept = self._read_since_written(removed) if head.span == 1 else []
            self._rescued.extend(kept)
            self._rescuing.update(rescued.key for rescued in kept)
            self.counters.evicted_objects += len(removed) - len(kept)
            self.evicted_by_owner[head.owner] += len(removed) - len(kept)
        self.counters.evicted_segments += 1
        self.arena.free(head)

    def _read_since_written(self, offsets: list[int]) -> list[Rescued]:
        """Copies of the records leased since they were written, in the order they were
        appended (so a parent comes before the values hanging from it)."""
        out, view = [], self.arena.view
        for offset in sorted(offsets):
            if record.is_read(view, offset):
                fields = record.read(view, offset)
                start = value_offset(offset, len(fields.key) + len(fields.parent))
                out.append(Rescued(fields.key, bytes(view[start:start + fields.length]),
                                   fields.checksum, fields.group, fields.parent))
        return out

    def _rescue(self) -> None:
        """Re-append the values copied aside, as far as ``rescue_bound`` allows (the rest is
        evicted after all). The new records are young and unread: one chance per read."""
        extra, most = 0, rescue_bound(len(self.arena.segments))
        while self._rescued:       # taken as placed: one segment's copies held at a time
            key, value, checksum, group, parent = self._rescued.popleft()
            self._rescuing[key] -= 1
            if self._rescuing[key] <= 0:
                del self._rescuing[key]
            reachable = self.reachable(parent_key(key, parent) if parent else b"")
            if not earns_second_chance(read=True, reachable=reachable):
                self.counters.unreachable_evicted += 1
                self.counters.evicted_objects += 1
                continue
            size = record_size(len(key) + len(parent), len(value))
            placed = self.arena.allocate_open(size, owner_of(key))
            if placed is None and extra < most:
                extra += 1
                try:
                    placed = self._claim_once(size, young_ok=False, owner=owner_of(key))
                except NoSpace:
                    placed = None
            if placed is None:
                self.counters.evicted_objects += 1
                continue
            head, offset = placed
            start = value_offset(offset, len(key) + len(parent))
            self.arena.view[start:start + len(value)] = value
            record.write(self.arena.view, offset, self.arena.secret,
                         state=record.STATE_COMMITTED, key=key, length=len(value),
                         checksum=checksum, seq=self.arena.next_record_seq(), group=group,
                         parent=parent)
            self.index.point(key, self.index.hash(key), offset, len(value), head)
            self.counters.second_chances += 1

    def reachable(self, parent: bytes) -> bool:
        """Whether a value hanging from ``parent`` (its internal key, ``parent_key``) may still
        hit here: it has none, or this server still holds the parent in memory (or is about to
        re-append it)."""
        return not parent or self.index.get(parent) >= 0 or parent in self._rescuing

    def unpin(self, head: Segment) -> None:
        """One pin of ``head`` let go; a claim may be waiting for the span to be reclaimable."""
        head.pins -= 1
        if head.pins == 0:
            self._pins_starved = False
            self.space.notify_all()

    # ---- the demoter's side (takes the lock itself) --------------------------------------------

    def claim_dirty(self, min_headroom: int) -> tuple[Segment, list[int]] | None:
        """When fewer than ``min_headroom`` segments are reusable, pin the oldest dirty span
        and return it with its live records; else None. Under the lock."""
        if self.arena.headroom_segments() >= min_headroom:
            return None
        head = self.arena.oldest_dirty()
        if head is None:
            return None
        head.pins += 1
        return head, self.index.find_span(head)

    def keep_read(self, live: list[Entry],
                  on_disk: Callable[[bytes], bool] | None = None) -> list[Entry]:
        """The demoter's second chances for a claimed span: re-append its values read since
        they were written; the rest, returned, go to disk, except values whose parent this
        server holds neither in memory nor (``on_disk``) in the cold tier: those can no longer
        hit and are let go with the span."""
        out = []
        for entry in live:
            parent = parent_key(entry.key, entry.parent) if entry.parent else b""
            with self.space:
                reachable = self.reachable(parent)
            if not reachable and on_disk is not None and on_disk(parent):
                reachable = True
            if not reachable:
                with self.space:
                    self.counters.unreachable_evicted += 1
                continue
            if not (earns_second_chance(read=entry.read, reachable=True)
                    and self.reappend(entry)):
                out.append(entry)
        return out

    def reappend(self, entry: Entry) -> bool:
        """Second chance: copy a read value to the log's head, where it is young again. False
        when no clean space is free for it (the caller demotes it instead)."""
        with self.space:
            hash_ = self.index.hash(entry.key)
            if self.index.get(entry.key, hash_) != entry.record:
                return True
            names_len = len(entry.key) + len(entry.parent)
            try:
                head, offset = self.claim(record_size(names_len, entry.length),
                                          use_reserve=True, fresh=False,
                                          owner=owner_of(entry.key))
            except NoSpace:
                return False
            view, start = self.arena.view, value_offset(offset, names_len)
            view[start:start + entry.length] = view[entry.value:entry.value + entry.length]
            record.write(view, offset, self.arena.secret, state=record.STATE_PENDING,
                         key=entry.key, length=entry.length, checksum=entry.checksum,
                         seq=self.arena.next_record_seq(), group=entry.group,
                         final_state=record.STATE_COMMITTED, pinned=entry.pinned,
                         parent=entry.parent)
            record.commit_state(view, offset)
            self.index.point(entry.key, hash_, offset, entry.length, head)
            self.counters.second_chances += 1
            return True

    def settle(self, head: Segment, *, demoted: int) -> None:
        """Unpin a claimed span and mark it clean: its space may now be reused."""
        with self.space:
            self.unpin(head)
            head.clean = True
            self.counters.demoted_objects += demoted
            self.space.notify_all()

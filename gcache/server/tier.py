"""The hot tier: the index of committed values over the arena, leases and writes in flight.

Invariants (all under ``_lock``; value bytes are copied outside it, protected by pins):
- A key is in the index only after COMMIT checked its xxh3_64 checksum; a write that fails,
  is abandoned or mismatches is never visible.
- Every lease and every pending write pins its span; pins are dropped on RELEASE / COMMIT /
  abort, or by ``reap_expired`` once ``lease_ttl_s`` has passed, so a dead client cannot pin
  memory for longer than that. A pending write whose bytes are being received when its TTL
  passes is not dropped under the receive (the bytes would land in reused memory): it is marked
  expired, refuses further writes and its COMMIT, and is dropped when that receive ends, which
  the connection's transfer deadline bounds. Pins the server takes for its own single-frame
  transfers (GET, PUT, batches) do not expire: the handler drops them itself, and a stalled or
  trickling peer is cut off by the connection's transfer deadline, so a 1 GiB transfer at a
  useful rate is never evicted from under itself.
- Replacing or deleting a key leaves the old record's bytes in place until its span is evicted,
  so a reader holding a lease on the old value still reads intact bytes.

Eviction is the arena's (oldest unpinned span). With a cold tier the demoter empties a span
first (``tiered``); without one, ``_evicted`` and ``_rescue`` give each value read since it was
written a second chance, re-appended at the young end.

A value may name its parent (``FLAG_PARENT``: the object it is of no use without, a KV page's
previous page); the record keeps it. A read value whose parent this server no longer holds gets
no second chance (nor, behind a cold tier, a demotion: ``keep_read``), and
``sweep_unreachable`` counts such values in the background, per span too, so the arena can
reclaim a span mostly made of them first.

A value put pinned (a file's part: ``FLAG_PINNED``) holds its span against eviction and demotion
while it is current (``Segment.held``); the spans holding pinned values are bounded by
``pin_budget_bytes``, past which a pinned put is NoSpace, so KV traffic always keeps the rest of
the arena. The pin is the record header's ``PINNED_BIT``: a restart finds it again.
``pinned_keys`` lists them (a file store's ``ls``). A held span is not moved: KV values that
share it stay with it.

The index is a ``RecordTable`` (key hash -> record offset, 16 bytes a slot); everything else
about a value is read from its record's header when needed (``Entry``).
"""

from __future__ import annotations

import collections
import enum
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gcache.errors import ChecksumMismatch, InvalidRequest, NoSpace
from gcache.keys import Hasher, checksum, checksum_stream
from gcache.server.arena import (
    ARENA_DIR,
    READ_BIT,
    RECORD,
    STATE_COMMITTED,
    STATE_PENDING,
    STATE_SUPERSEDED,
    STATE_TOMBSTONE,
    Arena,
    Segment,
    parent_len,
    record_size,
    value_offset,
)
from gcache.server.record_table import RecordTable
from gcache.server.recovery import scan

log = logging.getLogger(__name__)

ALLOC_WAIT_S = 2.0       # longest an allocation waits for the demoter before NoSpace
# Longest an allocation waits for a pin to drop when every span is pinned. Most pins are
# transfers in flight or a dead peer's, let go within milliseconds; refusing at once failed
# puts in a row while peers that die holding allocations held the last spans (the fault suite's
# hostile-peers scenario). A pin that holds on longer is met with NoSpace, not a stall; and
# once a wait has run out, allocations refuse at once until some span is unpinned (a batch of
# a thousand ALLOCs into a pinned arena must not take a thousand waits).
PIN_WAIT_S = 0.25
PUT_MANY_STRIDE = 64     # values ``put_many`` stores per hold of the lock
# Segments one allocation may reclaim more to re-append read values (a CLOCK hand's sweep, cut
# short): each re-append answers one earlier read, so the work is bounded by reads over time;
# the bound caps one allocation's stall (16 x 16 MiB of copies at most). With 2 the demo's
# cluster fell 4 points behind the model, which never runs out of room; with 16, 0.15.
RESCUE_SEGMENTS = 16
# ... and at most this fraction of the arena's segments: a sweep's copies are writes too, and
# in a small arena where everything is read a few full sweeps in a row turned the whole arena
# over within a millisecond, evicting a value before its writer could read it back (the fault
# suite's 8-segment arena). The demo's and the replay's arenas have 256 segments or more.
RESCUE_FRACTION = 16


class Rescued(NamedTuple):
    """A value an eviction copied aside for a second chance (``_rescue``)."""

    key: bytes
    value: bytes
    checksum: int
    group: int
    parent: bytes


class Copied(NamedTuple):
    """A value ``read_many`` copied out of the arena."""

    value: bytes
    checksum: int


class Stored(enum.Enum):
    """What became of one value of ``put_many``."""

    OK = "ok"
    MISMATCH = "checksum_mismatch"      # its bytes do not hash to the writer's checksum
    NO_SPACE = "no_space"


@dataclass(slots=True)
class Entry:
    """A value's record as the tier found it (the index keeps only the record's offset; this
    is read from the record's header when a caller needs it)."""

    key: bytes
    record: int        # absolute offset of the record header
    value: int         # absolute offset of the value
    length: int        # value bytes
    checksum: int      # xxh3_64 of the value
    head: Segment      # span holding the record
    read: bool = False  # leased since it was (re-)appended: earns a second chance
    group: int = 0     # xxh3_64 of the placement group it was put with; 0 for none
    pinned: bool = False  # put pinned: its span is held in memory while it is current
    parent: bytes = b""  # the key it hangs from (``FLAG_PARENT``); b"" for none


@dataclass(slots=True)
class Pin:
    entry: Entry
    expires_s: float           # time.monotonic() deadline
    pending: bool              # a write in flight (True) or a read lease (False)
    hasher: Hasher | None = None   # running xxh3 of in-order writes; None once order is lost
    hashed: int = 0            # bytes covered (or claimed) by ``hasher``
    hashing: bool = False      # a write feeding ``hasher`` is in flight
    writers: int = 0           # receives into the extent in progress (``write_target`` taken)
    expired: bool = False      # the TTL passed during a receive: dropped when it ends


@dataclass(slots=True)
class TierCounters:
    hits: int = 0
    misses: int = 0
    puts: int = 0
    deletes: int = 0
    checksum_failures: int = 0
    evicted_objects: int = 0
    evicted_segments: int = 0
    expired_pins: int = 0
    recovered_objects: int = 0
    demoted_objects: int = 0       # written to the cold tier on their way out of memory
    promoted_objects: int = 0      # read back from the cold tier into memory
    second_chances: int = 0        # re-appended instead of demoted, because they were read
    # read values that got no second chance because this server no longer held their parent
    # (nothing below a missing page of a prefix can hit)
    unreachable_evicted: int = 0
    whole_hashes: int = 0          # commits that hashed the whole value at COMMIT (its pieces
                                   # were not announced in order as they landed)
    pin_waits_expired: int = 0     # allocations whose wait for an older span's pins ran out
                                   # (they took a young span or were refused)


class HotTier:
    def __init__(self, *, name: str, size_bytes: int, segment_size: int, prefault: bool,
                 lease_ttl_s: float, cold_backed: bool = False,
                 arena_dir: str = ARENA_DIR, pin_budget_bytes: int = 0) -> None:
        self._lock = threading.Lock()
        # Signalled whenever space may have become reusable; a demoter waits on it too.
        self.space = threading.Condition(self._lock)
        self.cold_backed = cold_backed
        self.on_commit: Callable[[bytes], object] | None = None   # after a client's commit
        self.arena = Arena(name=name, size_bytes=size_bytes, segment_size=segment_size,
                           prefault=prefault, on_evict=self._evicted, directory=arena_dir)
        self.arena.require_clean = cold_backed
        # key -> its committed record; the bytes of the values it names kept as a running sum,
        # so STAT (every ``gcache.kv`` pressure reading) never walks the index under the lock
        self._index = RecordTable(self.arena.holds_key)
        self._value_bytes = 0
        # values an eviction copied aside for a second chance, until ``_rescue`` places them,
        # and how many of each key are in that queue (a parent waiting there is still held)
        self._rescued: deque[Rescued] = deque()
        self._rescuing: collections.Counter[bytes] = collections.Counter()
        # a value with a parent was stored (or recovered): ``sweep_unreachable`` has work
        self._parents_seen = False
        self._unreachable = (0, 0)      # objects and bytes the last sweep found unreachable
        self._pins: dict[int, Pin] = {}
        self._pins_starved = False      # a wait for a pin ran out; none unpinned since
        # key -> record of the current pinned values; the spans they hold, in segments
        self._pinned: dict[bytes, int] = {}
        self._held_segments = 0
        self.pin_budget_bytes = pin_budget_bytes
        self._handles = itertools.count(1)
        self.lease_ttl_s = lease_ttl_s
        self.counters = TierCounters()
        if self.arena.attached:
            self._recover()

    def _recover(self) -> None:
        found = scan(self.arena, self._index)
        self.arena.restore(found.spans, found.max_seq)
        self._value_bytes = found.value_bytes
        self.counters.recovered_objects = found.objects
        self._parents_seen = found.parents
        self.counters.checksum_failures += found.dropped_corrupt + found.dropped_headers
        for record in found.pinned:
            self._hold(self.arena.read_record(record).key, record, self.arena.segment_of(record))
        log.info("tier.recovered objects=%d spans=%d corrupt=%d bad_headers=%d uncommitted=%d",
                 found.objects, len(found.spans), found.dropped_corrupt,
                 found.dropped_headers, found.dropped_pending)

    # ---- writes -----------------------------------------------------------------------------

    def alloc(self, key: bytes, length: int, *, expires: bool = True,
              wait_s: float = ALLOC_WAIT_S, group: int = 0,
              pinned: bool = False, parent: bytes = b"") -> tuple[int, int, memoryview]:
        """Reserve space for ``key``; returns a write handle, the value's arena offset and its
        memory.

        ``expires=False`` is for a write the server itself drives to the end (a PUT frame): its
        connection's IO timeout bounds it, not the TTL. ``pinned``: once committed, the value
        holds its span in memory (within the pin budget). ``parent``: the key this one's use
        depends on (``FLAG_PARENT``). Raises NoSpace (every candidate span pinned, or the pin
        budget spent).
        """
        with self._lock:
            size = record_size(len(key) + len(parent), length)
            if pinned:
                self._check_pin_budget(size)
            head, record = self._allocate(size, wait_s)
            if pinned:                  # counted from now: writes in flight at once see it
                self._count_hold(head)
            self._parents_seen = self._parents_seen or bool(parent)
            entry = Entry(key, record, value_offset(record, len(key) + len(parent)), length, 0,
                          head, group=group, pinned=pinned, parent=parent)
            self.arena.write_record_header(record, state=STATE_PENDING, key=key, length=length,
                                           checksum=0, seq=self.arena.next_record_seq(),
                                           group=group, pinned=pinned, parent=parent)
            handle = self._pin(entry, pending=True, expires=expires)
            self._pins[handle].hasher = checksum_stream()
            return handle, entry.value, self.arena.view[entry.value:entry.value + length]

    def write_target(self, handle: int, offset: int,
                     n_bytes: int) -> tuple[memoryview, Hasher | None]:
        """The slice of a pending write's extent at ``offset``, and a hasher to feed while
        receiving into it when this write continues the in-order stream (else None; COMMIT then
        hashes the whole value). Call ``write_done`` after. Raises InvalidRequest.
        """
        with self._lock:
            pin = self._pins.get(handle)
            if pin is None or not pin.pending or pin.expired:
                raise InvalidRequest(f"handle {handle} is not a write in flight")
            entry = pin.entry
            if offset + n_bytes > entry.length:
                raise InvalidRequest(f"write of {n_bytes} bytes at offset {offset} overruns the "
                                     f"{entry.length}-byte extent")
            hasher = None
            if pin.hasher is not None and offset == pin.hashed and not pin.hashing:
                hasher, pin.hashed, pin.hashing = pin.hasher, offset + n_bytes, True
            else:
                pin.hasher = None                  # out of order or concurrent: hash at COMMIT
            pin.writers += 1
        return self.arena.view[entry.value + offset:entry.value + offset + n_bytes], hasher

    def write_done(self, handle: int) -> bool:
        """End a ``write_target``; False when the write's TTL passed meanwhile (it is dropped
        now, and the bytes just received count for nothing)."""
        with self._lock:
            pin = self._pins.get(handle)
            if pin is None:
                return False
            pin.hashing = False
            pin.writers -= 1
            if not pin.expired:
                return True
            if self._drop_pin(handle, pin):
                self.counters.expired_pins += 1
            return False

    def commit(self, handle: int, expected: int, *, if_absent: bool = False,
               unless: Callable[[], bool] | None = None) -> bool:
        """Make a pending write visible if its bytes match ``expected`` (xxh3_64). With
        ``if_absent`` (a promotion) a key committed meanwhile wins and this write is dropped:
        returns False; so it is when ``unless()``, asked under the lock, is true (the key was
        deleted while its promotion read the disk).

        Raises InvalidRequest for an unknown handle, ChecksumMismatch (the write is dropped).
        """
        with self._lock:
            pin = self._pins.pop(handle, None)
            if pin is None or not pin.pending or pin.expired or pin.writers:
                if pin is not None:
                    self._pins[handle] = pin
                raise InvalidRequest(f"handle {handle} is not a write in flight")
        entry = pin.entry
        streamed = pin.hasher is not None and pin.hashed == entry.length and not pin.hashing
        if streamed:
            assert pin.hasher is not None          # ``streamed`` tested it
            actual = pin.hasher.intdigest()
        else:
            actual = checksum(self.arena.view[entry.value:entry.value + entry.length])
        with self._lock:
            self._unpin(entry.head)
            if entry.pinned:            # ALLOC's count; ``_point`` counts a committed one
                self._release_hold(entry.head)
            self.counters.whole_hashes += not streamed
            if actual != expected:
                self.counters.checksum_failures += 1
                raise ChecksumMismatch(f"value of {entry.length} bytes hashes to {actual:#x}, "
                                       f"COMMIT said {expected:#x}")
            hash_ = self._index.hash(entry.key)
            if if_absent and (self._index.get(entry.key, hash_) >= 0
                              or (unless is not None and unless())):
                return False
            entry.checksum = actual
            self.arena.write_record_header(entry.record, state=STATE_PENDING, key=entry.key,
                                           length=entry.length, checksum=actual,
                                           seq=self.arena.next_record_seq(), group=entry.group,
                                           final_state=STATE_COMMITTED, pinned=entry.pinned,
                                           parent=entry.parent)
            self.arena.set_record_state(entry.record, STATE_COMMITTED)
            self._point(entry.key, hash_, entry.record, entry.length, entry.head,
                        pinned=entry.pinned)
            if not if_absent:                     # a promotion is a copy, not a fresh write
                self.arena.mark_committed(entry.head, entry.length)
            self.counters.puts += 1
        if self.on_commit is not None and not if_absent:
            self.on_commit(entry.key)
        return True

    def put_many(self, values: Sequence[tuple[bytes, memoryview, int]], *,
                 group: int = 0, pinned: bool = False,
                 parents: Sequence[bytes] | None = None) -> list[Stored]:
        """Store small values the server holds whole already (a BATCH_PUT's payload): each
        (key, bytes, xxh3_64 the writer sent). Hashed before any lock is taken; then each
        goes into the arena with its header written once, straight as COMMITTED, after its
        bytes (a crash in between leaves a header that fails its check, never a visible
        record): a third of the per-key work of ALLOC, WRITE and COMMIT. The lock is let go
        every ``PUT_MANY_STRIDE`` values, so a large batch never holds up other readers for
        long. ``pinned`` as for ``alloc``, ``parents`` (one per value) as ``alloc``'s
        ``parent``. Returns one ``Stored`` per value, in order."""
        out = [Stored.OK if checksum(value) == expected else Stored.MISMATCH
               for _, value, expected in values]
        committed: list[bytes] = []
        wait_s = ALLOC_WAIT_S                  # once: after a refusal the rest would wait too
        for first in range(0, len(values), PUT_MANY_STRIDE):
            with self._lock:
                for i in range(first, min(len(values), first + PUT_MANY_STRIDE)):
                    if out[i] is Stored.MISMATCH:
                        self.counters.checksum_failures += 1
                        continue
                    key, value, expected = values[i]
                    if not self._store_whole(key, value, expected, group, wait_s, pinned,
                                             parents[i] if parents else b""):
                        out[i], wait_s = Stored.NO_SPACE, 0.0
                        continue
                    committed.append(key)
        if self.on_commit is not None:
            for key in committed:
                self.on_commit(key)
        return out

    def _store_whole(self, key: bytes, value: memoryview, checksum_: int, group: int,
                     wait_s: float, pinned: bool, parent: bytes) -> bool:
        """One ``put_many`` value, under ``_lock``; False when there is no room."""
        size = record_size(len(key) + len(parent), len(value))
        try:
            if pinned:
                self._check_pin_budget(size)
            head, record = self._allocate(size, wait_s)
        except NoSpace as exc:
            if pinned:
                log.warning("put.refused pinned=1 bytes=%d reason=%s", len(value), exc)
            return False
        self._write_committed(key, value, checksum_, group, head, record, pinned=pinned,
                              parent=parent)
        self.arena.mark_committed(head, len(value))
        self.counters.puts += 1
        return True

    def _write_committed(self, key: bytes, value: bytes | memoryview, checksum_: int,
                         group: int, head: Segment, record: int, *,
                         pinned: bool = False, parent: bytes = b"") -> None:
        """A whole value into its allocated record, the header written once, straight as
        COMMITTED, after the bytes (a crash in between leaves a header that fails its check),
        and made ``key``'s (under ``_lock``)."""
        start = value_offset(record, len(key) + len(parent))
        self.arena.view[start:start + len(value)] = value
        self._parents_seen = self._parents_seen or bool(parent)
        self.arena.write_record_header(record, state=STATE_COMMITTED, key=key,
                                       length=len(value), checksum=checksum_,
                                       seq=self.arena.next_record_seq(), group=group,
                                       pinned=pinned, parent=parent)
        self._point(key, self._index.hash(key), record, len(value), head, pinned=pinned)

    def abort(self, handle: int) -> None:
        """Drop a pending write (its bytes stay unreachable until the span is evicted)."""
        with self._lock:
            pin = self._pins.get(handle)
            if pin is not None and pin.pending:
                self._drop_pin(handle, pin)

    # ---- reads ------------------------------------------------------------------------------

    def lease(self, key: bytes, *, expires: bool = True) -> tuple[int, Entry, memoryview] | None:
        """Pin ``key``'s value for reading; None when absent. ``expires=False`` as for alloc."""
        with self._lock:
            record = self._index.get(key)
            if record < 0:
                self.counters.misses += 1
                return None
            self.counters.hits += 1
            self.arena.mark_read(record)
            entry = self._entry_at(record)
            handle = self._pin(entry, pending=False, expires=expires)
        return handle, entry, self.arena.view[entry.value:entry.value + entry.length]

    def read_many(self, keys: Sequence[bytes], *, budget_bytes: int,
                  absent_left: bool = False) -> tuple[list[Copied | None], list[int]]:
        """Copies of small values, for a BATCH_GET: taken under the lock, so they need no
        lease (no pin, no handle, nothing to release); the lock is let go every
        ``PUT_MANY_STRIDE`` keys. Values past ``budget_bytes`` in all are not copied: their
        positions come back in the second list, for the caller to lease (a copy under the
        lock must stay short). None: absent (a miss), or with ``absent_left`` left in that
        list uncounted too (a cold tier may hold it)."""
        copies: list[Copied | None] = []
        left: list[int] = []
        view = self.arena.view
        for first in range(0, len(keys), PUT_MANY_STRIDE):
            with self._lock:
                for i in range(first, min(len(keys), first + PUT_MANY_STRIDE)):
                    record = self._index.get(keys[i])
                    if record < 0:
                        copies.append(None)
                        if absent_left:
                            left.append(i)
                        else:
                            self.counters.misses += 1
                        continue
                    _, _, read, key_len, length, checksum_, *_ = RECORD.unpack_from(view,
                                                                                    record)
                    if length > budget_bytes:
                        copies.append(None)
                        left.append(i)
                        continue
                    budget_bytes -= length
                    self.counters.hits += 1
                    self.arena.mark_read(record)
                    start = value_offset(record, key_len + parent_len(read))
                    copies.append(Copied(bytes(view[start:start + length]), checksum_))
        return copies, left

    def leased(self, handle: int) -> Entry:
        """The entry a read lease pins. Raises InvalidRequest for an unknown handle."""
        with self._lock:
            pin = self._pins.get(handle)
            if pin is None or pin.pending:
                raise InvalidRequest(f"handle {handle} is not a read lease")
            return pin.entry

    def read_view(self, entry: Entry, offset: int, length: int) -> memoryview:
        """``length`` bytes of a leased entry's value from ``offset`` (no copy; valid while
        the lease is held). Raises InvalidRequest when the range leaves the value: the slice
        would show another record's bytes."""
        if offset < 0 or length < 0 or offset + length > entry.length:
            raise InvalidRequest(f"read of {length} bytes at offset {offset} overruns the "
                                 f"{entry.length}-byte value")
        return self.arena.view[entry.value + offset:entry.value + offset + length]

    def release(self, handle: int) -> bool:
        with self._lock:
            pin = self._pins.get(handle)
            if pin is None or pin.pending:
                return False
            del self._pins[handle]
            self._unpin(pin.entry.head)
            return True

    def exists(self, key: bytes) -> bool:
        with self._lock:
            return self._index.get(key) >= 0

    def entry(self, key: bytes) -> Entry | None:
        """``key``'s committed record as it stands now, or None (for inspection: a reader
        holds a lease instead)."""
        with self._lock:
            record = self._index.get(key)
            return None if record < 0 else self._entry_at(record)

    def delete(self, key: bytes) -> bool:
        """Forget ``key``; TOMBSTONE records keep it forgotten across a restart. There are two,
        in one allocation, so that one flipped byte cannot bring the deleted value back."""
        with self._lock:
            record = self._index.remove(key)
            if record < 0:
                return False
            self._unhold(key)
            self.counters.deletes += 1
            self._value_bytes -= self.arena.record_length(record)
            # on its own enough for a restart to skip it
            self.arena.set_record_state(record, STATE_SUPERSEDED)
            one = record_size(len(key), 0)
            try:
                # Never waits: a wait lets go of the lock, and a put of the key committed
                # meanwhile would get an older sequence number than these tombstones.
                _, record = self._arena_allocate(2 * one)
            except NoSpace:
                log.warning("tier.tombstone_lost reason=no_space key_bytes=%d", len(key))
                return True
            for offset in (record, record + one):
                self.arena.write_record_header(offset, state=STATE_TOMBSTONE, key=key,
                                               length=0, checksum=0,
                                               seq=self.arena.next_record_seq())
            return True

    # ---- upkeep -----------------------------------------------------------------------------

    def reap_expired(self, now_s: float | None = None) -> int:
        """Drop pins whose TTL passed; returns how many."""
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            expired = [h for h, pin in self._pins.items()
                       if pin.expires_s <= now_s and not pin.expired]
            for handle in expired:
                if self._drop_pin(handle, self._pins[handle]):
                    self.counters.expired_pins += 1
        return len(expired)

    def stats(self) -> dict[str, int]:
        with self._lock:
            out = {"objects": len(self._index), "bytes": self._value_bytes,
                   "capacity_bytes": self.arena.size_bytes, "used_bytes": self.arena.used_bytes,
                   "segments": len(self.arena.segments), "pins": len(self._pins),
                   "pinned_objects": len(self._pinned),
                   "pinned_bytes": self._held_segments * self.arena.segment_size,
                   "pin_budget_bytes": self.pin_budget_bytes,
                   "young_spans_reclaimed": self.arena.young_reclaims}
            out["unreachable_objects"], out["unreachable_bytes"] = self._unreachable
            out.update({k: getattr(self.counters, k) for k in TierCounters.__slots__})
            return out

    def tier_stats(self) -> None:
        """None: this tier is all there is (``tiered.TieredStore`` has counters per tier)."""

    def close(self, *, unlink: bool) -> None:
        self.arena.close(unlink=unlink)

    def _drop_pin(self, handle: int, pin: Pin) -> bool:
        """Unpin ``handle`` now (True), or, while a receive is writing into its extent, mark it
        expired for ``write_done`` to drop when the receive ends (False). Under ``_lock``."""
        if pin.writers:
            pin.expired = True
            return False
        del self._pins[handle]
        self._unpin(pin.entry.head)
        if pin.pending and pin.entry.pinned:
            self._release_hold(pin.entry.head)
        return True

    def _unpin(self, head: Segment) -> None:
        """One pin of ``head`` let go (under ``_lock``); an allocation may be waiting for the
        span to become reclaimable."""
        head.pins -= 1
        if head.pins == 0:
            self._pins_starved = False
            self.space.notify_all()

    def _point(self, key: bytes, hash_: int, record: int, length: int, head: Segment, *,
               pinned: bool = False) -> None:
        """Make ``record`` (in the span ``head``) ``key``'s value, and mark the record it
        replaces (under ``_lock``). The index always points at live records: eviction removes
        a span's before the span is reused."""
        old = self._index.put(key, record, hash_)
        if old >= 0:
            self._value_bytes -= self.arena.record_length(old)
            self.arena.set_record_state(old, STATE_SUPERSEDED)
            self._unhold(key)
        if pinned:
            self._hold(key, record, head)
        self._value_bytes += length
        head.hashes.append(hash_)

    # ---- pinned values ----------------------------------------------------------------------

    def _check_pin_budget(self, n_bytes: int) -> None:
        """Raise NoSpace when a pinned record of ``n_bytes`` could take the spans holding
        pinned values past the budget (under ``_lock``). Counted in whole spans, the memory a
        held span keeps from eviction: into the open segment, already held, it costs none.
        A pinned write counts from its ALLOC (``_count_hold``), so writes in flight at once
        cannot each pass the check."""
        open_ = self.arena.fits_open(n_bytes)
        if open_ is not None and open_.held:
            return
        span = self.arena.span_of(n_bytes)
        if (self._held_segments + span) * self.arena.segment_size > self.pin_budget_bytes:
            raise NoSpace(f"the pin budget of {self.pin_budget_bytes} bytes is spent: "
                          f"{self._held_segments} segment(s) of {self.arena.segment_size} "
                          f"bytes hold pinned values, and this one needs {span} more")

    def _hold(self, key: bytes, record: int, head: Segment) -> None:
        self._pinned[key] = record
        self._count_hold(head)

    def _unhold(self, key: bytes) -> None:
        """``key``'s pinned record (if it had one) is no longer current: its span may go."""
        record = self._pinned.pop(key, None)
        if record is not None:
            self._release_hold(self.arena.segment_of(record))

    def _count_hold(self, head: Segment) -> None:
        """One more pinned value (or pinned write in flight) in ``head``'s span."""
        head.held += 1
        if head.held == 1:
            self._held_segments += head.span

    def _release_hold(self, head: Segment) -> None:
        head.held -= 1
        if head.held == 0:
            self._held_segments -= head.span
            self.space.notify_all()

    def pinned_keys(self, prefix: bytes, *, after: bytes = b"", limit: int) -> list[bytes]:
        """The pinned keys starting with ``prefix`` and sorting after ``after``, in order, at
        most ``limit`` (a page of a listing)."""
        with self._lock:
            found = [k for k in self._pinned if k.startswith(prefix) and k > after]
        found.sort()
        return found[:limit]

    def _entry_at(self, record: int) -> Entry:
        view = self.arena.view
        _, _, read, key_len, length, checksum_, _, group, _ = RECORD.unpack_from(view, record)
        start, names_len = record + RECORD.size, key_len + parent_len(read)
        return Entry(bytes(view[start:start + key_len]), record,
                     value_offset(record, names_len), length, checksum_,
                     self.arena.segment_of(record), bool(read & READ_BIT), group,
                     self.arena.is_pinned(record), bytes(view[start + key_len:start + names_len]))

    def _span_bytes(self, head: Segment) -> tuple[int, int]:
        start = head.index * self.arena.segment_size
        return start, start + head.span * self.arena.segment_size

    def _pin(self, entry: Entry, *, pending: bool, expires: bool = True) -> int:
        handle = next(self._handles)
        entry.head.pins += 1
        deadline = time.monotonic() + self.lease_ttl_s if expires else math.inf
        self._pins[handle] = Pin(entry, deadline, pending)
        return handle

    def _allocate(self, n_bytes: int, wait_s: float) -> tuple[Segment, int]:
        """``arena.allocate`` under ``_lock``; with a cold tier, waits up to ``wait_s`` for
        the demoter to clean a span instead of dropping live data. When nothing is left to
        clean (every span pinned, say by the leases of one huge batch), waits up to
        ``PIN_WAIT_S`` of ``wait_s`` for a pin to drop.

        Without a cold tier, a young span (``Arena.is_young``: a client wrote into it moments
        ago, and may be about to read it back) is taken only when the wait for a pin on an
        older one ran out, or when no pin stands between this allocation and an older span:
        with the older spans pinned by peers that hold leases and allocations, two claims
        within a millisecond took the segment of a value acknowledged just before, not yet
        read (the fault suite's hostile-peers scenario, about 1 run in 40 beside the SGLang
        suite)."""
        started = time.monotonic()
        deadline, pins_deadline = started + wait_s, started + min(wait_s, PIN_WAIT_S)
        # With one, only clean spans are reused and their values are on disk: a young one
        # costs a promotion, not a value. Sparing them, a promotion waited on the demoter
        # (resting: enough spans were clean, young ones) until it ran out of time.
        waited_for_pins, young_ok = False, self.cold_backed
        while True:
            try:
                return self._arena_allocate(n_bytes, young_ok=young_ok)
            except NoSpace:
                now = time.monotonic()
                may_wait = (now < pins_deadline and n_bytes <= self.arena.size_bytes
                            and not self._pins_starved)
                if self.cold_backed and now < deadline and self.arena.has_dirty_unpinned():
                    self.space.notify_all()
                    self.space.wait(min(deadline - now, 0.05))
                elif not young_ok and not (may_wait and self.arena.pins_hold_older(n_bytes)):
                    young_ok = True                  # nothing to wait for: a young span, then
                elif may_wait:
                    waited_for_pins = True
                    if not self.space.wait(pins_deadline - now):
                        self.counters.pin_waits_expired += 1     # then a young span or NoSpace
                else:
                    self._pins_starved |= waited_for_pins        # and in vain
                    raise

    def _arena_allocate(self, n_bytes: int, *, use_reserve: bool = False,
                        fresh: bool = True, young_ok: bool = True) -> tuple[Segment, int]:
        """``arena.allocate`` (under ``_lock``), then the second chances of what it evicted.
        ``fresh``: a client's value (not a copy)."""
        placed = self.arena.allocate(n_bytes, use_reserve=use_reserve, fresh=fresh,
                                     young_ok=young_ok)
        if self._rescued:
            head = placed[0]
            head.pins += 1          # the caller's record is not written yet: never reclaim it
            try:
                self._rescue()
            finally:
                head.pins -= 1
        return placed

    def _rescue(self) -> None:
        """Re-append the values an eviction kept aside (read since they were written) after
        the record that needed the room, in the reopened segment and, when that is full, in
        up to ``RESCUE_SEGMENTS`` more reclaimed for them (their own read values join the
        queue): so a read value moves to the young end and the oldest unread ones go in its
        place, as far as that bound allows (the rest is evicted after all). The new records
        are young and unread: a value earns one chance per read.

        The sweep reclaims at most 1/``RESCUE_FRACTION`` of the arena and never a young span
        (``Arena.is_young``): when nearly everything has been read, each re-appended segment
        reclaims another, and in a small arena a sweep of ``RESCUE_SEGMENTS`` wrapped around
        to a value acknowledged a moment before."""
        extra, most = 0, min(RESCUE_SEGMENTS, max(1, len(self.arena.segments) // RESCUE_FRACTION))
        while self._rescued:       # taken as placed: one segment's copies held at a time
            key, value, checksum_, group, parent = self._rescued.popleft()
            self._rescuing[key] -= 1
            if self._rescuing[key] <= 0:
                del self._rescuing[key]
            if not self._reachable(parent):
                # Its parent went in this eviction (unread) or earlier: nothing below a
                # missing page of a prefix can hit, so its room goes to values that can.
                self.counters.unreachable_evicted += 1
                self.counters.evicted_objects += 1
                continue
            size = record_size(len(key) + len(parent), len(value))
            placed = self.arena.allocate_open(size)
            if placed is None and extra < most:
                extra += 1
                try:
                    placed = self.arena.allocate(size, fresh=False)
                except NoSpace:
                    placed = None
            if placed is None:
                self.counters.evicted_objects += 1
                continue
            self._write_committed(key, value, checksum_, group, *placed, parent=parent)
            self.counters.second_chances += 1

    def _evicted(self, head: Segment) -> None:
        """Arena callback under ``_lock``: forget the records of a span about to be reused.
        In a clean span they are on disk or were re-appended by the demoter. Without a cold
        tier, the values read since they were written are copied aside for a second chance
        (``_rescue``, once the span is reused): a hit refreshes a sequence's prefix, so a head
        that requests keep reading stays while the pages nobody came back for go (a prefix
        store that evicts by age alone drops the shared heads first, and with them the
        reach of every page below)."""
        start, end = self._span_bytes(head)
        removed = self._index.remove_in(dict.fromkeys(head.hashes), start, end)
        self._value_bytes -= self.arena.sum_lengths(removed)
        if not self.cold_backed:
            kept = self._read_since_written(removed) if head.span == 1 else []
            self._rescued.extend(kept)
            self._rescuing.update(rescued.key for rescued in kept)
            self.counters.evicted_objects += len(removed) - len(kept)
        self.counters.evicted_segments += 1

    def _read_since_written(self, records: list[int]) -> list[Rescued]:
        """The records leased since they were written, in the order they were appended (so a
        parent comes before the values hanging from it, as a sequence's save wrote them)."""
        out, view = [], self.arena.view
        for record in sorted(records):
            _, _, read, key_len, length, checksum_, _, group, _ = RECORD.unpack_from(view, record)
            if read & READ_BIT:
                start, names_len = record + RECORD.size, key_len + parent_len(read)
                value = value_offset(record, names_len)
                out.append(Rescued(bytes(view[start:start + key_len]),
                                   bytes(view[value:value + length]), checksum_, group,
                                   bytes(view[start + key_len:start + names_len])))
        return out

    def _reachable(self, parent: bytes) -> bool:
        """Whether a value hanging from ``parent`` may still hit here: it has none, or this
        server still holds the parent in memory (or about to re-append it). Under ``_lock``."""
        return not parent or self._index.get(parent) >= 0 or parent in self._rescuing

    def sweep_unreachable(self, on_disk: Callable[[bytes], bool] | None = None) -> None:
        """Count the values in memory that can no longer hit (STAT's ``unreachable_objects``
        and ``unreachable_bytes``): those with a parent, or a parent's parent, that this server
        holds neither in memory nor (``on_disk``) in the cold tier. A parent held on disk only
        ends the walk up (its own parent is not looked up there). Run in the background every
        few seconds (``ServerConfig.unreachable_sweep_s``), never per request: it reads every
        record with a parent, ``PUT_MANY_STRIDE * 64`` at a time under the lock; nothing at
        all until a value with a parent was stored."""
        if not self._parents_seen:
            return
        with self._lock:
            records = self._index.records()
        whole: dict[bytes, bool] = {}        # parent key -> whether it and its own are held
        objects = total = 0
        by_span: collections.Counter[tuple[int, int]] = collections.Counter()  # (index, age)
        stride = PUT_MANY_STRIDE * 64
        for first in range(0, len(records), stride):
            with self._lock:
                # a record evicted since the snapshot may lie under another span's bytes now:
                # only one the index still points at is read
                found = [(parent, self.arena.record_length(r), head.index, head.seq)
                         for r in records[first:first + stride]
                         for parent in (self.arena.parent_of(r),)
                         if parent and self._index.get(self.arena.key_of(r)) == r
                         for head in (self.arena.segment_of(r),)]
            for parent, length, index, age in found:
                if not self._held_through(parent, whole, on_disk):
                    objects, total = objects + 1, total + length
                    by_span[index, age] += length
        with self._lock:
            self._unreachable = (objects, total)
            for index in self.arena.counted_spans:
                self.arena.segments[index].unreachable = 0
            counted = []
            for (index, age), n_bytes in by_span.items():
                head = self.arena.segments[index]
                if head.head == index and head.seq == age:    # not reclaimed since
                    head.unreachable = n_bytes
                    counted.append(index)
            self.arena.counted_spans = counted

    def _held_through(self, parent: bytes, whole: dict[bytes, bool],
                      on_disk: Callable[[bytes], bool] | None) -> bool:
        """Whether ``parent`` and every parent above it are held (``whole`` memoizes)."""
        chain: dict[bytes, None] = {}          # the walk so far, in order
        node: bytes = parent
        held = True
        while node and node not in whole:
            if node in chain:                   # a cycle a client made up: count it broken
                held = False
                break
            chain[node] = None
            with self._lock:
                record = self._index.get(node)
                above = self.arena.parent_of(record) if record >= 0 else None
            if above is None:
                held = on_disk is not None and on_disk(node)
                break
            node = above
        else:
            held = whole.get(node, True) if node else True
        for key in chain:
            whole[key] = held
        return held

    # ---- demotion support (``tiered.Demoter``) ---------------------------------------------

    def claim_dirty(self, min_headroom: int) -> tuple[Segment, list[Entry]] | None:
        """When fewer than ``min_headroom`` segments are reusable, pin the oldest dirty span
        and return it with its live entries; else None."""
        with self._lock:
            if self.arena.headroom_segments() >= min_headroom:
                return None
            head = self.arena.oldest_dirty()
            if head is None:
                return None
            head.pins += 1
            start, end = self._span_bytes(head)
            records = sorted(self._index.find_in(dict.fromkeys(head.hashes), start, end))
            return head, [self._entry_at(record) for record in records]

    def keep_read(self, live: list[Entry],
                  on_disk: Callable[[bytes], bool] | None = None) -> list[Entry]:
        """The demoter's second chance for a claimed span: re-append its values read since
        they were written; the rest, returned, go to disk, except values whose parent this
        server holds neither in memory nor (``on_disk``) in the cold tier: those can no
        longer hit and are let go with the span."""
        out = []
        for entry in live:
            if entry.parent:
                with self._lock:
                    held = self._reachable(entry.parent)
                if not held and not (on_disk is not None and on_disk(entry.parent)):
                    with self._lock:
                        self.counters.unreachable_evicted += 1
                    continue
            if not (entry.read and self.reappend(entry)):
                out.append(entry)
        return out

    def reappend(self, entry: Entry) -> bool:
        """Second chance: copy a recently read value to the log's head, where it is young
        again. False when no clean space is free for it (the caller demotes it instead)."""
        with self._lock:
            hash_ = self._index.hash(entry.key)
            if self._index.get(entry.key, hash_) != entry.record:
                return True
            try:
                names_len = len(entry.key) + len(entry.parent)
                head, record = self._arena_allocate(record_size(names_len, entry.length),
                                                    use_reserve=True, fresh=False)
            except NoSpace:
                return False
            moved = Entry(entry.key, record, value_offset(record, names_len), entry.length,
                          entry.checksum, head, group=entry.group, pinned=entry.pinned,
                          parent=entry.parent)
            view = self.arena.view
            view[moved.value:moved.value + moved.length] = \
                view[entry.value:entry.value + entry.length]
            self.arena.write_record_header(record, state=STATE_PENDING, key=entry.key,
                                           length=entry.length, checksum=entry.checksum,
                                           seq=self.arena.next_record_seq(), group=entry.group,
                                           final_state=STATE_COMMITTED, pinned=entry.pinned,
                                           parent=entry.parent)
            self.arena.set_record_state(record, STATE_COMMITTED)
            self._point(entry.key, hash_, record, moved.length, head, pinned=entry.pinned)
            self.counters.second_chances += 1
            return True

    def keys_with_groups(self) -> list[tuple[bytes, int]]:
        """Every key in memory with its placement-group hash (a snapshot, for a drain).

        The records are listed at once, their headers read ``PUT_MANY_STRIDE * 64`` at a time
        (reading ten million headers in one hold of the lock would stall every request for
        seconds); a record superseded or evicted in between is left out, and one that took
        its place is a key of this server too."""
        with self._lock:
            records = self._index.records()
        out: list[tuple[bytes, int]] = []
        stride = PUT_MANY_STRIDE * 64
        for first in range(0, len(records), stride):
            with self._lock:
                found = [self.arena.read_record(record)
                         for record in records[first:first + stride]]
            out.extend((fields.key, fields.group) for fields in found
                       if fields.state == STATE_COMMITTED)
        return out

    def is_current(self, entry: Entry) -> bool:
        with self._lock:
            return self._index.get(entry.key) == entry.record

    def settle(self, head: Segment, *, demoted: int) -> None:
        """Unpin a claimed span and mark it clean: its space may now be reused."""
        with self._lock:
            self._unpin(head)
            head.clean = True
            self.counters.demoted_objects += demoted
            self.space.notify_all()

    def note_promoted(self) -> None:
        with self._lock:
            self.counters.promoted_objects += 1

"""The hot tier: the index of committed values over the arena, and the leases and writes in flight.

Invariants (all under ``_lock``; value bytes are copied outside it, protected by holds):
- A key is in the index only after COMMIT checked its xxh3_64 checksum; a write that fails,
  is abandoned or mismatches is never visible.
- Every lease and every pending write holds its span until it is given back or its TTL passes
  (``holds.Holds``, which has the rules), so a dead client cannot hold memory for longer.
- Replacing or deleting a key leaves the old record's bytes in place until its span is
  reclaimed, so a reader holding a lease on the old value still reads intact bytes.

Collaborators, each under the same lock: ``Index`` (key -> record), ``Reclaim`` (claims that
evict, second chances, the demoter's side), ``Keep`` (kept values: a file's parts, put with
``FLAG_PINNED``, and their budget), ``Reachability`` (the sweep that counts values whose prefix is
gone), ``Holds`` (leases and writes in flight, by handle). Leases and writes are handed out as
``handles.HotLease`` / ``HotWrite``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from gcache.errors import ChecksumMismatch, InvalidRequest, NoSpace
from gcache.keys import Hasher, checksum
from gcache.record_layout import record_size, value_offset
from gcache.server import record
from gcache.server.arena import ARENA_DIR, Arena, Segment
from gcache.server.handles import HotLease, HotWrite
from gcache.server.holds import Holds
from gcache.server.index import Index
from gcache.server.keep import Keep
from gcache.server.reachability import Reachability
from gcache.server.reclaim import ALLOC_WAIT_S, Laggards, Quotas, Reclaim
from gcache.server.recovery import restore
from gcache.server.tenant_keys import owner_of
from gcache.server.tier_counters import TierCounters
from gcache.server.tier_protocol import Copied, Entry, Stored

log = logging.getLogger(__name__)

PUT_MANY_STRIDE = 64     # values ``put_many`` stores (``read_many`` reads) per hold of the lock


class HotTier:
    def __init__(self, *, name: str, size_bytes: int, segment_size: int, prefault: bool,
                 lease_ttl_s: float, cold_backed: bool = False,
                 arena_dir: str = ARENA_DIR, pin_budget_bytes: int = 0,
                 laggards: Laggards | None = None, quotas: Quotas | None = None) -> None:
        self._lock = threading.Lock()
        # Signalled whenever space may have become reusable; a demoter waits on it too.
        self.space = threading.Condition(self._lock)
        self.cold_backed = cold_backed
        self.arena = Arena(name=name, size_bytes=size_bytes, segment_size=segment_size,
                           prefault=prefault, directory=arena_dir)
        self.counters = TierCounters()
        self.index = Index(self.arena)
        self.keep = Keep(self.arena, pin_budget_bytes, quotas)
        self.reclaim = Reclaim(self.arena, self.index, self.counters, self.space,
                               cold_backed=cold_backed, laggards=laggards, quotas=quotas)
        self.reach = Reachability(self.arena, self.index, self.space)
        self.holds = Holds(lease_ttl_s, self.counters, unpin=self.reclaim.unpin,
                           uncount_kept=self._uncount_kept)
        if self.arena.attached:
            self._recover()

    def _recover(self) -> None:
        found = restore(self.arena, self.index, self.keep)
        self.counters.recovered_objects = found.objects
        self.reach.parents_seen = found.parents
        self.counters.checksum_failures += found.dropped_corrupt + found.dropped_headers

    # ---- writes -----------------------------------------------------------------------------

    def alloc(self, key: bytes, length: int, *, expires: bool = True,
              wait_s: float = ALLOC_WAIT_S, group: int = 0,
              pinned: bool = False, parent: bytes = b"") -> HotWrite:
        """Reserve room for ``key`` (``tier_protocol.Tier.alloc``). ``expires=False`` is for a
        write the server itself drives to the end (a PUT frame): its connection's IO timeout
        bounds it, not the TTL. Raises NoSpace."""
        with self._lock:
            size = record_size(len(key) + len(parent), length)
            if pinned:
                self.keep.check_budget(size, owner_of(key))
            head, offset = self.reclaim.allocate(size, wait_s, owner_of(key))
            if pinned:                  # counted from now: writes in flight at once see it
                self.keep.count(head)
            self.reach.parents_seen = self.reach.parents_seen or bool(parent)
            entry = Entry(key, offset, value_offset(offset, len(key) + len(parent)), length, 0,
                          head, group=group, pinned=pinned, parent=parent)
            record.write(self.arena.view, offset, self.arena.secret, state=record.STATE_PENDING,
                         key=key, length=length, checksum=0, seq=self.arena.next_record_seq(),
                         group=group, pinned=pinned, parent=parent)
            return HotWrite(self, self.holds.add(entry, pending=True, expires=expires), entry)

    def write_target(self, handle: int, offset: int,
                     n_bytes: int) -> tuple[memoryview, Hasher | None]:
        """The slice of a pending write's extent at ``offset``, and a hasher to feed while
        receiving into it when this write continues the in-order stream (else None; COMMIT then
        hashes the whole value). Call ``write_done`` after. Raises InvalidRequest."""
        with self._lock:
            hold = self.holds.write(handle)
            entry = hold.entry
            if offset < 0 or n_bytes < 0 or offset + n_bytes > entry.length:
                raise InvalidRequest(f"write of {n_bytes} bytes at offset {offset} overruns the "
                                     f"{entry.length}-byte extent")
            hasher = None
            if hold.hasher is not None and offset == hold.hashed and not hold.hashing:
                hasher, hold.hashed, hold.hashing = hold.hasher, offset + n_bytes, True
            else:
                hold.hasher = None                 # out of order or concurrent: hash at COMMIT
            hold.writers += 1
        return self.arena.view[entry.value + offset:entry.value + offset + n_bytes], hasher

    def write_done(self, handle: int) -> bool:
        """End a ``write_target``; False when the write's TTL passed meanwhile (it is dropped
        now, and the bytes just received count for nothing)."""
        with self._lock:
            return self.holds.received(handle)

    def commit(self, handle: int, expected: int, *, if_absent: bool = False,
               unless: Callable[[], bool] | None = None) -> bool:
        """Make a pending write visible if its bytes match ``expected`` (xxh3_64). With
        ``if_absent`` (a promotion) a key committed meanwhile wins and this write is dropped:
        returns False; so it is when ``unless()``, asked under the lock, is true (the key was
        deleted while its promotion read the disk). Raises InvalidRequest for an unknown
        handle, ChecksumMismatch (the write is dropped)."""
        with self._lock:
            hold = self.holds.take_write(handle)
        entry = hold.entry
        streamed = hold.hasher is not None and hold.hashed == entry.length and not hold.hashing
        if hold.hasher is not None and streamed:
            actual = hold.hasher.intdigest()
        else:
            actual = checksum(self.arena.view[entry.value:entry.value + entry.length])
        with self._lock:
            self.reclaim.unpin(entry.head)
            if entry.pinned:            # ALLOC's count; ``_point`` counts a committed one
                self._uncount_kept(entry.head)
            self.counters.whole_hashes += not streamed
            if actual != expected:
                self.counters.checksum_failures += 1
                raise ChecksumMismatch(f"value of {entry.length} bytes hashes to {actual:#x}, "
                                       f"COMMIT said {expected:#x}")
            hash_ = self.index.hash(entry.key)
            if if_absent and (self.index.get(entry.key, hash_) >= 0
                              or (unless is not None and unless())):
                return False
            entry.checksum = actual
            record.write(self.arena.view, entry.record, self.arena.secret,
                         state=record.STATE_PENDING, key=entry.key, length=entry.length,
                         checksum=actual, seq=self.arena.next_record_seq(), group=entry.group,
                         final_state=record.STATE_COMMITTED, pinned=entry.pinned,
                         parent=entry.parent)
            record.commit_state(self.arena.view, entry.record)
            self._point(entry.key, hash_, entry.record, entry.length, entry.head,
                        pinned=entry.pinned)
            if not if_absent:                     # a promotion is a copy, not a fresh write
                self.arena.mark_committed(entry.head, entry.length)
            self.counters.puts += 1
        return True

    def put_many(self, values: Sequence[tuple[bytes, memoryview, int]], *,
                 group: int = 0, pinned: bool = False,
                 parents: Sequence[bytes] | None = None) -> list[Stored]:
        """Store small values the server holds whole already (a BATCH_PUT's payload): each
        hashed before any lock is taken, then written with its header straight as COMMITTED,
        after its bytes (a crash in between leaves a header that fails its check): a third of
        the per-key work of ALLOC, WRITE and COMMIT. The lock is let go every
        ``PUT_MANY_STRIDE`` values. Returns one ``Stored`` per value, in order."""
        out = [Stored.OK if checksum(value) == expected else Stored.MISMATCH
               for _, value, expected in values]
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
        return out

    def _store_whole(self, key: bytes, value: memoryview, checksum_: int, group: int,
                     wait_s: float, pinned: bool, parent: bytes) -> bool:
        """One ``put_many`` value, under ``_lock``; False when there is no room."""
        size = record_size(len(key) + len(parent), len(value))
        try:
            if pinned:
                self.keep.check_budget(size, owner_of(key))
            head, offset = self.reclaim.allocate(size, wait_s, owner_of(key))
        except NoSpace as exc:
            if pinned:
                log.warning("put.refused pinned=1 bytes=%d reason=%s", len(value), exc)
            return False
        start = value_offset(offset, len(key) + len(parent))
        self.arena.view[start:start + len(value)] = value
        self.reach.parents_seen = self.reach.parents_seen or bool(parent)
        record.write(self.arena.view, offset, self.arena.secret, state=record.STATE_COMMITTED,
                     key=key, length=len(value), checksum=checksum_,
                     seq=self.arena.next_record_seq(), group=group, pinned=pinned,
                     parent=parent)
        self._point(key, self.index.hash(key), offset, len(value), head, pinned=pinned)
        self.arena.mark_committed(head, len(value))
        self.counters.puts += 1
        return True

    def abort(self, handle: int) -> None:
        """Drop a pending write (its bytes stay unreachable until the span is reclaimed)."""
        with self._lock:
            self.holds.abort(handle)

    # ---- reads ------------------------------------------------------------------------------

    def lease(self, key: bytes, *, expires: bool = True, quiet: bool = False) -> HotLease | None:
        """Hold ``key``'s value for reading; None when absent. ``expires=False`` as for
        ``alloc``. ``quiet``: the server's own read (no hit counted, no second chance earned)."""
        with self._lock:
            offset = self.index.get(key)
            if offset < 0:
                self.counters.misses += not quiet
                return None
            if not quiet:
                self.counters.hits += 1
                record.mark_read(self.arena.view, offset)
            entry = self._entry_at(offset)
            return HotLease(self, self.holds.add(entry, pending=False, expires=expires), entry)

    def read_many(self, keys: Sequence[bytes], *, budget_bytes: int,
                  absent_left: bool = False) -> tuple[list[Copied | None], list[int]]:
        """Copies of small values, for a BATCH_GET (``tier_protocol.Batches.read_many``),
        taken under the lock so they need no lease, which is let go every ``PUT_MANY_STRIDE``
        keys. ``absent_left``: an absent key is left in the second list uncounted too (a cold
        tier may hold it)."""
        copies: list[Copied | None] = []
        left: list[int] = []
        view = self.arena.view
        for first in range(0, len(keys), PUT_MANY_STRIDE):
            with self._lock:
                for i in range(first, min(len(keys), first + PUT_MANY_STRIDE)):
                    offset = self.index.get(keys[i])
                    if offset < 0:
                        copies.append(None)
                        if absent_left:
                            left.append(i)
                        else:
                            self.counters.misses += 1
                        continue
                    start, length, checksum_ = record.extent(view, offset)
                    if length > budget_bytes:
                        copies.append(None)
                        left.append(i)
                        continue
                    budget_bytes -= length
                    self.counters.hits += 1
                    record.mark_read(view, offset)
                    copies.append(Copied(bytes(view[start:start + length]), checksum_))
        return copies, left

    def read_view(self, handle: int, offset: int, length: int) -> memoryview:
        """``length`` bytes of a leased value from ``offset`` (no copy; valid while the lease
        is held). Raises InvalidRequest for a lease that is over, or a range outside the value
        (the slice would show another record's bytes)."""
        with self._lock:
            entry = self.holds.lease(handle).entry
        if offset < 0 or length < 0 or offset + length > entry.length:
            raise InvalidRequest(f"read of {length} bytes at offset {offset} overruns the "
                                 f"{entry.length}-byte value")
        return self.arena.view[entry.value + offset:entry.value + offset + length]

    def release(self, handle: int) -> bool:
        with self._lock:
            return self.holds.release(handle)

    def exists(self, key: bytes) -> bool:
        with self._lock:
            return self.index.get(key) >= 0

    def is_current(self, entry: Entry) -> bool:
        """Whether ``entry`` is still its key's value (the demoter asks before writing it)."""
        with self._lock:
            return self.index.get(entry.key) == entry.record

    def entry(self, key: bytes) -> Entry | None:
        """``key``'s committed record as it stands now, or None (for inspection: a reader
        holds a lease instead)."""
        with self._lock:
            offset = self.index.get(key)
            return None if offset < 0 else self._entry_at(offset)

    def delete(self, key: bytes) -> bool:
        """Forget ``key``; TOMBSTONE records keep it forgotten across a restart. There are two,
        in one allocation, so that one flipped byte cannot bring the deleted value back."""
        with self._lock:
            if self.index.remove(key) < 0:
                return False
            self._drop_kept(key)
            self.counters.deletes += 1
            one = record_size(len(key), 0)
            try:
                # Never waits: a wait lets go of the lock, and a put of the key committed
                # meanwhile would get an older sequence number than these tombstones.
                _, offset = self.reclaim.claim(2 * one, owner=owner_of(key))
            except NoSpace:
                log.warning("tier.tombstone_lost reason=no_space key_bytes=%d", len(key))
                return True
            for at in (offset, offset + one):
                record.write(self.arena.view, at, self.arena.secret,
                             state=record.STATE_TOMBSTONE, key=key, length=0, checksum=0,
                             seq=self.arena.next_record_seq())
            return True

    # ---- listing ----------------------------------------------------------------------------

    def keys_with_groups(self) -> list[tuple[bytes, int]]:
        """Every key in memory with its placement-group hash (a snapshot, for a drain)."""
        return self.index.keys_with_groups(self._lock)

    def pinned_keys(self, prefix: bytes, *, after: bytes = b"", limit: int) -> list[bytes]:
        with self._lock:
            found = self.keep.keys(prefix, after=after)
        return sorted(found)[:limit]

    # ---- upkeep -----------------------------------------------------------------------------

    def reap_expired(self, now_s: float | None = None) -> int:
        """Drop holds whose TTL passed; returns how many."""
        with self._lock:
            return self.holds.reap(time.monotonic() if now_s is None else now_s)

    def sweep_unreachable(self, on_disk: Callable[[bytes], bool] | None = None) -> None:
        self.reach.sweep(on_disk)

    def claim_dirty(self, min_headroom: int) -> tuple[Segment, list[Entry]] | None:
        """The demoter's next span (``Reclaim.claim_dirty``), with its live entries."""
        with self._lock:
            claimed = self.reclaim.claim_dirty(min_headroom)
            if claimed is None:
                return None
            head, offsets = claimed
            return head, [self._entry_at(offset) for offset in offsets]

    def stats(self) -> dict[str, int]:
        with self._lock:
            out = {"objects": len(self.index), "bytes": self.index.value_bytes,
                   "capacity_bytes": self.arena.size_bytes, "used_bytes": self.arena.used_bytes,
                   "segments": len(self.arena.segments), "pins": len(self.holds),
                   "pinned_objects": len(self.keep), "pinned_bytes": self.keep.held_bytes,
                   "pin_budget_bytes": self.keep.budget_bytes,
                   "young_spans_reclaimed": self.reclaim.young_reclaims}
            out["unreachable_objects"], out["unreachable_bytes"] = self.reach.unreachable
            out.update({k: getattr(self.counters, k) for k in TierCounters.__slots__})
            return out

    def tier_stats(self) -> None:
        """None: this tier is all there is (``tiered.TieredStore`` has counters per tier)."""

    def owner_stats(self) -> dict[int, dict[str, int]]:
        """Per owner (tenant id, 0 the administrator's): bytes its spans hold, values it lost
        to claims, bytes its pinned values' spans hold."""
        with self._lock:
            owners = set(self.arena.held) | set(self.reclaim.evicted_by_owner)
            return {o: {"memory_bytes": self.arena.held[o],
                        "evicted_objects": self.reclaim.evicted_by_owner[o],
                        "pinned_bytes": self.keep.held_by_owner(o)} for o in owners}

    def close(self, *, unlink: bool) -> None:
        self.arena.close(unlink=unlink)

    # ---- under the lock ---------------------------------------------------------------------

    def _drop_kept(self, key: bytes) -> None:
        if self.keep.drop(key):
            self.space.notify_all()          # the span may be reclaimed now

    def _uncount_kept(self, head: Segment) -> None:
        if self.keep.uncount(head):
            self.space.notify_all()          # the span may be reclaimed now

    def _point(self, key: bytes, hash_: int, offset: int, length: int, head: Segment, *,
               pinned: bool = False) -> None:
        """Make the record at ``offset`` ``key``'s value (``Index.point``), its kept state
        following the value it is on."""
        if self.index.point(key, hash_, offset, length, head) >= 0:
            self._drop_kept(key)
        if pinned:
            self.keep.keep(key, offset, head)

    def _entry_at(self, offset: int) -> Entry:
        fields = record.read(self.arena.view, offset)
        return Entry(fields.key, offset,
                     value_offset(offset, len(fields.key) + len(fields.parent)), fields.length,
                     fields.checksum, self.arena.segment_of(offset), fields.read, fields.group,
                     fields.pinned, fields.parent)

"""Hot and cold tiers as one store: demotion in the background, promotion on read.

``TieredStore`` is a ``tier_protocol.Tier`` as ``HotTier`` is (the request handler cannot tell
the difference), over any ``cold_store.ColdStore``, and adds what a cold tier changes:
- **Demotion.** A ``Demoter`` thread keeps ``headroom`` segments of the arena reusable: it pins
  the oldest dirty span, re-appends the objects that were read since they were written (second
  chance, once per read), writes the others to disk outside every lock, verifying each
  checksum first so a flipped byte in memory is never persisted, then marks the span clean.
  Only clean spans are reused, so nothing leaves memory that is not on disk; a writer that finds
  no clean space waits for the demoter (``tier.ALLOC_WAIT_S``) rather than dropping data, and
  readers never wait on it.
- **Promotion.** A read that misses memory and hits disk allocates the value in the arena, reads
  it there straight from disk, checks its checksum and commits it (unless a newer write of the
  key landed first), then leases it as any hot read. A wrong checksum is a miss, an error log
  line, and the disk copy is dropped.
- **Consistency.** A write or delete of a key drops its disk copy, so an older value never comes
  back. A key written to disk while it was being replaced or deleted is "superseded": reads
  ignore its disk copy and the demoter deletes it when its batch ends.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence

from gcache.errors import ChecksumMismatch, NoSpace
from gcache.keys import Hasher, checksum
from gcache.prefetched import Prefetched
from gcache.server.cold_index import ColdEntry
from gcache.server.cold_store import ColdStore, CountsOwners
from gcache.server.demoter import Demoter
from gcache.server.reclaim import ALLOC_WAIT_S
from gcache.server.tier import HotTier
from gcache.server.tier_protocol import Copied, Entry, Fill, Lease, Stored, Write

log = logging.getLogger(__name__)

LANDED_WAIT_S = 5.0      # a delete waits at most this long for a demotion of its key to end
PROMOTE_WAIT_S = 0.2     # a read waits at most this long for room to promote into; then NoSpace


class TieredStore:
    """A ``HotTier`` in front of a cold store (``cold_segments`` or ``cold_blobs``)."""

    def __init__(self, hot: HotTier, cold: ColdStore, *, headroom_segments: int) -> None:
        self.hot, self.cold = hot, cold
        self.arena = hot.arena
        self._guard = threading.Lock()           # the sets below
        self._landed = threading.Condition(self._guard)   # a demotion's disk write ended
        self._in_flight: set[bytes] = set()      # keys the demoter is writing to disk
        self._superseded: set[bytes] = set()     # of those, written or deleted meanwhile
        self._promoting: Counter[bytes] = Counter()   # keys being read from disk into memory
        self._deleted: set[bytes] = set()        # of those, deleted meanwhile
        self.cold_hits = 0
        self.cold_misses = 0
        self.cold_checksum_failures = 0
        self.dropped_objects = 0                 # could not be demoted (disk full, corrupt)
        self.demoter = Demoter(self, headroom_segments)
        for key in hot.pinned_keys(b"", limit=1 << 62):    # kept across a restart, not on disk
            if self.cold.lookup(key) is None:
                self.demoter.write_through(key)
        self.demoter.start()

    # ---- the hot tier's interface -------------------------------------------------------------
    # Writes and leases live in memory only: these go to the hot tier, and a committed write
    # drops the key's disk copy (an older value must never come back from disk).

    def alloc(self, key: bytes, length: int, *, expires: bool = True,
              wait_s: float = ALLOC_WAIT_S, group: int = 0,
              pinned: bool = False, parent: bytes = b"") -> Write:
        write = self.hot.alloc(key, length, expires=expires, wait_s=wait_s, group=group,
                               pinned=pinned, parent=parent)
        return _DiskCopyDropping(write, self)

    def put_many(self, values: Sequence[tuple[bytes, memoryview, int]], *,
                 group: int = 0, pinned: bool = False,
                 parents: Sequence[bytes] | None = None) -> list[Stored]:
        stored = self.hot.put_many(values, group=group, pinned=pinned, parents=parents)
        for (key, _, _), outcome in zip(values, stored, strict=True):
            if outcome is Stored.OK:
                self.committed(key, pinned=pinned)
        return stored

    def pinned_keys(self, prefix: bytes, *, after: bytes = b"", limit: int) -> list[bytes]:
        """Those in memory and those on disk (after a reboot, before a read brings them back):
        the first ``limit`` of the union are among the first ``limit`` of each."""
        found = set(self.hot.pinned_keys(prefix, after=after, limit=limit))
        found.update(self.cold.pinned_keys(prefix, after=after, limit=limit))
        return sorted(found)[:limit]

    def read_many(self, keys: Sequence[bytes], *,
                  budget_bytes: int) -> tuple[list[Copied | None], list[int]]:
        """The hot tier's copies; every key memory lacks is left to a lease, which promotes
        it from disk when it is there."""
        return self.hot.read_many(keys, budget_bytes=budget_bytes, absent_left=True)

    def reap_expired(self, now_s: float | None = None) -> int:
        return self.hot.reap_expired(now_s)

    def stats(self) -> dict[str, int]:
        return self.hot.stats()

    def lease(self, key: bytes, *, expires: bool = True) -> Lease | None:
        """The hot tier's lease, promoting from disk on a memory miss. None: in neither tier.
        Raises NoSpace when the value is on disk but memory has no room for it right now (its
        own reader's other leases may be what pins it): the reader is told to ask again, not
        that the key is absent."""
        got = self.hot.lease(key, expires=expires)
        if got is not None or not self._promote(key):
            return got
        return self.hot.lease(key, expires=expires)

    def exists(self, key: bytes) -> bool:
        return self.hot.exists(key) or self._cold_entry(key) is not None

    def prefetch(self, key: bytes) -> Prefetched:
        """Have ``key`` in memory ahead of a read (PREFETCH): promoted from disk as a read's
        miss would be, but not leased, so it holds no room for the caller and counts as no
        read (it earns no second chance until one comes). NO_ROOM when memory has none within
        ``PROMOTE_WAIT_S``."""
        if self.hot.exists(key):
            return Prefetched.IN_MEMORY
        try:
            promoted = self._promote(key)
        except NoSpace:
            return Prefetched.NO_ROOM
        return Prefetched.PROMOTED if promoted else Prefetched.ABSENT

    def delete(self, key: bytes) -> bool:
        """Forget ``key`` in both tiers. The disk copy goes first, under the guard a promotion
        looks it up under (see ``_promote``); then memory, which also removes a promotion that
        committed in between. A demotion may have been writing the key meanwhile (it took the
        value while it was still current): its copy is dropped or marked superseded, promotions
        that found it are marked, and memory is cleared once more for one that committed."""
        on_disk = self._drop_cold(key, deleting=True)
        in_memory = self.hot.delete(key)
        # A demotion writing the key now would leave a disk copy behind until it ends: a crash
        # before then brought the deleted value back (the arena's tombstones do not reach the
        # disk). The delete is acknowledged only once that write is over and the copy gone.
        with self._guard:
            self._landed.wait_for(lambda: key not in self._in_flight, timeout=LANDED_WAIT_S)
        again = self._drop_cold(key, deleting=True)
        in_memory = self.hot.delete(key) or in_memory
        return on_disk or again or in_memory

    def keys_with_groups(self) -> list[tuple[bytes, int]]:
        """Every key in memory or on disk with its placement-group hash (for a drain)."""
        found = dict(self.hot.keys_with_groups())
        for key in self.cold.keys():
            if key not in found:
                entry = self._cold_entry(key)
                if entry is not None:
                    found[key] = entry.group
        return list(found.items())

    def close(self, *, unlink: bool) -> None:
        self.demoter.stop()
        try:
            self.cold.sync()
            self.cold.close()
        except OSError as exc:           # a failing disk must not keep the arena from closing
            log.error("cold.close_failed error=%s", exc)
        self.hot.close(unlink=unlink)

    def owner_stats(self) -> dict[int, dict[str, int]]:
        """The hot tier's per-owner figures with each owner's bytes on disk."""
        out = self.hot.owner_stats()
        if isinstance(self.cold, CountsOwners):             # the segments format counts
            for owner, n_bytes in self.cold.owner_bytes().items():
                out.setdefault(owner, {})["disk_bytes"] = n_bytes
        return out

    def tier_stats(self) -> dict[str, dict[str, int]]:
        hot = self.hot.stats()
        cold = self.cold.stats()
        return {
            "hot": {k: hot[k] for k in ("bytes", "objects", "hits", "demoted_objects",
                                        "promoted_objects", "second_chances",
                                        "evicted_objects", "checksum_failures")},
            "cold": {"bytes": cold["bytes"], "objects": self.cold.object_count(),
                     "capacity_bytes": cold["capacity_bytes"], "hits": self.cold_hits,
                     "misses": self.cold_misses, "evicted_objects": cold["evicted_objects"],
                     "checksum_failures": self.cold_checksum_failures,
                     "dropped_objects": self.dropped_objects,
                     "failed_writes": cold["failed_writes"]}}

    # ---- promotion ---------------------------------------------------------------------------

    def sweep_unreachable(self) -> None:
        self.hot.sweep_unreachable(self.on_disk)

    def on_disk(self, key: bytes) -> bool:
        return self._cold_entry(key) is not None

    def _cold_entry(self, key: bytes) -> ColdEntry | None:
        with self._guard:
            if key in self._superseded:
                return None
        return self.cold.lookup(key)

    def _promote(self, key: bytes) -> bool:
        """Read ``key`` from disk into memory. A delete that lands while the disk is read must
        win, or the promotion would bring the deleted value back. The promotion registers and
        looks the key up under ``_guard``, where ``delete`` marks registered promotions and
        drops the disk copy: either the lookup finds nothing, or the promotion is marked, and
        its commit asks for the mark under the hot tier's lock (one that committed before the
        mark is removed by the delete's own hot delete, which comes after)."""
        with self._guard:
            self._promoting[key] += 1
            entry = None if key in self._superseded else self.cold.lookup(key)
        try:
            return self._promote_entry(key, entry)
        finally:
            with self._guard:
                self._promoting[key] -= 1
                if not self._promoting[key]:
                    del self._promoting[key]
                    self._deleted.discard(key)

    def _was_deleted(self, key: bytes) -> bool:
        with self._guard:
            return key in self._deleted

    def _promote_entry(self, key: bytes, entry: ColdEntry | None) -> bool:
        if entry is None:
            self.cold_misses += 1
            return False
        try:
            write = self.hot.alloc(key, entry.length, expires=False, wait_s=PROMOTE_WAIT_S,
                                   group=entry.group, parent=entry.parent, pinned=entry.pinned)
        except NoSpace:
            if not entry.pinned:
                raise
            # the pin budget is spent: served unpinned; the disk copy keeps its mark
            write = self.hot.alloc(key, entry.length, expires=False, wait_s=PROMOTE_WAIT_S,
                                   group=entry.group, parent=entry.parent)
        try:
            if not self._read_hashing(entry, write):
                write.abort()
                return False
            promoted = self.hot.commit(write.handle, entry.checksum, if_absent=True,
                                       unless=lambda: self._was_deleted(key))
        except ChecksumMismatch as exc:
            self.cold_checksum_failures += 1
            log.error("cold.checksum_mismatch key=%r %s: dropped from disk", key[:64], exc)
            self._drop_cold(key)
            return False
        self.cold_hits += 1
        if promoted:
            with self.hot.space:
                self.hot.counters.promoted_objects += 1
        return True

    def _read_hashing(self, entry: ColdEntry, write: Write) -> bool:
        """Read a value from disk into its pending extent in chunks, hashing each chunk while
        it is still in the CPU cache, so COMMIT finds the checksum done (one pass over memory,
        not two)."""
        chunk = self.cold.read_chunk_bytes
        read = [True]

        def fill(view: memoryview, hasher: Hasher | None) -> None:
            read[0] = self.cold.read_into(entry, view, offset=offset)
            if read[0] and hasher is not None:
                hasher.update(view)
        for offset in range(0, entry.length, chunk):
            write.receive(offset, min(chunk, entry.length - offset), fill)
            if not read[0]:
                return False
        return True

    # ---- disk copies ---------------------------------------------------------------------------

    def committed(self, key: bytes, *, pinned: bool) -> None:
        """A client's value of ``key`` was committed in memory: an older disk copy must never
        come back (dropped, durably), and a pinned value is written to disk as well, so a
        rebooted host still serves it (the demoter never reclaims its span)."""
        self._drop_cold(key)
        if pinned:
            self.demoter.write_through(key)

    def write_kept(self, key: bytes) -> None:
        """Write ``key``'s pinned value to disk while it stays in memory (the demoter's)."""
        lease = self.hot.lease(key, expires=False, quiet=True)
        if lease is None:
            return
        try:
            if lease.entry.pinned:
                self.demote([lease.entry])
        finally:
            lease.release()

    def _drop_cold(self, key: bytes, *, deleting: bool = False) -> bool:
        """Drop ``key``'s disk copy (a newer value was committed, or it is being deleted: then
        promotions of it in flight are marked too, under the guard they look it up under)."""
        with self._guard:
            if key in self._in_flight:
                self._superseded.add(key)
            if deleting and key in self._promoting:
                self._deleted.add(key)
            return self.cold.delete(key)

    def demote(self, entries: list[Entry]) -> int:
        """Write entries to disk (on the demoter thread); returns how many are there now.

        A key is in flight from before the check that its entry is still current until its
        copy is written: a delete (or a newer put) either comes first, and the check skips
        the entry, or finds the key in flight, and the copy is dropped when it lands. Marked
        in flight only after the check, a delete that fell between the two was acknowledged
        with this copy still to come, which then brought the deleted value back (the soak's
        cold round: "got 15, legal [-1]")."""
        done = 0
        for entry in entries:
            with self._guard:
                self._in_flight.add(entry.key)
            try:
                done += self._demote_one(entry)
            finally:
                with self._guard:     # written or deleted meanwhile: this copy is stale
                    self._in_flight.discard(entry.key)
                    stale = entry.key in self._superseded
                    self._superseded.discard(entry.key)
                    if stale:
                        self.cold.delete(entry.key)
                    self._landed.notify_all()
        return done

    def _demote_one(self, entry: Entry) -> int:
        """1 when ``entry`` (marked in flight) is on disk now, else 0."""
        if not self.hot.is_current(entry):
            return 0
        present = self.cold.lookup(entry.key)
        if present is not None and present.checksum == entry.checksum \
                and present.length == entry.length:
            return 1                          # promoted earlier and unchanged: already there
        value = self.arena.view[entry.value:entry.value + entry.length]
        if checksum(value) != entry.checksum:
            self.hot.counters.checksum_failures += 1
            self.dropped_objects += 1
            log.error("hot.checksum_mismatch key=%r: not demoted", entry.key[:64])
            return 0
        if self.cold.put(entry.key, value, entry.checksum, entry.group, entry.parent,
                         pinned=entry.pinned):
            return 1
        self.dropped_objects += 1
        return 0


class _DiskCopyDropping:
    """A hot-tier write that, once committed, drops the key's disk copy (and, put pinned, has
    the new value written to disk too)."""

    def __init__(self, write: Write, store: TieredStore) -> None:
        self._write, self._store = write, store
        self.handle, self.entry = write.handle, write.entry

    def receive(self, offset: int, n_bytes: int, fill: Fill) -> bool:
        return self._write.receive(offset, n_bytes, fill)

    def commit(self, expected: int) -> bool:
        committed = self._write.commit(expected)
        self._store.committed(self.entry.key, pinned=self.entry.pinned)
        return committed

    def abort(self) -> None:
        self._write.abort()

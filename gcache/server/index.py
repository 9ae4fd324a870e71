"""Each key's current record in the arena, and the bytes of the values the index names.

The table itself is a ``RecordTable`` (key hash -> record offset, 16 bytes a slot); everything
else about a value is read from its record when needed. This class keeps the rules that go with
pointing a key somewhere (not thread-safe: the tier's lock guards it):
- at most one record per key is COMMITTED: moving a key to a new record supersedes the old one
  in the arena (``record.supersede``), so a restart never takes an older version;
- the index only ever names live records: a span is forgotten (``forget_span``) before the
  arena frees it, and a span lists the hashes of the keys committed in it, so forgetting it
  touches its keys' slots only;
- the bytes of the values named are a running sum, so STAT (every ``gcache.kv`` pressure
  reading) never walks the index.
"""

from __future__ import annotations

import threading
from functools import partial

from gcache.server import record
from gcache.server.arena import Arena, Segment
from gcache.server.record_table import RecordTable

STRIDE = 4096           # records a listing reads per hold of the lock


class Index:
    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.table = RecordTable(partial(record.holds_key, arena.view))
        self.value_bytes = 0

    def __len__(self) -> int:
        return len(self.table)

    def hash(self, key: bytes) -> int:
        return self.table.hash(key)

    def get(self, key: bytes, hash_: int | None = None) -> int:
        """``key``'s record, or -1."""
        return self.table.get(key, hash_)

    def point(self, key: bytes, hash_: int, offset: int, length: int, head: Segment) -> int:
        """Make the committed record at ``offset`` (in span ``head``) ``key``'s value; returns
        the record it replaces (now SUPERSEDED), or -1."""
        old = self.table.put(key, offset, hash_)
        if old >= 0:
            self.value_bytes -= record.length_of(self.arena.view, old)
            record.supersede(self.arena.view, old, self.arena.secret)
        self.value_bytes += length
        head.hashes.append(hash_)
        return old

    def remove(self, key: bytes) -> int:
        """Forget ``key`` (its record becomes SUPERSEDED); returns the record, or -1."""
        old = self.table.remove(key)
        if old >= 0:
            self.value_bytes -= record.length_of(self.arena.view, old)
            record.supersede(self.arena.view, old, self.arena.secret)
        return old

    def find_span(self, head: Segment) -> list[int]:
        """The records the index names in a span, in arena order."""
        start, end = self.arena.span_bytes(head)
        return sorted(self.table.find_in(dict.fromkeys(head.hashes), start, end))

    def forget_span(self, head: Segment) -> list[int]:
        """Forget every key whose record lies in a span about to be reused; returns those
        records. Their state is left as it is: the span's bytes are about to be overwritten,
        and until then a restart would read the same values back."""
        start, end = self.arena.span_bytes(head)
        removed = self.table.remove_in(dict.fromkeys(head.hashes), start, end)
        self.value_bytes -= record.sum_lengths(self.arena.view, removed)
        return removed

    def records(self) -> list[int]:
        """Every record the index names (a snapshot)."""
        return self.table.records()

    def keys_with_groups(self, lock: threading.Lock) -> list[tuple[bytes, int]]:
        """Every key named with its placement-group hash (a snapshot, for a drain), taking
        ``lock`` (the tier's) itself: the records are listed at once and read ``STRIDE`` at a
        time (ten million headers in one hold of the lock would stall every request for
        seconds); a record superseded or reclaimed in between is left out."""
        with lock:
            offsets = self.records()
        out: list[tuple[bytes, int]] = []
        for first in range(0, len(offsets), STRIDE):
            with lock:
                found = [record.read(self.arena.view, o) for o in offsets[first:first + STRIDE]]
            out.extend((f.key, f.group) for f in found if f.state == record.STATE_COMMITTED)
        return out

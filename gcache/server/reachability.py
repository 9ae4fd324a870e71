"""Counting the values in memory that can no longer hit: their prefix is gone from this server.

A value may name its parent (``FLAG_PARENT``: the object it is of no use without, a KV page's
previous page). A value with a parent, or a parent's parent, that this server holds neither in
memory nor (``on_disk``) in the cold tier can never be part of a hit until that page is written
again. The sweep counts such values for STAT (``unreachable_objects``, ``unreachable_bytes``) and
per one-segment span (``Segment.unreachable``), so a claim can take a span mostly made of them
before older ones (``gcache.eviction``).

It runs in the background every few seconds (``ServerConfig.unreachable_sweep_s``), never per
request: it reads every record with a parent, ``STRIDE`` at a time under the tier's lock, and
nothing at all until a value with a parent was stored (``parents_seen``). A parent held on disk
only ends the walk up (its own parent is not looked up there). A parent is its child's owner's
key (``tenant_keys.parent_key``).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from gcache.server import record
from gcache.server.arena import Arena
from gcache.server.index import STRIDE, Index
from gcache.server.tenant_keys import parent_key


class Reachability:
    def __init__(self, arena: Arena, index: Index, lock: threading.Condition) -> None:
        self.arena, self.index, self._lock = arena, index, lock
        self.parents_seen = False       # a value with a parent was stored (or recovered)
        self.unreachable = (0, 0)       # objects and bytes the last sweep found

    def sweep(self, on_disk: Callable[[bytes], bool] | None = None) -> None:
        """Count the values that can no longer hit (see the module docstring)."""
        if not self.parents_seen:
            return
        with self._lock:
            records = self.index.records()
        whole: dict[bytes, bool] = {}        # parent key -> whether it and its own are held
        objects = total = 0
        by_span: collections.Counter[tuple[int, int]] = collections.Counter()  # (index, age)
        view = self.arena.view
        for first in range(0, len(records), STRIDE):
            with self._lock:
                # a record evicted since the snapshot may lie under another span's bytes now:
                # only one the index still points at is read
                found = [(parent_key(key, parent), record.length_of(view, r), head.index,
                          head.seq)
                         for r in records[first:first + STRIDE]
                         for parent in (record.parent_of(view, r),)
                         if parent
                         for key in (record.key_of(view, r),)
                         if self.index.get(key) == r
                         for head in (self.arena.segment_of(r),)]
            for parent, length, index, age in found:
                if not self._held_through(parent, whole, on_disk):
                    objects, total = objects + 1, total + length
                    by_span[index, age] += length
        with self._lock:
            self.unreachable = (objects, total)
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
                offset = self.index.get(node)
                above = record.parent_of(self.arena.view, offset) if offset >= 0 else None
            if above is None:
                held = on_disk is not None and on_disk(node)
                break
            node = parent_key(node, above) if above else above
        else:
            held = whole.get(node, True) if node else True
        for key in chain:
            whole[key] = held
        return held

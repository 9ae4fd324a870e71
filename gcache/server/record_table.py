"""The hot tier's index: each key's committed record in the arena, in 16 bytes a slot.

A dict of keys to entry objects cost about 326 bytes of memory per object (the key's bytes
object, the entry, its boxed integers, the dict's slot), and a server at page granularity holds
tens of millions of objects. Everything about a value is in its arena record already (key,
length, checksum, group), so this table keeps only a 64-bit hash of the key and the record's
offset, and confirms a candidate against the key in the arena (``matches``): two keys with the
same hash are two slots, told apart by their records.

Design, and why:
- Open addressing with linear probing over one array of (hash, record) pairs: no object per
  entry, and the scan of a probe run stays in one cache line or two. The array is numpy's
  (zeroed pages the kernel hands out as they are touched, returned when a resize frees them;
  an ``array('Q')`` left each old table behind in the heap) read through a ``'Q'``
  memoryview, whose items index as fast as a list's.
- The home slot is the hash's top bits and probing never wraps (a tail past the last home takes
  the overflow, and its last slot is always empty, so every probe ends): sorted by hash is
  sorted by home, so a resize places every entry in one vectorized pass (numpy), not one Python
  insert per entry. A resize still holds the tier's lock for that pass (about a second at ten
  million objects here); the table doubles, so it happens once per doubling.
- Deletion shifts the rest of the run back (no tombstones), so lookups never slow down with
  churn.
- The hash is seeded per process (xxh3_64 with a random seed): a client cannot choose keys that
  pile into one probe run.
The table is not thread-safe: the tier's lock guards it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import numpy as np
import xxhash

EMPTY = 0                   # a slot's hash; ``hash`` never returns it
TAIL_SLOTS = 64             # slots past the last home, for the last runs' overflow
MAX_LOAD = 0.75             # entries per home slot before the table doubles
MIN_BITS = 10


class RecordTable:
    """key -> arena offset of its record. ``matches(record, key)`` says whether the record at
    that offset holds ``key``. Methods take the key's ``hash`` when the caller has it."""

    __slots__ = ("_bits", "_count", "_matches", "_pairs", "_seed", "_shift", "_slots")

    def __init__(self, matches: Callable[[int, bytes], bool], *, seed: int | None = None,
                 capacity_bits: int = MIN_BITS) -> None:
        self._matches = matches
        self._seed = int.from_bytes(os.urandom(8), "little") if seed is None else seed
        self._count = 0
        self._bits = max(MIN_BITS, capacity_bits)
        self._shift = 64 - self._bits
        self._pairs = np.zeros(((1 << self._bits) + TAIL_SLOTS, 2), dtype=np.uint64)
        self._slots = _words(self._pairs)

    def __len__(self) -> int:
        return self._count

    @property
    def memory_bytes(self) -> int:
        return int(self._pairs.nbytes)

    def hash(self, key: bytes | memoryview) -> int:
        return xxhash.xxh3_64_intdigest(key, self._seed) or 1

    def get(self, key: bytes, hash_: int | None = None) -> int:
        """The record of ``key``, or -1."""
        i, _ = self._probe(key, hash_)
        return -1 if self._slots[i] == EMPTY else self._slots[i + 1]

    def put(self, key: bytes, record: int, hash_: int | None = None) -> int:
        """Point ``key`` at ``record``; returns the record it replaced, or -1."""
        i, h = self._probe(key, hash_)
        slots = self._slots
        if slots[i] != EMPTY:
            old = slots[i + 1]
            slots[i + 1] = record
            return old
        if i + 2 >= len(slots) or self._count + 1 > MAX_LOAD * (1 << self._bits):
            self._resize(self._bits + 1)
            return self.put(key, record, h)
        slots[i], slots[i + 1] = h, record
        self._count += 1
        return -1

    def remove(self, key: bytes, hash_: int | None = None) -> int:
        """Forget ``key``; returns its record, or -1 when it was absent."""
        i, _ = self._probe(key, hash_)
        if self._slots[i] == EMPTY:
            return -1
        record = self._slots[i + 1]
        self._delete_at(i)
        return record

    def _probe(self, key: bytes, hash_: int | None) -> tuple[int, int]:
        """(slot of ``key``, or the empty slot that ends its run; the key's hash)."""
        h = self.hash(key) if hash_ is None else hash_
        slots, i = self._slots, (h >> self._shift) << 1
        while True:
            found = slots[i]
            if found == EMPTY or (found == h and self._matches(slots[i + 1], key)):
                return i, h
            i += 2

    def find_in(self, hashes: Iterable[int], start: int, end: int) -> list[int]:
        """Records of keys with these hashes that lie in ``[start, end)`` (a span's bytes)."""
        slots, shift, out = self._slots, self._shift, []
        for hash_ in hashes:
            i = (hash_ >> shift) << 1
            while slots[i] != EMPTY:
                if slots[i] == hash_ and start <= slots[i + 1] < end:
                    out.append(slots[i + 1])
                i += 2
        return out

    def remove_in(self, hashes: Iterable[int], start: int, end: int) -> list[int]:
        """Forget the keys with these hashes whose records lie in ``[start, end)``; returns
        those records. Needs no key: a span being reused may hold anything by now. One call
        for a whole span: a span of small values holds a hundred thousand of them."""
        slots, shift, out, delete_at = self._slots, self._shift, [], self._delete_at
        for hash_ in hashes:
            i = (hash_ >> shift) << 1
            while slots[i] != EMPTY:
                if slots[i] == hash_ and start <= slots[i + 1] < end:
                    out.append(slots[i + 1])
                    delete_at(i)            # the run shifted back: look at slot i again
                    continue
                i += 2
        return out

    def records(self) -> list[int]:
        """Every record the table points at (a snapshot)."""
        pairs = self._pairs
        records: list[int] = pairs[pairs[:, 0] != EMPTY, 1].tolist()
        return records

    def _delete_at(self, i: int) -> None:
        """Empty slot ``i`` and move back every later entry of its run that may sit there."""
        slots, shift = self._slots, self._shift
        j = i + 2
        while True:
            found = slots[j]
            if found == EMPTY:
                break
            if (found >> shift) << 1 <= i:
                slots[i], slots[i + 1] = found, slots[j + 1]
                i = j
            j += 2
        slots[i] = slots[i + 1] = EMPTY
        self._count -= 1

    def _resize(self, bits: int) -> None:
        """Re-place every entry in a table of ``2**bits`` homes, in one sorted pass: entries
        taken in hash order each go to their home or right after the previous one."""
        pairs = self._pairs
        live = pairs[pairs[:, 0] != EMPTY]
        live = live[np.argsort(live[:, 0])]
        homes = (live[:, 0] >> np.uint64(64 - bits)).astype(np.int64)
        order = np.arange(len(live), dtype=np.int64)
        places = np.maximum.accumulate(homes - order) + order if len(live) else order
        size = max((1 << bits) + TAIL_SLOTS, int(places[-1]) + 2 if len(live) else 0)
        fresh = np.zeros((size, 2), dtype=np.uint64)
        fresh[places] = live
        self._pairs, self._slots = fresh, _words(fresh)
        self._bits, self._shift = bits, 64 - bits


def _words(pairs: np.ndarray) -> memoryview:
    """The table as Python ints, one per ``'Q'`` item (hash, record, hash, record, ...)."""
    return pairs.data.cast("B").cast("Q")

"""The cold tier with values inside RocksDB (blob files on), the alternative to segment files.

Four kinds of entries in one rocksdict database: ``v<key>`` the value (RocksDB moves values of
4 KiB and more to blob files), ``m<key>`` its metadata (insertion number, length, checksum),
``o<number>`` the insertion order (length, key), which the disk budget walks oldest first, and
``p<key>`` for a value put pinned (a file's part), which the budget never evicts (it goes to the
young end of the order instead). Kept
so that ``bench/tiers.py`` can measure it against ``cold_segments`` in every run: each read here
returns a fresh ``bytes`` from rocksdict that is then copied into the caller's buffer.
"""

from __future__ import annotations

import logging
import struct
import threading
from typing import cast

from gcache.server.cold_index import ColdEntry, open_index

log = logging.getLogger(__name__)

META = struct.Struct("<QQQQ")        # insertion number, length, checksum, group; then the parent
ORDER = struct.Struct(">Q")          # big-endian, so byte order is insertion order
SIZE = struct.Struct("<Q")


class BlobColdStore:
    """Cold values in RocksDB blob files under ``path``; thread-safe."""

    read_chunk_bytes = 1 << 62     # whole values: rocksdict cannot read part of one

    def __init__(self, path: str, capacity_bytes: int) -> None:
        self.path, self.capacity_bytes = path, capacity_bytes
        self._lock = threading.Lock()
        self._db = open_index(path, blob_files=True)
        self._bytes, self._next = 0, 0
        # Counted once here and kept since: STAT must not walk the index under the lock.
        self._objects = sum(1 for _ in self._db.items(b"m"))
        for order, raw in self._db.items(b"o"):
            self._bytes += SIZE.unpack_from(raw)[0]
            self._next = ORDER.unpack(order[1:])[0] + 1
        self.evicted_objects = 0
        self.failed_writes = 0
        self._pinned_pass = 0

    def put(self, key: bytes, value: memoryview, checksum: int, group: int = 0,
            parent: bytes = b"", pinned: bool = False) -> bool:
        if len(value) > self.capacity_bytes:
            return False
        with self._lock:
            try:
                self._drop(key)
                self._pinned_pass = self._next        # a pinned value moves once per pass
                while self._bytes + len(value) > self.capacity_bytes and self._evict_oldest():
                    pass
                number, self._next = self._next, self._next + 1
                self._db.put(b"v" + key, bytes(value))
                self._db.put(b"m" + key, META.pack(number, len(value), checksum, group) + parent)
                self._objects += 1
                self._db.put(b"o" + ORDER.pack(number), SIZE.pack(len(value)) + key)
                if pinned:
                    self._db.put(b"p" + key, b"")
                self._bytes += len(value)
                return True
            except OSError as exc:
                log.error("cold.write_failed error=%s", exc)
                self.failed_writes += 1
                return False

    def lookup(self, key: bytes) -> ColdEntry | None:
        raw = self._db.get(b"m" + key)
        if raw is None:
            return None
        _, length, checksum, group = META.unpack_from(raw)
        return ColdEntry(length, checksum, key, group, bytes(raw[META.size:]),
                         self._db.get(b"p" + key) is not None)

    def pinned_keys(self, prefix: bytes, *, after: bytes = b"", limit: int) -> list[bytes]:
        found = []
        for marker, _ in self._db.items(b"p" + prefix):
            if marker[1:] > after:
                found.append(marker[1:])
                if len(found) == limit:
                    break
        return found

    def keys(self) -> list[bytes]:
        """Every key held (a snapshot)."""
        return [key[1:] for key, _ in self._db.items(b"m")]

    def read_into(self, entry: ColdEntry, out: memoryview, *, offset: int = 0) -> bool:
        """As ``SegmentColdStore.read_into``; rocksdict fetches the whole value every time."""
        key = cast(bytes, entry.location)       # what ``lookup`` put there: the key
        value = self._db.get(b"v" + key)
        if value is None or offset + len(out) > len(value):
            return False
        out[:] = memoryview(value)[offset:offset + len(out)]
        return True

    def delete(self, key: bytes) -> bool:
        with self._lock:
            return self._drop(key)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"bytes": self._bytes, "capacity_bytes": self.capacity_bytes,
                    "evicted_objects": self.evicted_objects, "failed_writes": self.failed_writes}

    def object_count(self) -> int:
        with self._lock:
            return self._objects

    def sync(self) -> None:
        """RocksDB's write-ahead log carries every write: synced, they survive a power cut."""
        self._db.sync()

    def close(self) -> None:
        self._db.close()

    def _drop(self, key: bytes) -> bool:
        raw = self._db.get(b"m" + key)
        if raw is None:
            return False
        number, length, _, _ = META.unpack_from(raw)
        # first, and durably: no entry ever names a missing value, and no power cut undoes it
        self._db.delete(b"m" + key, durable=True)
        self._objects -= 1
        for k in (b"v" + key, b"o" + ORDER.pack(number), b"p" + key):
            self._db.delete(k)
        self._bytes -= length
        return True

    def _evict_oldest(self) -> bool:
        """Drop the oldest value, or move it to the young end when it was put pinned; False
        when nothing is left that may go."""
        for order, raw in self._db.items(b"o"):
            key = raw[SIZE.size:]
            if self._db.get(b"p" + key) is not None:
                if ORDER.unpack(order[1:])[0] >= self._pinned_pass:
                    return False                # every value left is pinned: keep them all
                self._renumber(key, order)
                continue
            if self._drop(key):
                self.evicted_objects += 1
            else:
                self._db.delete(order)
            return True
        return False

    def _renumber(self, key: bytes, order: bytes) -> None:
        """Move a pinned value to the young end of the order."""
        meta = self._db.get(b"m" + key)
        if meta is None:
            self._db.delete(order)
            return
        _, length, checksum, group = META.unpack_from(meta)
        number, self._next = self._next, self._next + 1
        self._db.put(b"m" + key, META.pack(number, length, checksum, group) + meta[META.size:])
        self._db.put(b"o" + ORDER.pack(number), SIZE.pack(length) + key)
        self._db.delete(order)

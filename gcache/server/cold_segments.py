"""The cold tier as append-only segment files on NVMe, with RocksDB (rocksdict) as the index.

Values are appended to the newest of a series of files (``seg-<n>.dat``), each record a header
(magic, key length, value length, checksum), the key, then the value; the RocksDB index maps a
key to (file, value offset, length, checksum). A read is one ``os.preadv`` straight into the
caller's buffer — the arena, when the hot tier promotes — with no intermediate ``bytes``.

Invariants:
- The index is written after the record's bytes, so an index entry never points at bytes that
  were not written; what a crash or a lost page does leave wrong is caught by the checksum,
  which the reader verifies.
- The disk budget evicts whole files, oldest first: their keys leave the index (only where the
  index still points into that file), then the file is unlinked. A full disk does the same and
  retries once; a value that still does not fit is not stored (the caller counts it).
- A file's records are self-describing, so eviction finds a file's keys by scanning it.
- Values put pinned (a file's parts) are flagged in the index (the file number's top bit) and
  never evicted by the disk budget: evicting a file first copies its live pinned values forward
  into the current file. Their keys are also kept in memory, for ``pinned_keys``.
- Tenants (``tenant_keys``): the live value bytes of each owner are counted (from the index at
  start, then on every put, delete and eviction). A tenant at its disk quota (``DiskQuotas``)
  drops its own oldest values first, down to seven eighths of the quota, so one scan of its
  keys pays for many puts; a file evicted for the disk budget carries forward the values of
  tenants within their disk quota, as it does pinned ones, so nobody else's traffic takes them.

Why this design over values inside RocksDB (``cold_blobs``): rocksdict returns every read as a
fresh ``bytes``, so a blob-file read costs a copy more, and its writes go through RocksDB's WAL
and blob machinery; ``bench/tiers.py`` measures both and this one is the default (figures in the
README).
"""

from __future__ import annotations

import collections
import logging
import os
import struct
import threading
from typing import Protocol, cast

from gcache.errors import ConfigError
from gcache.server.cold_index import ColdEntry, open_index
from gcache.server.tenant_keys import ADMIN, MAX_INTERNAL_KEY_BYTES, owner_of, prefix

log = logging.getLogger(__name__)

RECORD = struct.Struct("<IHQQQ")       # magic, key_len, length, checksum, group
RECORD_MAGIC = 0x32434F47              # b"GOC2"
LOCATION = struct.Struct("<IQQQQ")     # file number, value offset, length, checksum, group; then
                                       # the parent (none in indexes written before parents)
PINNED = 1 << 31                       # in the file number: the value was put pinned
FILE_BYTES = 64 << 20


class DiskQuotas(Protocol):
    """Each owner's disk quota on this server (``gcache.server.tenant_table``)."""

    def disk_quota(self, owner: int) -> int:
        """Bytes of values ``owner`` may keep on disk against others; 0: none."""


class SegmentColdStore:
    """Cold values in segment files under ``path``; thread-safe."""

    read_chunk_bytes = 256 << 10   # a promotion reads (and hashes, while cached) this much a step

    def __init__(self, path: str, capacity_bytes: int, *, file_bytes: int = FILE_BYTES,
                 quotas: DiskQuotas | None = None) -> None:
        self.path, self.capacity_bytes, self.quotas = path, capacity_bytes, quotas
        self._owner_bytes: collections.Counter[int] = collections.Counter()
        self.file_bytes = min(file_bytes, max(1 << 20, capacity_bytes // 4))
        self._lock = threading.Lock()
        self._index = open_index(os.path.join(path, "index"))
        # Counted once here and kept since: STAT must not walk the index under the lock.
        self._objects = 0
        self._pinned: set[bytes] = set()
        for key, raw in self._index.items():
            self._objects += 1
            number, _, length, _, _ = LOCATION.unpack_from(raw)
            self._owner_bytes[owner_of(key)] += length
            if number & PINNED:
                self._pinned.add(key)
        self._sizes: dict[int, int] = {}
        for name in sorted(os.listdir(path)):
            if name.startswith("seg-") and name.endswith(".dat"):
                self._sizes[int(name[4:-4])] = os.path.getsize(os.path.join(path, name))
        self._current = max(self._sizes, default=0)
        self._sizes.setdefault(self._current, 0)
        self._write_fd = self._open(self._current, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._read_fds: dict[int, int] = {}
        self.evicted_objects = 0
        self.evicted_files = 0
        self.failed_writes = 0

    # ---- the ColdStore protocol -----------------------------------------------------------

    def put(self, key: bytes, value: memoryview, checksum: int, group: int = 0,
            parent: bytes = b"", pinned: bool = False) -> bool:
        """Append ``value``; False when it cannot be stored (too large, disk full)."""
        size = RECORD.size + len(key) + len(value)
        if size > self.capacity_bytes:
            return False
        with self._lock:
            self._keep_quota(owner_of(key), len(value))
            for attempt in (1, 2):
                try:
                    self._make_room(size)
                    self._append(key, value, checksum, group, parent, pinned)
                    return True
                except OSError as exc:
                    log.error("cold.write_failed attempt=%d error=%s", attempt, exc)
                    self._roll()                       # never append after a torn record
                    if not self._evict_oldest():
                        break
            self.failed_writes += 1
            return False

    def _append(self, key: bytes, value: bytes | memoryview, checksum: int, group: int,
                parent: bytes, pinned: bool) -> None:
        """One record at the end of the current file, then its index entry (under the lock).
        Raises OSError."""
        header = RECORD.pack(RECORD_MAGIC, len(key), len(value), checksum, group)
        size = len(header) + len(key) + len(value)
        offset = self._sizes[self._current]
        written = os.writev(self._write_fd, [header, key, value])
        self._sizes[self._current] += written
        if written != size:
            raise OSError(f"short write of {written} of {size} bytes")
        old = self._index.get(key)
        known = old is not None
        if old is not None:
            self._owner_bytes[owner_of(key)] -= LOCATION.unpack_from(old)[2]
        self._owner_bytes[owner_of(key)] += len(value)
        number = self._current | (PINNED if pinned else 0)
        self._index.put(key, LOCATION.pack(number, offset + len(header) + len(key), len(value),
                                           checksum, group) + parent)
        self._objects += not known
        if pinned:
            self._pinned.add(key)
        else:
            self._pinned.discard(key)

    def lookup(self, key: bytes) -> ColdEntry | None:
        raw = self._index.get(key)
        if raw is None:
            return None
        number, offset, length, checksum, group = LOCATION.unpack_from(raw)
        return ColdEntry(length, checksum, (number & ~PINNED, offset), group,
                         bytes(raw[LOCATION.size:]), bool(number & PINNED))

    def pinned_keys(self, prefix: bytes, *, after: bytes = b"", limit: int) -> list[bytes]:
        with self._lock:
            found = [k for k in self._pinned if k.startswith(prefix) and k > after]
        return sorted(found)[:limit]

    def keys(self) -> list[bytes]:
        """Every key the index holds (a snapshot)."""
        return [key for key, _ in self._index.items()]

    def read_into(self, entry: ColdEntry, out: memoryview, *, offset: int = 0) -> bool:
        """Read ``len(out)`` bytes of ``entry``'s value from ``offset`` into ``out``; False
        when its file is gone or short. The caller verifies the checksum."""
        number, start = cast("tuple[int, int]", entry.location)   # what ``lookup`` put there
        with self._lock:
            if number not in self._sizes:
                return False
            fd = self._read_fds.get(number)
            if fd is None:
                fd = self._read_fds[number] = self._open(number, os.O_RDONLY)
        try:
            return os.preadv(fd, [out], start + offset) == len(out)
        except OSError as exc:
            log.error("cold.read_failed file=%d error=%s", number, exc)
            return False

    def delete(self, key: bytes) -> bool:
        with self._lock:
            raw = self._index.get(key)
            if raw is None:
                return False
            self._index.delete(key, durable=True)
            self._forgot(key, raw)
            return True

    def owner_bytes(self) -> dict[int, int]:
        """Live value bytes on disk per owner (tenant id; 0 the administrator's)."""
        with self._lock:
            return {o: n for o, n in self._owner_bytes.items() if n}

    def _forgot(self, key: bytes, raw: bytes) -> None:
        """Count out a value whose index entry was just deleted (under the lock)."""
        self._objects -= 1
        self._pinned.discard(key)
        self._owner_bytes[owner_of(key)] -= LOCATION.unpack_from(raw)[2]

    def _quota(self, owner: int) -> int:
        return self.quotas.disk_quota(owner) if self.quotas is not None and owner else 0

    def _keep_quota(self, owner: int, n_bytes: int) -> None:
        """A tenant at its disk quota drops its own oldest unpinned values first, down to
        seven eighths of the quota less ``n_bytes`` (under the lock)."""
        quota = self._quota(owner)
        if not quota or self._owner_bytes[owner] + n_bytes <= quota:
            return
        target = max(0, quota - quota // 8 - n_bytes)
        found = sorted((number, offset, key, raw)
                       for key, raw in self._index.items(prefix(owner))
                       for number, offset, *_ in (LOCATION.unpack_from(raw),)
                       if not number & PINNED)
        dropped = 0
        for _, _, key, raw in found:
            if self._owner_bytes[owner] <= target:
                break
            self._index.delete(key)
            self._forgot(key, raw)
            dropped += 1
        self.evicted_objects += dropped
        if dropped:
            log.info("cold.quota_evicted tenant=%d objects=%d", owner, dropped)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"bytes": sum(self._sizes.values()), "capacity_bytes": self.capacity_bytes,
                    "files": len(self._sizes), "evicted_objects": self.evicted_objects,
                    "evicted_files": self.evicted_files, "failed_writes": self.failed_writes}

    def object_count(self) -> int:
        with self._lock:
            return self._objects

    def sync(self) -> None:
        """The current file, then the index that points into it."""
        with self._lock:
            os.fsync(self._write_fd)
            self._index.sync()

    def close(self) -> None:
        with self._lock:
            for fd in [self._write_fd, *self._read_fds.values()]:
                os.close(fd)
            self._read_fds.clear()
            self._index.close()

    # ---- files ------------------------------------------------------------------------------

    def _file(self, number: int) -> str:
        return os.path.join(self.path, f"seg-{number:08d}.dat")

    def _open(self, number: int, flags: int) -> int:
        return os.open(self._file(number), flags, 0o600)

    def _make_room(self, size: int) -> None:
        if self._sizes[self._current] + size > self.file_bytes and self._sizes[self._current]:
            self._roll()
        while sum(self._sizes.values()) + size > self.capacity_bytes and self._evict_oldest():
            pass

    def _roll(self) -> None:
        os.fsync(self._write_fd)
        self._index.sync()                  # the entries into it, durable with it
        os.close(self._write_fd)
        self._current += 1
        self._sizes[self._current] = 0
        self._write_fd = self._open(self._current, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def _evict_oldest(self) -> bool:
        """Drop the oldest file that is not being written; False when there is none."""
        oldest = min((n for n in self._sizes if n != self._current), default=None)
        if oldest is None:
            return False
        dropped = 0
        for key in _keys_in(self._file(oldest)):
            raw = self._index.get(key)
            if raw is None or LOCATION.unpack_from(raw)[0] & ~PINNED != oldest:
                continue
            owner = owner_of(key)
            kept = LOCATION.unpack_from(raw)[0] & PINNED or (
                owner != ADMIN and self._owner_bytes[owner] <= self._quota(owner))
            if kept and self._carry_forward(key, raw):
                continue
            self._index.delete(key)
            self._forgot(key, raw)
            dropped += 1
        fd = self._read_fds.pop(oldest, None)
        if fd is not None:
            os.close(fd)
        os.unlink(self._file(oldest))
        del self._sizes[oldest]
        self.evicted_objects += dropped
        self.evicted_files += 1
        log.info("cold.evicted file=%d objects=%d", oldest, dropped)
        return True


    def _carry_forward(self, key: bytes, raw: bytes) -> bool:
        """Copy a pinned value (or one within its tenant's quota) out of a file being evicted
        into the current one; False when it cannot be read back whole (it is dropped with its
        file)."""
        number, offset, length, checksum, group = LOCATION.unpack_from(raw)
        fd = self._open(number & ~PINNED, os.O_RDONLY)
        try:
            value = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        if len(value) != length:
            return False
        self._append(key, value, checksum, group, bytes(raw[LOCATION.size:]),
                     bool(number & PINNED))
        return True


def _keys_in(path: str) -> list[bytes]:
    """Keys of the records in a segment file (headers only are read), up to the first torn or
    foreign record."""
    keys = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size, pos = os.fstat(fd).st_size, 0
        while pos + RECORD.size <= size:
            head = os.pread(fd, RECORD.size + MAX_INTERNAL_KEY_BYTES, pos)
            magic, key_len, length, _, _ = RECORD.unpack_from(head)
            end = pos + RECORD.size + key_len + length
            if magic != RECORD_MAGIC or end > size or RECORD.size + key_len > len(head):
                break
            keys.append(bytes(head[RECORD.size:RECORD.size + key_len]))
            pos = end
    finally:
        os.close(fd)
    return keys


def check_disk_dir(path: str) -> None:
    """Raise ``ConfigError`` unless ``path`` is an existing directory this process can create
    files in (tried, since root passes every permission check)."""
    if not os.path.isdir(path):
        raise ConfigError("disk_dir", path, "must be an existing directory")
    probe = os.path.join(path, f".gcache-probe-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError("disk_dir", path, f"must be writable: {exc.strerror}") from exc

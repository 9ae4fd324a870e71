"""RocksDB through rocksdict, behind the few calls the cold tier needs.

rocksdict's exceptions never leave this module: an index that cannot be opened is a
``ConfigError`` naming the path (a second server on the same ``--disk-dir`` holds its lock), and
a failed write is an ``OSError``, which the cold tier handles like a full disk.

Writes go to RocksDB's write-ahead log without a sync (a demoted value is a cache's copy: a power
cut may lose the newest ones), except deletes (``delete(durable=True)``): an acknowledged delete,
or the drop of a disk copy a newer value replaced, must never be undone by a power cut, which
would bring an older value back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gcache.errors import ConfigError

if TYPE_CHECKING:
    from rocksdict import Rdict


@dataclass(frozen=True, slots=True)
class ColdEntry:
    length: int            # value bytes
    checksum: int          # xxh3_64 of the value
    location: object       # where the store keeps it (opaque to callers)
    group: int = 0         # xxh3_64 of the placement group it was put with; 0 for none
    parent: bytes = b""    # the key it hangs from (FLAG_PARENT), back in memory on promotion
    pinned: bool = False   # put pinned (a file's part): kept in memory again on promotion


class RocksIndex:
    def __init__(self, db: Rdict) -> None:
        import rocksdict

        self._db = db
        self._synced = rocksdict.WriteOptions()
        self._synced.sync = True

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)     # raw mode: bytes, which the stub cannot say
        return value

    def put(self, key: bytes, value: bytes) -> None:
        try:
            self._db.put(key, value)
        except Exception as exc:      # rocksdict raises plain Exceptions for IO errors
            raise OSError(f"rocksdb put failed: {exc}") from exc

    def delete(self, key: bytes, *, durable: bool = False) -> None:
        """Delete ``key``; ``durable``: the log is synced before this returns."""
        try:
            self._db.delete(key, self._synced) if durable else self._db.delete(key)
        except Exception as exc:
            raise OSError(f"rocksdb delete failed: {exc}") from exc

    def sync(self) -> None:
        """Make every write so far survive a power cut (the write-ahead log, synced)."""
        try:
            self._db.flush_wal(True)
        except Exception as exc:
            raise OSError(f"rocksdb wal sync failed: {exc}") from exc

    def count(self) -> int:
        return sum(1 for _ in self._db.keys())

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(prefix)
        while it.valid() and it.key().startswith(prefix):
            yield it.key(), it.value()
            it.next()

    def close(self) -> None:
        try:
            self._db.close()
        except Exception as exc:
            raise OSError(f"rocksdb close failed: {exc}") from exc


def open_index(path: str, *, blob_files: bool = False) -> RocksIndex:
    """Open (or create) a raw-bytes RocksDB at ``path``; with ``blob_files`` large values live
    in RocksDB's blob files."""
    import rocksdict

    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    if blob_files:
        options.set_enable_blob_files(True)
        options.set_min_blob_size(4096)
        options.set_enable_blob_gc(True)
    try:
        return RocksIndex(rocksdict.Rdict(path, options))
    except Exception as exc:
        raise ConfigError("disk_dir", path, f"RocksDB cannot open it: {exc}") from exc

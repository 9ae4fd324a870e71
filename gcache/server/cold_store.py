"""``ColdStore``: what ``tiered.TieredStore`` needs of the disk tier behind the arena.

Two implementations conform: ``cold_segments.SegmentColdStore`` (append-only files, the default)
and ``cold_blobs.BlobColdStore`` (values inside RocksDB); mypy checks both, and
``tests/unit/test_cold_store_conformance.py`` runs one suite against each.

Contract, for both:
- Thread-safe: the demoter puts while readers look up, read and delete.
- ``put`` never raises for a full or failing disk: it returns False (the caller counts the value
  as dropped), after evicting the oldest values to fit the capacity when that helps. A put is
  durable once the store is synced (``sync``, and each file as it is rolled); a delete at once.
- ``read_into`` never verifies the checksum: the caller does, over the bytes it hashed anyway.
- ``ColdEntry.location`` is the store's own; callers only hand it back.
A store that counts each tenant's bytes (and keeps its disk quota) is also ``CountsOwners``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gcache.server.cold_index import ColdEntry


class ColdStore(Protocol):
    @property
    def read_chunk_bytes(self) -> int:
        """How much of a value ``read_into`` should be asked for at a time (a promotion hashes
        each piece while it is still in the CPU cache)."""

    def put(self, key: bytes, value: memoryview, checksum: int, group: int = 0,
            parent: bytes = b"", pinned: bool = False) -> bool:
        """Store ``value`` (its xxh3_64 ``checksum``, placement-group hash ``group``, the key
        it hangs from ``parent``, whether it was put ``pinned``) in place of any older one;
        False when it cannot be stored (too large, disk full)."""

    def lookup(self, key: bytes) -> ColdEntry | None: ...

    def keys(self) -> list[bytes]:
        """Every key held (a snapshot)."""

    def read_into(self, entry: ColdEntry, out: memoryview, *, offset: int = 0) -> bool:
        """Read ``len(out)`` bytes of ``entry``'s value from ``offset`` into ``out``; False when
        the value is gone or short."""

    def delete(self, key: bytes) -> bool:
        """Forget ``key``, durably (a power cut after this returns never brings it back);
        False when it was not held."""

    def pinned_keys(self, prefix: bytes, *, after: bytes = b"", limit: int) -> list[bytes]:
        """The keys put pinned that start with ``prefix`` and sort after ``after``, in order,
        at most ``limit``."""

    def stats(self) -> dict[str, int]:
        """At least ``bytes``, ``capacity_bytes``, ``evicted_objects`` and ``failed_writes``."""

    def object_count(self) -> int:
        """How many keys are held, without walking the index."""

    def sync(self) -> None:
        """Make what was put so far survive a crash."""

    def close(self) -> None: ...


@runtime_checkable
class CountsOwners(Protocol):
    def owner_bytes(self) -> dict[int, int]:
        """Live value bytes per owner (``tenant_keys.owner_of``)."""

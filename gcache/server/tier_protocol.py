"""``Tier``: what the server's request paths need of the store that holds the values.

The connection handler, the daemon, the drain (``handoff``) and the metrics collector see the
store only through this Protocol, so a hot tier alone (``tier.HotTier``) and the hot tier in
front of a cold one (``tiered.TieredStore``) are interchangeable behind them; mypy checks that
both conform, and ``tests/unit/test_tier_conformance.py`` runs one suite against each.

A write is ``alloc`` → bytes into its extent (the returned view, or ``write_target`` /
``write_done`` piece by piece) → ``commit`` with the value's xxh3_64, or ``abort``. A read is
``lease`` → bytes (the returned view, or ``read_view`` piece by piece) → ``release``. Handles
are ints; an unknown or finished one is ``InvalidRequest``. Leases and writes taken with
``expires=True`` are dropped by ``reap_expired`` once the lease TTL has passed.

The arena itself is part of the interface, read-only: HELLO announces its size and id, hands a
same-host client its descriptor, and NIXL registers its address. Every tier is over one arena.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gcache.keys import Hasher
from gcache.server.arena import Arena
from gcache.server.tier import Copied, Entry, Stored


class Tier(Protocol):
    @property
    def arena(self) -> Arena: ...

    # ---- writes -----------------------------------------------------------------------------

    def alloc(self, key: bytes, length: int, *, expires: bool = True,
              group: int = 0, pinned: bool = False,
              parent: bytes = b"") -> tuple[int, int, memoryview]:
        """Reserve ``length`` bytes for ``key``: (write handle, the value's arena offset, its
        memory). ``group`` is the placement-group hash (0: none), kept for a drain. ``pinned``:
        once committed the value stays in memory, never evicted nor demoted, while it is
        current (within the server's pin budget). ``parent``: the key this one's use depends
        on (``FLAG_PARENT``), kept in its record; a value whose parent is gone gets no second
        chance when memory is reclaimed. Raises NoSpace (also: the budget is spent)."""

    def write_target(self, handle: int, offset: int,
                     n_bytes: int) -> tuple[memoryview, Hasher | None]:
        """``n_bytes`` of a pending write's extent from ``offset``, and a hasher to feed with
        them when they continue the in-order stream. Pair with ``write_done``. Raises
        InvalidRequest."""

    def write_done(self, handle: int) -> bool:
        """End a ``write_target``; False when the write expired meanwhile and is gone."""

    def commit(self, handle: int, expected: int) -> bool:
        """Make a pending write visible if its bytes hash to ``expected`` (xxh3_64). Raises
        InvalidRequest for a handle that is not a write in flight, ChecksumMismatch (the write
        is dropped, never visible)."""

    def put_many(self, values: Sequence[tuple[bytes, memoryview, int]], *,
                 group: int = 0, pinned: bool = False,
                 parents: Sequence[bytes] | None = None) -> list[Stored]:
        """Store values received whole, each (key, bytes, xxh3_64 the writer sent), with
        placement-group hash ``group`` (``pinned`` and each of ``parents`` as for ``alloc``):
        one ``Stored`` per value, in order. A value whose bytes do not hash to its checksum is
        never visible."""

    def abort(self, handle: int) -> None:
        """Drop a pending write; an unknown handle is ignored."""

    # ---- reads ------------------------------------------------------------------------------

    def lease(self, key: bytes, *, expires: bool = True) -> tuple[int, Entry, memoryview] | None:
        """Pin ``key``'s value: (read handle, its entry, its bytes); None when absent. Raises
        NoSpace when the value exists but cannot be brought into memory right now."""

    def read_many(self, keys: Sequence[bytes], *,
                  budget_bytes: int) -> tuple[list[Copied | None], list[int]]:
        """Copies of the values of ``keys`` held in memory, up to ``budget_bytes`` in all, no
        lease needed; None for the rest. The second list: positions of values that exist but
        were not copied (past the budget, or not in memory: lease them)."""

    def leased(self, handle: int) -> Entry:
        """The entry a read lease pins. Raises InvalidRequest for an unknown handle."""

    def read_view(self, entry: Entry, offset: int, length: int) -> memoryview:
        """``length`` bytes of a leased entry's value from ``offset``, without a copy; valid
        while the lease is held. Raises InvalidRequest when the range leaves the value."""

    def release(self, handle: int) -> bool:
        """Drop a read lease; False when it is unknown (or expired already)."""

    # ---- keys -------------------------------------------------------------------------------

    def exists(self, key: bytes) -> bool: ...

    def delete(self, key: bytes) -> bool:
        """Forget ``key`` in every tier; False when no tier had it."""

    def keys_with_groups(self) -> list[tuple[bytes, int]]:
        """Every key held, with its placement-group hash (a snapshot, for a drain)."""

    def pinned_keys(self, prefix: bytes, *, after: bytes = b"", limit: int) -> list[bytes]:
        """The current pinned keys that start with ``prefix`` and sort after ``after``, in
        order, at most ``limit``."""

    # ---- upkeep -----------------------------------------------------------------------------

    def reap_expired(self, now_s: float | None = None) -> int:
        """Drop leases and writes whose TTL passed by ``now_s`` (``time.monotonic()``, now by
        default); returns how many."""

    def sweep_unreachable(self) -> None:
        """Count the values held that can no longer hit (their prefix is gone here), for
        ``stats``' ``unreachable_objects`` and ``unreachable_bytes``."""

    def stats(self) -> dict[str, int]:
        """The hot tier's counters and gauges (STAT's ``tier``, the server's metrics)."""

    def tier_stats(self) -> dict[str, dict[str, int]] | None:
        """Counters per tier (``hot``, ``cold``) when there is more than one; None when the
        hot tier is all there is (STAT then has no ``tiers``, /metrics no per-tier series)."""

    def close(self, *, unlink: bool) -> None:
        """Stop, flush and unmap; ``unlink`` also removes the arena from /dev/shm."""

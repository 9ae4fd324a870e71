"""``Tier``: what the server's request paths need of the store that holds the values.

The connection handler, the daemon, the drain (``handoff``) and the metrics collector see the
store only through these Protocols, so a hot tier alone (``tier.HotTier``) and the hot tier in
front of a cold one (``tiered.TieredStore``) are interchangeable behind them; mypy checks that
both conform, and ``tests/unit/test_tier_conformance.py`` runs one suite against each.

``Tier`` is the workhorse: a write is ``alloc`` -> bytes into its ``Write`` -> ``commit`` with the
value's xxh3_64 (or ``abort``); a read is ``lease`` -> bytes from its ``Lease`` -> ``release``.
Leases and writes taken with ``expires=True`` are dropped by the tier's upkeep once the lease
TTL has passed: their methods then refuse (InvalidRequest, or False). Their ``handle`` is the
number the wire protocol carries; only the connection that obtained one may use it. Optional
abilities are Protocols of their own, asked for with ``isinstance``: ``Batches`` (many values
per call), ``Listing`` (every key, the pinned keys), ``Upkeep`` (background work), ``Owners``
(what each tenant holds).

The arena itself is part of the interface, read-only: HELLO announces its size and id, hands a
same-host client its descriptor, and NIXL registers its address. Every tier is over one arena.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from gcache.keys import Hasher

if TYPE_CHECKING:
    from gcache.server.arena import Arena, Segment


@dataclass(slots=True)
class Entry:
    """A value's record as the tier found it (read from the record's header when needed)."""

    key: bytes
    record: int        # absolute offset of the record header
    value: int         # absolute offset of the value
    length: int        # value bytes
    checksum: int      # xxh3_64 of the value
    head: Segment      # span holding the record
    read: bool = False  # leased since it was (re-)appended: earns a second chance
    group: int = 0     # xxh3_64 of the placement group it was put with; 0 for none
    pinned: bool = False  # put pinned (kept): its span is held in memory while it is current
    parent: bytes = b""  # the key it hangs from (``FLAG_PARENT``); b"" for none


class Copied(NamedTuple):
    """A value ``read_many`` copied out of the arena."""

    value: bytes
    checksum: int


class Stored(enum.Enum):
    """What became of one value of ``put_many``."""

    OK = "ok"
    MISMATCH = "checksum_mismatch"      # its bytes do not hash to the writer's checksum
    NO_SPACE = "no_space"


# Fills part of a write's extent: (the slice, a hasher to feed with it or None).
Fill = Callable[[memoryview, Hasher | None], None]


class Lease(Protocol):
    """A read of one committed value: its bytes stay intact until released or reaped."""

    handle: int
    entry: Entry

    def view(self, offset: int = 0, length: int | None = None) -> memoryview:
        """Bytes of the value from ``offset`` (all of them by default), without a copy; release
        the view before the lease. Raises InvalidRequest when the range leaves the value, or
        the lease is over."""

    def release(self) -> bool:
        """End the lease; False when it was over already (released, or reaped)."""


class Write(Protocol):
    """A value being written into room the tier reserved: invisible until committed."""

    handle: int
    entry: Entry

    def receive(self, offset: int, n_bytes: int, fill: Fill) -> bool:
        """Let ``fill`` write ``n_bytes`` at ``offset`` (with a hasher when they continue the
        in-order stream, so COMMIT finds the checksum done). False when the write's TTL passed
        meanwhile: it is gone, those bytes count for nothing. Raises InvalidRequest for a range
        outside the value or a write that is over."""

    def commit(self, expected: int) -> bool:
        """Make the value visible if its bytes hash to ``expected`` (xxh3_64). Raises
        InvalidRequest for a write that is over, ChecksumMismatch (it is dropped)."""

    def abort(self) -> None:
        """Drop the write; nothing becomes visible (a write that is over: nothing happens)."""


class Tier(Protocol):
    @property
    def arena(self) -> Arena: ...

    def alloc(self, key: bytes, length: int, *, expires: bool = True, group: int = 0,
              pinned: bool = False, parent: bytes = b"") -> Write:
        """Reserve ``length`` bytes for ``key``. ``group``: the placement-group hash (0: none),
        kept for a drain. ``pinned``: once committed the value stays in memory while current
        (within the server's pin budget). ``parent``: the key this one's use depends on
        (``FLAG_PARENT``); a value whose parent is gone gets no second chance. Raises NoSpace
        (also: the budget is spent)."""

    def lease(self, key: bytes, *, expires: bool = True) -> Lease | None:
        """Pin ``key``'s value for reading; None when absent. Raises NoSpace when the value
        exists but cannot be brought into memory right now."""

    def exists(self, key: bytes) -> bool: ...

    def delete(self, key: bytes) -> bool:
        """Forget ``key`` in every tier; False when no tier had it."""

    def stats(self) -> dict[str, int]:
        """The hot tier's counters and gauges (STAT's ``tier``, the server's metrics)."""

    def close(self, *, unlink: bool) -> None:
        """Stop, flush and unmap; ``unlink`` also removes the arena."""


@runtime_checkable
class Batches(Protocol):
    def put_many(self, values: Sequence[tuple[bytes, memoryview, int]], *,
                 group: int = 0, pinned: bool = False,
                 parents: Sequence[bytes] | None = None) -> list[Stored]:
        """Store values received whole, each (key, bytes, xxh3_64 the writer sent): one
        ``Stored`` per value, in order; a value whose bytes do not hash to its checksum is never
        visible."""

    def read_many(self, keys: Sequence[bytes], *,
                  budget_bytes: int) -> tuple[list[Copied | None], list[int]]:
        """Copies of the values of ``keys`` held in memory, up to ``budget_bytes`` in all, no
        lease needed; None for the rest. The second list: positions of values that exist but
        were not copied (past the budget, or not in memory: lease them)."""


@runtime_checkable
class Listing(Protocol):
    def keys_with_groups(self) -> list[tuple[bytes, int]]:
        """Every key held, with its placement-group hash (a snapshot, for a drain)."""

    def pinned_keys(self, prefix: bytes, *, after: bytes = b"", limit: int) -> list[bytes]:
        """The current pinned keys that start with ``prefix`` and sort after ``after``, in
        order, at most ``limit``."""


@runtime_checkable
class Upkeep(Protocol):
    def reap_expired(self, now_s: float | None = None) -> int:
        """Drop leases and writes whose TTL passed by ``now_s`` (``time.monotonic()``);
        returns how many."""

    def sweep_unreachable(self) -> None:
        """Count the values held that can no longer hit (their prefix is gone here)."""

    def tier_stats(self) -> dict[str, dict[str, int]] | None:
        """Counters per tier (``hot``, ``cold``) when there is more than one, else None."""


@runtime_checkable
class Owners(Protocol):
    def owner_stats(self) -> dict[int, dict[str, int]]:
        """Per owner (a tenant's id, 0 for the administrator's keys, ``tenant_keys``):
        ``memory_bytes`` its spans hold, ``pinned_bytes`` of spans holding its pinned values,
        ``evicted_objects`` it lost to claims, and ``disk_bytes`` behind a cold tier."""

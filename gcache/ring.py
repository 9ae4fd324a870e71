"""Consistent-hash ring: which server owns a key (ARCHITECTURE §3).

Each server gets virtual nodes in proportion to its capacity, at points ``xxh3_64(address#i)``.
A key is owned by the first virtual node clockwise of ``xxh3_64(key)``. With a ``group`` the
placement key is the group: a group has ``group_width`` slots, each placed on the ring on its own
(slot j at ``xxh3_64(group_hash ‖ j)``), and a key goes to slot ``xxh3_64(key) % width``. So one
prefix tree lives on at most ``width`` servers, one host failure touches only the groups it
holds, and — because every slot is an ordinary consistent-hash lookup — a server leaving moves
only the keys it held (a drain hands over exactly those). Two slots may land on one server; the
group then simply lives on fewer.

The ring is immutable; membership changes build a new one (rings are small: servers × vnodes).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Mapping, Sequence

from gcache.keys import key_hash

_SLOT = struct.Struct("<QH")     # a group's placement hash and a slot number


class Ring:
    """Immutable ring over ``weights`` (address -> capacity weight, any positive unit)."""

    __slots__ = ("_points", "_owners", "_servers")

    def __init__(self, weights: Mapping[str, float], *, vnodes: int = 64) -> None:
        if any(w <= 0 for w in weights.values()):
            raise ValueError(f"server weights must be positive, got {dict(weights)}")
        self._servers = tuple(sorted(weights))
        mean = sum(weights.values()) / len(weights) if weights else 1.0
        points: list[tuple[int, str]] = []
        for address in self._servers:
            count = max(1, round(vnodes * weights[address] / mean))
            points.extend((key_hash(f"{address}#{i}".encode()), address) for i in range(count))
        points.sort()
        self._points = [p for p, _ in points]
        self._owners = [a for _, a in points]

    @classmethod
    def uniform(cls, servers: Sequence[str], *, vnodes: int = 64) -> Ring:
        return cls({address: 1.0 for address in servers}, vnodes=vnodes)

    @property
    def servers(self) -> tuple[str, ...]:
        return self._servers

    def successors(self, point: int, count: int) -> list[str]:
        """Up to ``count`` distinct servers clockwise from ``point``."""
        if not self._points:
            return []
        count = min(count, len(self._servers))
        start = bisect.bisect_left(self._points, point)
        found: list[str] = []
        for step in range(len(self._points)):
            owner = self._owners[(start + step) % len(self._points)]
            if owner not in found:
                found.append(owner)
                if len(found) == count:
                    break
        return found

    def owner(self, key: bytes, *, group: bytes | None = None, group_width: int = 2) -> str | None:
        """The server that holds ``key`` (None on an empty ring)."""
        return self.owner_by_hash(key, 0 if group is None else key_hash(group),
                                  group_width=group_width)

    def owner_by_hash(self, key: bytes, group_hash: int, *, group_width: int = 2) -> str | None:
        """``owner`` from the group's placement hash (0: no group), as servers store it."""
        if group_hash == 0:
            owners = self.successors(key_hash(key), 1)
            return owners[0] if owners else None
        slot = key_hash(key) % group_width
        owners = self.successors(key_hash(_SLOT.pack(group_hash, slot)), 1)
        return owners[0] if owners else None

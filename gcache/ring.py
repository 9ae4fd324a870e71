"""Consistent-hash ring: which server owns a key (ARCHITECTURE §3).

Each server gets virtual nodes in proportion to its capacity, at points ``xxh3_64(address#i)``.
A key is owned by the first virtual node clockwise of ``xxh3_64(key)``. With a ``group`` the
placement key is the group: its keys are striped over the first ``group_width`` *distinct*
servers clockwise of the group's hash, chosen per key by ``xxh3_64(key) % width``, so one prefix
tree lives on a small set of servers and one host failure touches only the groups it holds.

The ring is immutable; membership changes build a new one (rings are small: servers × vnodes).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from gcache.keys import key_hash


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
        if group is None:
            owners = self.successors(key_hash(key), 1)
            return owners[0] if owners else None
        stripe = self.successors(key_hash(group), group_width)
        if not stripe:
            return None
        return stripe[key_hash(key) % len(stripe)]

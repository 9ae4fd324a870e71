"""``Fill``: how full the cluster's memory (or, with a cold tier, its disk) is and how much it has
evicted, from the servers' STAT: the reading ``gcache.kv``'s store policies adapt to, typed, so
callers never parse STAT's JSON themselves; and ``sum_tiers``, the servers' per-tier counters
summed (``Client.stats(tiers=True)``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Fill:
    used_bytes: int
    capacity_bytes: int
    evicted_objects: int      # values gone from the cache (with a cold tier: off its disk)
    servers: int              # servers that answered

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.capacity_bytes if self.capacity_bytes else 0.0


def fill_of(stats: Iterable[dict[str, Any] | None]) -> Fill:
    """The ``Fill`` of STAT answers (None for a server that did not answer). With a cold tier a
    value leaves the cache only when the disk evicts it, so the disk's figures count there."""
    used = capacity = evicted = servers = 0
    for stat in filter(None, stats):
        hot, cold = stat["tier"], (stat.get("tiers") or {}).get("cold")
        used += cold["bytes"] if cold else hot["used_bytes"]
        capacity += cold["capacity_bytes"] if cold else hot["capacity_bytes"]
        evicted += hot["evicted_objects"] + (cold["evicted_objects"] if cold else 0)
        servers += 1
    return Fill(used, capacity, evicted, servers)


def sum_tiers(stats: Iterable[dict[str, Any] | None]) -> dict[str, dict[str, int]]:
    """Per-tier counters summed over STAT answers (None for a server that did not answer); a
    server without a cold tier contributes its hot tier only."""
    total: dict[str, dict[str, int]] = {}
    for stat in filter(None, stats):
        tiers = stat.get("tiers") or {"hot": stat["tier"]}
        for tier, values in tiers.items():
            into = total.setdefault(tier, {})
            for key, value in values.items():
                into[key] = into.get(key, 0) + value
    return total

"""Length buckets: which pool of engine instances a prefill of a given length belongs to.

Instances are partitioned into one pool per bucket so that short requests never share a
DP-attention step with a long prefill: under attention DP every rank steps in lockstep, so one
rank's 16K-token chunk of a 200K prompt sets the step time of every short request beside it
(research/router.md §4). The defaults are the source's three tiers, 0–64K, 64K–256K and
256K–1M tokens.

Invariants: ``bounds`` is non-empty and strictly increasing; bucket ``i`` holds the lengths
``bounds[i-1] <= n < bounds[i]`` (upper bounds exclusive, the first bucket starts at 0), so
every length below the last bound has exactly one bucket and none above it has any. The
length routed on is the request's *uncached* prefill (``gcache.router.policy``), not its prompt.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from gcache.errors import ConfigError, InvalidRequest


@dataclass(frozen=True, slots=True)
class Buckets:
    bounds: tuple[int, ...] = (65_536, 262_144, 1_048_576)   # upper bounds in tokens, exclusive

    def __post_init__(self) -> None:
        if not self.bounds:
            raise ConfigError("router.buckets", self.bounds, "needs at least one upper bound")
        if self.bounds[0] <= 0 or any(a >= b for a, b in zip(self.bounds, self.bounds[1:])):
            raise ConfigError("router.buckets", self.bounds,
                              "upper bounds must be positive and strictly increasing")

    def __len__(self) -> int:
        return len(self.bounds)

    def of(self, tokens: int) -> int | None:
        """The index of the bucket holding a prefill of ``tokens`` tokens; None when it is at
        least the last bound (longer than every bucket). Raises InvalidRequest if negative."""
        if tokens < 0:
            raise InvalidRequest(f"a length of {tokens} tokens; lengths are non-negative")
        index = bisect.bisect_right(self.bounds, tokens)
        return index if index < len(self.bounds) else None

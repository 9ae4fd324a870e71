"""What the GCache tier tells vLLM's KV events (and so a router) it holds.

GCache evicts on its own and loses what a dead server held, and tells no engine, so the tier's
``BlockStored`` cannot stand forever. The rule is conservative expiry: a key the tier stored
(or found on a lookup) is announced once, and a ``BlockRemoved`` follows ``ttl_s`` later
unless it was stored or found again meanwhile (which renews it silently). A key that a lookup
or a load finds gone is removed at once. Cost: a router may trust an entry GCache evicted for
up to ``ttl_s`` (its request then computes that part), and forgets entries that are still
there after ``ttl_s`` without use (it routes by the engines' own caches for those). A
server-side eviction feed would make both exact; it does not exist yet.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

Clock = Callable[[], float]


class Announced:
    """Keys announced as stored, oldest deadline first; the events not yet taken."""

    def __init__(self, ttl_s: float, *, clock: Clock = time.monotonic,
                 capacity: int = 1 << 20) -> None:
        if ttl_s <= 0:
            raise ValueError(f"event TTL must be positive; got {ttl_s}")
        self.ttl_s, self._clock, self._capacity = ttl_s, clock, capacity
        self._deadlines: OrderedDict[Hashable, float] = OrderedDict()
        self._events: list[tuple[Hashable, bool]] = []          # (key, removed), in order

    def held(self, keys: Iterable[Hashable]) -> None:
        """``keys`` are in GCache now: announce the new ones, renew the others."""
        deadline = self._clock() + self.ttl_s
        for key in keys:
            if key not in self._deadlines:
                self._events.append((key, False))
            self._deadlines[key] = deadline
            self._deadlines.move_to_end(key)
        while len(self._deadlines) > self._capacity:    # bounded: the oldest are withdrawn
            self._events.append((self._deadlines.popitem(last=False)[0], True))

    def gone(self, keys: Iterable[Hashable]) -> None:
        """``keys`` are not in GCache (a lookup or a load found them missing)."""
        for key in keys:
            if self._deadlines.pop(key, None) is not None:
                self._events.append((key, True))

    def take(self) -> list[tuple[list[Hashable], bool]]:
        """The events since the last call, in order, as runs of keys (stored, or removed when
        the flag is set); expired keys are withdrawn first."""
        now = self._clock()
        while self._deadlines:
            key, deadline = next(iter(self._deadlines.items()))
            if deadline > now:
                break
            del self._deadlines[key]
            self._events.append((key, True))
        runs: list[tuple[list[Hashable], bool]] = []
        for key, removed in self._events:
            if runs and runs[-1][1] == removed:
                runs[-1][0].append(key)
            else:
                runs.append(([key], removed))
        self._events = []
        return runs

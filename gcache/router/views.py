"""One engine instance's view of which prefix pages it holds, on its GPU and in host memory.

The router cannot ask an engine, per request, how much of a prompt it has cached; it keeps a
view per instance and asks that instead (``hit_pages``), and the policy turns the answers into
``InstanceState.gpu_hit_tokens`` and ``host_hit_tokens``. A view is keyed by page hashes, chained
so that a page's hash names its whole prefix; it counts only the leading run of present pages,
as an engine can reuse a page only if every page before it is reused too.

Feeds. Where an engine publishes KV events (vLLM ``--kv-events-config`` with
``"publisher": "zmq"``; the router subscribes), ``BlockStored`` calls ``stored`` with its
``medium`` as the tier, ``BlockRemoved`` calls ``removed``, ``AllBlocksCleared`` calls
``cleared``; the keys are then the engine's own block hashes, and lookups must hash the prompt
the same way. Where an engine publishes none, the router's own routing history feeds it: after
routing a request it calls ``stored`` with the request's pages on the chosen instance, a guess
that the staleness bound retires. When the proxy sees an engine restart (its health check
fails and recovers, or its event sequence starts over), it calls ``cleared``: a restarted
engine has an empty cache, and a router that keeps its old view sends it traffic for nothing
(research/router.md §5). For a hybrid sliding-window model vLLM publishes one ``BlockStored``
per KV-cache group; only the full-attention group's events belong here, since mixing groups'
hashes breaks the chain, and even then the view over-reports what a window-limited engine can
reuse: the policy trusts only GCache's window-safe hit for exactness.

Invariants: at most ``capacity_pages`` pages are held, the least recently stored evicted first;
a page older than ``stale_after_s`` on a tier does not count there, and one stale on every tier
is dropped (lazily, oldest first); "host" answers count GPU pages too. Why bounded and
stale-limited: an unbounded index grows with every distinct prompt until the router runs out
of memory, and a view that never forgets remembers prefixes the engine evicted long ago (both
§5). Thread-safe: the event subscriber's thread feeds a view while request handlers read it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from math import inf

from gcache.errors import ConfigError, InvalidRequest

TIERS = ("gpu", "host")

PageKey = bytes | int


class _Residency:
    """When a page was last stored on each tier; None: not there."""

    __slots__ = ("gpu_at", "host_at")

    def __init__(self) -> None:
        self.gpu_at: float | None = None
        self.host_at: float | None = None

    def newest(self) -> float:
        return max((t for t in (self.gpu_at, self.host_at) if t is not None), default=-inf)


class PrefixView:
    """One instance's view of which page keys (prefix hashes) it holds on GPU and in host memory,
    bounded (LRU, capacity in pages) and evicting, with a staleness bound."""

    def __init__(self, capacity_pages: int, *, stale_after_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if capacity_pages < 1:
            raise ConfigError("router.view_capacity_pages", capacity_pages, "must be >= 1")
        if not stale_after_s > 0:
            raise ConfigError("router.view_stale_after_s", stale_after_s, "must be > 0 seconds")
        self.capacity_pages = capacity_pages
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._pages: OrderedDict[PageKey, _Residency] = OrderedDict()   # oldest first
        self._lock = threading.Lock()

    def stored(self, page_hashes: Sequence[PageKey], *, tier: str = "gpu") -> None:
        """Record ``page_hashes`` (a prefix's pages, in order) as now present on ``tier``."""
        _check_tier(tier)
        with self._lock:
            now = self._clock()
            # Deepest page first, so the head of a prefix is the newest and evicted last:
            # losing a head page would void every page after it.
            for key in reversed(page_hashes):
                residency = self._pages.pop(key, None) or _Residency()
                if tier == "gpu":
                    residency.gpu_at = now
                else:
                    residency.host_at = now
                self._pages[key] = residency
            self._purge(now)
            while len(self._pages) > self.capacity_pages:
                self._pages.popitem(last=False)

    def removed(self, page_hashes: Sequence[PageKey], *, tier: str | None = None) -> None:
        """Forget ``page_hashes`` on ``tier``, or on every tier when None (vLLM's
        ``BlockRemoved`` names its medium: a page evicted from the GPU may stay in host memory).
        Unknown pages are ignored: events for pages a view already evicted are normal."""
        if tier is not None:
            _check_tier(tier)
        with self._lock:
            for key in page_hashes:
                residency = self._pages.get(key)
                if residency is None:
                    continue
                if tier in (None, "gpu"):
                    residency.gpu_at = None
                if tier in (None, "host"):
                    residency.host_at = None
                if residency.gpu_at is None and residency.host_at is None:
                    del self._pages[key]

    def cleared(self) -> None:
        """Forget every page: the engine reset its prefix cache or restarted."""
        with self._lock:
            self._pages.clear()

    def hit_pages(self, page_hashes: Sequence[PageKey], *, tier: str = "gpu") -> int:
        """How many leading pages of ``page_hashes`` are present and fresh on ``tier`` ("host":
        on the GPU or in host memory)."""
        _check_tier(tier)
        with self._lock:
            now = self._clock()
            self._purge(now)
            horizon = now - self.stale_after_s
            count = 0
            for key in page_hashes:
                residency = self._pages.get(key)
                if residency is None or not _is_fresh(residency, tier, horizon):
                    break
                count += 1
            return count

    def __len__(self) -> int:
        """Pages held, at most ``capacity_pages``. Stale pages go lazily, oldest stored first,
        so a few may still be held, though they never count as hits."""
        with self._lock:
            self._purge(self._clock())
            return len(self._pages)

    def __repr__(self) -> str:
        return (f"PrefixView(pages={len(self)}, capacity_pages={self.capacity_pages}, "
                f"stale_after_s={self.stale_after_s})")

    def _purge(self, now: float) -> None:
        """Drop pages stale on every tier. They sit at the front: the order is by last store and
        the clock only moves forward."""
        horizon = now - self.stale_after_s
        while self._pages:
            oldest = next(iter(self._pages.values()))
            if oldest.newest() >= horizon:
                return
            self._pages.popitem(last=False)


def _is_fresh(residency: _Residency, tier: str, horizon: float) -> bool:
    stamps = (residency.gpu_at,) if tier == "gpu" else (residency.gpu_at, residency.host_at)
    return any(t is not None and t >= horizon for t in stamps)


def _check_tier(tier: str) -> None:
    if tier not in TIERS:
        raise InvalidRequest(f"tier {tier!r}; tiers are {', '.join(TIERS)}")

"""Connections to data servers, reused across requests, and which servers are suspect.

A server whose IO failed is *suspect* for ``suspect_s``: requests for it become misses at once,
without a connect attempt, so a dead server costs the engine one timeout, not one per request.
After that window one request probes it again. Idle connections are kept up to ``idle_max`` per
server; a connection that failed is closed, never returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gcache.errors import ConnectFailed
from gcache.sdk.routes import Link


class ServerPool:
    def __init__(self, *, connect: Callable[[str], Link], suspect_s: float, idle_max: int) -> None:
        self._connect = connect
        self._suspect_s = suspect_s
        self._idle_max = idle_max
        self._lock = threading.Lock()
        self._idle: dict[str, list[Link]] = {}
        self._suspect_until: dict[str, float] = {}
        self._closed = False

    def is_suspect(self, address: str) -> bool:
        with self._lock:
            return self._suspect_until.get(address, 0.0) > time.monotonic()

    def acquire(self, address: str) -> Link:
        """An idle or new link. Raises ConnectFailed (also for a suspect server)."""
        with self._lock:
            if self._closed:
                raise ConnectFailed("client is closed")
            if self._suspect_until.get(address, 0.0) > time.monotonic():
                raise ConnectFailed(f"{address} is suspect after a recent failure")
            idle = self._idle.get(address)
            if idle:
                return idle.pop()
        return self._connect(address)

    def release(self, link: Link) -> None:
        with self._lock:
            idle = self._idle.setdefault(link.address, [])
            if not self._closed and not link.closed and len(idle) < self._idle_max:
                idle.append(link)
                return
        link.close()

    def fail(self, link: Link | None, address: str) -> None:
        """Close ``link`` and mark ``address`` suspect, dropping its other idle connections."""
        if link is not None:
            link.close()
        with self._lock:
            self._suspect_until[address] = time.monotonic() + self._suspect_s
            stale = self._idle.pop(address, [])
        for other in stale:
            other.close()

    def suspects(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return sorted(a for a, until in self._suspect_until.items() if until > now)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for links in idle.values():
            for link in links:
                link.close()

"""Connections to data servers, reused across requests, and which servers are suspect.

A server whose IO failed is *suspect* for ``suspect_s``: requests for it become misses at once,
without a connect attempt, so a dead server costs the engine one timeout, not one per request.
After that window one request probes it again. Idle connections are kept up to ``idle_max`` per
server; a connection that failed is closed, never returned.
"""

from __future__ import annotations

import threading
import time

from gcache.errors import ConnectFailed
from gcache.transport.stream import StreamConnection
from gcache.transport.tcp import connect


class ServerPool:
    def __init__(self, *, timeout_s: float, io_size: int, suspect_s: float, idle_max: int) -> None:
        self._timeout_s = timeout_s
        self._io_size = io_size
        self._suspect_s = suspect_s
        self._idle_max = idle_max
        self._lock = threading.Lock()
        self._idle: dict[str, list[StreamConnection]] = {}
        self._suspect_until: dict[str, float] = {}
        self._closed = False

    def is_suspect(self, address: str) -> bool:
        with self._lock:
            return self._suspect_until.get(address, 0.0) > time.monotonic()

    def acquire(self, address: str) -> StreamConnection:
        """An idle or new connection. Raises ConnectFailed (also for a suspect server)."""
        with self._lock:
            if self._closed:
                raise ConnectFailed("client is closed")
            if self._suspect_until.get(address, 0.0) > time.monotonic():
                raise ConnectFailed(f"{address} is suspect after a recent failure")
            idle = self._idle.get(address)
            if idle:
                return idle.pop()
        return connect(address, timeout_s=self._timeout_s, io_size=self._io_size)

    def release(self, conn: StreamConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(conn.peer, [])
            if not self._closed and not conn.closed and len(idle) < self._idle_max:
                idle.append(conn)
                return
        conn.close()

    def fail(self, conn: StreamConnection | None, address: str) -> None:
        """Close ``conn`` and mark ``address`` suspect, dropping its other idle connections."""
        if conn is not None:
            conn.close()
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
        for conns in idle.values():
            for conn in conns:
                conn.close()

"""The running data server: listener, one thread per connection, lease reaper, shutdown.

Threads are named and every loop watches ``stop``; shutdown closes the listener, shuts every
client socket down (which wakes its handler), joins with a bound, and unlinks the arena.
A connection over ``max_connections`` is closed at once rather than queued, so overload shows
up as fast misses in the SDK and never as a stall.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from gcache.config import ServerConfig
from gcache.errors import TransportError
from gcache.server.handler import ConnectionHandler
from gcache.server.tier import HotTier
from gcache.transport.stream import StreamConnection
from gcache.transport.tcp import TcpListener

log = logging.getLogger(__name__)


class DataServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.listener = TcpListener(config.listen, io_size=config.io_size)
        self.address = self.listener.address
        port = self.address.rsplit(":", 1)[1]
        self.tier = HotTier(name=config.shm_name or f"gcache-{port}", size_bytes=config.memory,
                            segment_size=config.segment_size, prefault=config.prefault,
                            lease_ttl_s=config.lease_ttl_s)
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: dict[StreamConnection, threading.Thread] = {}
        self._started_s = time.monotonic()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for name, target in (("gcache-accept", self._accept_loop), ("gcache-reaper",
                                                                     self._reap_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _accept_loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn = self.listener.accept(timeout_s=0.2)
            except TransportError as exc:
                if not self.stop.is_set():
                    log.error("server.accept_failed reason=%s", exc)
                    self.stop.wait(0.1)
                continue
            if conn is None:
                continue
            with self._lock:
                if len(self._conns) >= self.config.max_connections:
                    log.warning("conn.refused peer=%s open=%d", conn.peer, len(self._conns))
                    conn.close()
                    continue
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                          name=f"gcache-conn-{conn.peer}")
                self._conns[conn] = thread
            thread.start()

    def _serve(self, conn: StreamConnection) -> None:
        try:
            ConnectionHandler(conn, self.tier, self.config, stat_extra=self._stat_extra,
                              is_stopping=self.stop.is_set).serve()
        finally:
            with self._lock:
                self._conns.pop(conn, None)

    def _reap_loop(self) -> None:
        period_s = max(0.01, self.config.lease_ttl_s / 4)
        while not self.stop.wait(period_s * random.uniform(0.8, 1.2)):
            expired = self.tier.reap_expired()
            if expired:
                log.warning("lease.expired count=%d", expired)

    def _stat_extra(self) -> dict:
        with self._lock:
            connections = len(self._conns)
        return {"server": {"address": self.address, "connections": connections,
                           "uptime_s": round(time.monotonic() - self._started_s, 3),
                           "io_size": self.config.io_size,
                           "max_value_size": self.config.max_value_size}}

    def shutdown(self, *, join_s: float = 2.0) -> None:
        self.stop.set()
        self.listener.close()
        with self._lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            conn.shutdown()
        deadline = time.monotonic() + join_s
        for thread in [t for _, t in conns] + self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.tier.close(unlink=True)

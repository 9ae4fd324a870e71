"""Payloads being received into held arena room, and cutting off the ones that lag when room is
short.

A PUT holds its extent from the moment its payload starts to flow until the last byte is in.
The connection's transfer deadline (one IO timeout of grace, then ``min_transfer_rate``) bounds
that for ever; but within the grace a peer that sent the first bytes and then trickles holds
room it is not filling, and eight such peers held every segment of a small arena while another
client's puts failed. So while a claim is waiting for held room (``Reclaim.pressed``), every
transfer that has received less than ``min_transfer_rate`` since it started (after
``GRACE_S``) is cut off: its connection is shut down, its handler aborts the write and the
room goes back. A transfer keeping up with the rate is never touched, however large.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from gcache.transport.stream import StreamConnection

log = logging.getLogger(__name__)

GRACE_S = 0.1            # a transfer younger than this is never cut


@dataclass(slots=True)
class Transfer:
    conn: StreamConnection
    started_s: float
    received_at_start: int      # ``conn.received`` when it started
    n_bytes: int


class Transfers:
    """The receives in flight into held room, across connections (thread-safe)."""

    def __init__(self, min_rate: int) -> None:
        self.min_rate = min_rate
        self._lock = threading.Lock()
        self._live: dict[int, Transfer] = {}
        self._ids = 0
        self.cut_off = 0                    # transfers cut off for lagging under pressure

    def start(self, conn: StreamConnection, n_bytes: int) -> int:
        """Register a receive of ``n_bytes`` on ``conn``; returns its id for ``end``."""
        with self._lock:
            self._ids += 1
            self._live[self._ids] = Transfer(conn, time.monotonic(), conn.received, n_bytes)
            return self._ids

    def end(self, transfer_id: int) -> None:
        with self._lock:
            self._live.pop(transfer_id, None)

    def cut_laggards(self, now_s: float | None = None) -> int:
        """Shut down the connections of transfers behind ``min_rate``; returns how many."""
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            lagging = [t for t in self._live.values()
                       if now_s - t.started_s > GRACE_S
                       and t.conn.received - t.received_at_start
                       < (now_s - t.started_s) * self.min_rate]
        for transfer in lagging:
            log.warning("transfer.cut_off peer=%s received=%d of %d after %.2fs: room is short",
                        transfer.conn.peer, transfer.conn.received - transfer.received_at_start,
                        transfer.n_bytes, now_s - transfer.started_s)
            transfer.conn.shutdown()
        with self._lock:
            self.cut_off += len(lagging)
        return len(lagging)

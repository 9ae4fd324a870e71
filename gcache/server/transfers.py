"""Payloads being received into held arena room, and cutting off the ones that lag when room is
short.

A PUT (or a WRITE frame) holds its extent from the moment its payload starts to flow until the
last byte is in. The connection's transfer deadline (one IO timeout of grace, then
``min_transfer_rate``) bounds that for ever; but within the grace a peer that sent its first
bytes and then stalls or trickles holds room it is not filling, and values stored meanwhile
evict older ones to make up for it (eight peers that sent 64 KiB each and then trickled held
every segment of a small arena while another client's puts failed). So when a claim finds no
free room (``reclaim``), it first cuts off every transfer that lags: one that received nothing
for ``STALL_S``, or less than ``min_transfer_rate`` on average since it started (after
``GRACE_S``). Its connection is shut down, its handler gives the write up and the room comes
back. A transfer keeping up with the rate is never touched, however large.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from gcache.transport.stream import StreamConnection

log = logging.getLogger(__name__)

GRACE_S = 0.1            # a transfer younger than this is never cut for its average rate
STALL_S = 1.0            # no byte for this long while room is short: cut


@dataclass(slots=True)
class Transfer:
    conn: StreamConnection
    started_s: float
    received_at_start: int      # ``conn.received`` when it started
    n_bytes: int

    def lags(self, now_s: float, min_rate: int) -> bool:
        elapsed_s = now_s - self.started_s
        got = self.conn.received - self.received_at_start
        quiet_s = now_s - max(self.started_s, self.conn.last_recv_s)
        return quiet_s > STALL_S or (elapsed_s > GRACE_S and got < elapsed_s * min_rate)


class Transfers:
    """The receives in flight into held room, across connections (thread-safe)."""

    def __init__(self, min_rate: int) -> None:
        self.min_rate = min_rate
        self._lock = threading.Lock()
        self._live: dict[int, Transfer] = {}
        self._ids = 0
        self.cut_off = 0                    # transfers cut off for lagging while room was short

    def start(self, conn: StreamConnection, n_bytes: int) -> int:
        """Register a receive of ``n_bytes`` on ``conn``; returns its id for ``end``."""
        with self._lock:
            self._ids += 1
            self._live[self._ids] = Transfer(conn, time.monotonic(), conn.received, n_bytes)
            return self._ids

    def end(self, transfer_id: int) -> None:
        with self._lock:
            self._live.pop(transfer_id, None)

    def cut_laggards(self) -> int:
        """Shut down the connections of the transfers that lag; returns how many (their
        handlers give their room back as they wake)."""
        now_s = time.monotonic()
        with self._lock:
            lagging = [i for i, t in self._live.items() if t.lags(now_s, self.min_rate)]
            cut = [self._live.pop(i) for i in lagging]
            self.cut_off += len(cut)
        for transfer in cut:
            log.warning("transfer.cut_off peer=%s received=%d of %d after %.2fs: room is short",
                        transfer.conn.peer, transfer.conn.received - transfer.received_at_start,
                        transfer.n_bytes, now_s - transfer.started_s)
            transfer.conn.shutdown()
        return len(cut)

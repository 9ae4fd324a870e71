"""Failure detection: heartbeats in the leader's memory, state changes through Raft.

Servers beat every ``heartbeat_interval_s`` to the leader, which only records the time. A
checker thread on the leader turns silence into state: ``suspect_beats`` missed beats make an
alive server suspect, ``dead_timeout_s`` of silence makes it dead (out of the map), and a beat
from a suspect or dead server makes it alive again. Only those transitions are Raft commands,
so a healthy cluster writes nothing. A new leader starts every server's clock at its own
election, giving each the full timeout to reach it.
"""

from __future__ import annotations

import logging
import threading
import time

from gcache.config import MasterConfig
from gcache.errors import MasterError
from gcache.master.raft import RaftGroup
from gcache.master.state import SetState

log = logging.getLogger(__name__)


class Liveness:
    def __init__(self, group: RaftGroup, config: MasterConfig) -> None:
        self.group, self.config = group, config
        self._beats: dict[str, float] = {}
        self._lock = threading.Lock()
        self._leading_since: float | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gcache-liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)

    def beat(self, server_id: str) -> None:
        with self._lock:
            self._beats[server_id] = time.monotonic()

    def beat_ages_s(self) -> dict[str, float]:
        """Seconds since each server's last beat to this member, a copy (for /metrics). Beats
        go to the leader only: on a follower these are stale."""
        now = time.monotonic()
        with self._lock:
            return {server_id: now - beat_s for server_id, beat_s in self._beats.items()}

    def _run(self) -> None:
        period = min(0.25, self.config.heartbeat_interval_s / 2)
        while not self._halt.wait(period):
            try:
                self._check()
            except MasterError as exc:          # no quorum right now: try again next round
                log.warning("liveness.check_failed error=%s", exc)
            except Exception:                   # the thread's top level
                log.exception("liveness.check_crashed")

    def _check(self) -> None:
        now = time.monotonic()
        if not self.group.is_leader():
            self._leading_since = None
            return
        if self._leading_since is None:
            self._leading_since = now
        suspect_after = self.config.suspect_beats * self.config.heartbeat_interval_s
        for server in list(self.group.state.servers.values()):
            with self._lock:
                last = max(self._beats.get(server.id, 0.0), self._leading_since)
            silent = now - last
            target = server.state
            if server.state in ("alive", "suspect") and silent > self.config.dead_timeout_s:
                target = "dead"
            elif server.state == "alive" and silent > suspect_after:
                target = "suspect"
            elif server.state in ("suspect", "dead") and silent <= suspect_after:
                target = "alive"
            if target != server.state:
                log.info("liveness.%s server=%s silent_s=%.1f", target, server.id, silent)
                self.group.submit(SetState(server.id, target))

"""The client's copy of the cluster map, kept current from the masters.

``MapFollower`` fetches the map once at start (briefly waiting for a master), then asks every
``refresh_s`` whether the epoch moved (``GetClusterMap(since_epoch)``: an unchanged map costs a
few bytes). A new map rebuilds the ring over every server the map knows, weighted by
capacity, with the alive and suspect ones owning keys (see ``gcache.placement`` for why the
others stay on it), under the map's placement parameters. When no master answers, the client
keeps placing keys on its cached map, so a master failover or outage never stalls IO; a server
that died meanwhile costs fast misses until a master answers again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gcache.errors import MasterError
from gcache.master_client import MasterClient, jittered
from gcache.placement import PlacedMap, Placement

log = logging.getLogger(__name__)

FIRST_FETCH_S = 5.0       # how long a new client waits for its first map before starting empty


class MapFollower(threading.Thread):
    def __init__(self, link: MasterClient, apply: Callable[[int, PlacedMap], None], *,
                 fallback: Placement, refresh_s: float) -> None:
        """``apply(epoch, placed)`` on every new map; ``fallback``: the placement for maps
        from masters that send none."""
        super().__init__(name="gcache-map", daemon=True)
        self.link, self.apply, self.refresh_s = link, apply, refresh_s
        self.fallback = fallback
        self.epoch = 0
        self._halt = threading.Event()
        self._first = threading.Event()

    def start(self) -> None:
        super().start()
        if not self._first.wait(FIRST_FETCH_S):
            log.warning("map.none_yet masters=%s: every request misses until one answers",
                        ",".join(self.link.addresses))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.link.close()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.refresh()
            except MasterError as exc:
                log.warning("map.refresh_failed epoch=%d error=%s", self.epoch, exc)
            except Exception:      # the thread's top level: keep the cached map
                log.exception("map.refresh_crashed")
            self._halt.wait(jittered(self.refresh_s))

    def refresh(self) -> bool:
        """Fetch the map if its epoch moved; True when it changed."""
        reply = self.link.cluster_map(self.epoch)
        if not reply.changed or reply.epoch < self.epoch:
            # An older map comes from a member that has not caught up: never go back to it.
            self._first.set()
            return False
        placed = PlacedMap.of_map(reply, self.fallback)
        if placed.placement != self.fallback:
            log.info("map.placement %s (the masters'; this client's config says %s)",
                     placed.placement, self.fallback)
        self.apply(reply.epoch, placed)
        log.info("map.updated epoch=%d servers=%d live=%d", reply.epoch,
                 len(placed.address_of), len(placed.ring.live))
        self.epoch = reply.epoch
        self._first.set()
        return True

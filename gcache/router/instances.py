"""The engine instances behind the router: their views, health and load as the router counts it.

Load is the router's own count of what it sent and has not seen finish: a request's uncached
prefill tokens are queued until its first response bytes arrive (for a non-streaming request:
until it ends, as nothing arrives before), then it counts as one running decode until it ends.
An engine cannot be asked this per request, and the router is the one that sends it the work.

Health: an instance is down from its first failed health check or failed connection (or its
second slow check in a row, ``gcache.router.proxy``), and up
again at its next passing check; coming back clears its view and event feed, since a restarted
engine holds no cache (research/router.md §5). An instance that hung (silent past the upstream
read timeout before its first byte) is held down for a while whatever its checks say
(``hold_after_hang``): a hung scheduler behind a live HTTP server passes every check, and each
request sent there would wait out the whole timeout before failing over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from gcache.router.config import InstanceSpec, RouterConfig
from gcache.router.kv_events import EventFeed, EventSubscriber
from gcache.router.policy import InstanceState
from gcache.router.views import PrefixView

log = logging.getLogger(__name__)

MAX_HOLD_DOUBLINGS = 5


class Instance:
    def __init__(self, spec: InstanceSpec, config: RouterConfig) -> None:
        self.spec, self.name, self.block_size = spec, spec.name, config.block_size
        self.view = PrefixView(config.view_capacity_pages,
                               stale_after_s=config.view_stale_after_s)
        self.feed = EventFeed(self.view, config.block_size)
        self.subscriber = EventSubscriber(spec.events, self.feed, name=spec.name) \
            if spec.events else None
        self.healthy = True
        self.queued_prefill_tokens = 0
        self.running_decodes = 0
        self.slow_checks = 0                      # health checks in a row that timed out
        self.hangs = 0                            # requests in a row it went silent on
        self.held_until = 0.0                     # monotonic; down until then after a hang
        self.models: set[str] | None = None       # what it serves; None: every model

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models

    def state(self, hashes: Sequence[bytes]) -> InstanceState:
        gpu = self.view.hit_pages(hashes, tier="gpu") * self.block_size
        host = max(gpu, self.view.hit_pages(hashes, tier="host") * self.block_size)
        return InstanceState(self.name, self.spec.bucket, gpu, host, self.queued_prefill_tokens,
                             self.running_decodes, self.healthy)

    def routed(self, hashes: Sequence[bytes]) -> None:
        """A request with these blocks was sent here: without KV events, the routing history is
        the view (a guess the staleness bound retires)."""
        if self.subscriber is None:
            self.view.stored(hashes)

    def hold_after_hang(self, hold_s: float, why: str) -> None:
        """Down, and kept down for ``hold_s`` doubled per earlier hang in a row (at most
        ``MAX_HOLD_DOUBLINGS`` times): a passing health check does not bring it back sooner."""
        self.hangs += 1
        held_s = hold_s * 2 ** min(self.hangs - 1, MAX_HOLD_DOUBLINGS)
        self.held_until = time.monotonic() + held_s
        self.mark(False, f"{why}; held out of rotation for {held_s:g}s (hang {self.hangs} "
                         "in a row)")

    def answered(self) -> None:
        """It answered a request: a later hang starts the hold afresh."""
        self.hangs = 0

    def mark(self, healthy: bool, why: str) -> None:
        if healthy and time.monotonic() < self.held_until:
            return
        if healthy == self.healthy:
            return
        self.healthy = healthy
        if healthy:
            self.feed.reset()
            log.info("router.instance %s is back (%s); its view starts empty", self.name, why)
        else:
            log.warning("router.instance %s is down: %s", self.name, why)

    def close(self) -> None:
        if self.subscriber is not None:
            self.subscriber.close()

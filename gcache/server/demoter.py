"""The demoter: the background thread that moves values from memory to the cold tier.

It keeps ``headroom`` segments of the arena reusable: it pins the oldest dirty span, re-appends
the values read since they were written (a second chance, once per read), has the others written
to disk (``TieredStore.demote``, outside every lock, each checksum verified first so a flipped
byte in memory is never persisted), then marks the span clean; only clean spans are reused. It
also writes each pinned value (a file's part) to disk as it is committed, or as a restart finds
it in memory only: pinned values never leave memory, but a reboot empties memory.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gcache.server.tiered import TieredStore

log = logging.getLogger(__name__)


class Demoter(threading.Thread):
    """Keeps ``headroom`` arena segments reusable by cleaning the oldest dirty spans, and writes
    pinned values to disk as they are committed."""

    def __init__(self, store: TieredStore, headroom: int) -> None:
        super().__init__(name="gcache-demoter", daemon=True)
        self.store, self.headroom = store, headroom
        self._halt = threading.Event()
        self._kept: deque[bytes] = deque()      # pinned keys to write through

    def write_through(self, key: bytes) -> None:
        """Have ``key``'s pinned value written to disk soon."""
        self._kept.append(key)
        with self.store.hot.space:
            self.store.hot.space.notify_all()

    def run(self) -> None:
        hot = self.store.hot
        while not self._halt.is_set():
            try:
                while self._kept and not self._halt.is_set():
                    self.store.write_kept(self._kept.popleft())
                claim = hot.claim_dirty(self.headroom)
                if claim is None:
                    with hot.space:
                        if not self._kept:
                            hot.space.wait(0.1)
                    continue
                head, live = claim
                demoted = 0
                try:
                    demoted = self.store.demote(hot.reclaim.keep_read(live,
                                                                      self.store.on_disk))
                finally:
                    hot.reclaim.settle(head, demoted=demoted)
            except Exception:      # the thread's top level: log, keep serving
                log.exception("demoter.failed")
                self._halt.wait(0.5)

    def stop(self) -> None:
        self._halt.set()
        with self.store.hot.space:
            self.store.hot.space.notify_all()
        self.join(timeout=5)

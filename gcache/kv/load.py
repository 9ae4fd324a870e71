"""``LoadHandle``: a load in flight, observable layer by layer.

An engine runs layer 0's attention as soon as layer 0's KV is in place, while later layers are
still being fetched; so a load completes per layer, in layer order, and each layer says on its own
whether every one of its objects arrived intact. A layer that did not (a miss, a dead server, a
checksum failure, all misses to the SDK) is reported in ``failed_layers``: the engine recomputes
those tokens instead of attending over garbage.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

log = logging.getLogger(__name__)

Fetch = Callable[[list, list], bool]


class LoadHandle:
    """Completion of one ``KVStore.load``, per layer."""

    def __init__(self, layers: Sequence[int], *, timeout_s: float | None = None) -> None:
        self.layers = tuple(layers)
        self._done = {layer: threading.Event() for layer in self.layers}
        self._ok: dict[int, bool] = {}
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def run(self, plan: list[tuple[int, list, list]], fetch: Fetch) -> None:
        """Fetch each layer's objects in order (runs on a loader thread)."""
        for layer, keys, outs in plan:
            ok = False
            try:
                late = self._deadline is not None and time.monotonic() > self._deadline
                ok = not late and fetch(keys, outs)
            except Exception:  # a loader thread's top level: log, count as failed, go on
                log.exception("kv load of layer %d failed", layer)
            finally:
                self._ok[layer] = ok
                self._done[layer].set()

    def wait_layer(self, layer: int, timeout_s: float | None = None) -> bool:
        """Block until ``layer`` is loaded; True when all of it arrived intact. False on a
        failure, or when ``timeout_s`` passes first. A layer this load does not cover is a
        ``KeyError``."""
        if not self._done[layer].wait(timeout_s):
            return False
        return self._ok[layer]

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every layer is loaded; True when all arrived intact."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for layer in self.layers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.wait_layer(layer, left) and not self._done[layer].is_set():
                return False
        return not self.failed_layers

    def is_layer_done(self, layer: int) -> bool:
        return self._done[layer].is_set()

    @property
    def done(self) -> bool:
        return all(e.is_set() for e in self._done.values())

    @property
    def failed_layers(self) -> list[int]:
        """Layers finished without all of their KV (so far)."""
        return [layer for layer in self.layers if self._done[layer].is_set() and
                not self._ok[layer]]

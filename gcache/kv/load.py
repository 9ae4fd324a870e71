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
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

Fetch = Callable[[list[str], list[memoryview]], list[bool]]  # (keys, outs) -> each out filled whole
LayerPlan = tuple[int, list[str], list[memoryview]]           # (layer, its keys, their outs)
GROUP_BYTES = 4 << 20
GROUP_KEYS = 256


def _groups(plan: list[LayerPlan], group_bytes: int,
            group_keys: int) -> list[list[LayerPlan]]:
    groups: list[list[LayerPlan]] = []
    size = count = 0
    for entry in plan:
        _, keys, outs = entry
        if not groups or size >= group_bytes or count + len(keys) > group_keys:
            groups.append([])
            size = count = 0
        groups[-1].append(entry)
        size += sum(len(o) for o in outs)
        count += len(keys)
    return groups


class LoadHandle:
    """Completion of one ``KVStore.load``, per layer."""

    def __init__(self, layers: Sequence[int], *, timeout_s: float | None = None) -> None:
        self.layers = tuple(layers)
        self._done = {layer: threading.Event() for layer in self.layers}
        self._ok: dict[int, bool] = {}
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.elapsed_s: float | None = None     # the whole load, start to last layer, once done

    def run(self, plan: list[LayerPlan], fetch: Fetch, *,
            group_bytes: int = GROUP_BYTES, group_keys: int = GROUP_KEYS) -> None:
        """Fetch the layers' objects in layer order (runs on a loader thread). Consecutive
        layers share one fetch until it holds ``group_bytes`` or ``group_keys``: a hybrid
        model's sliding layers hold one small tail each, and a round trip per layer made
        MiMo's 70-layer load 70 round trips; a layer of full pages at real size fills a
        group alone, so layer 0 still arrives first."""
        for group in _groups(plan, group_bytes, group_keys):
            filled: list[bool] = []
            try:
                late = self._deadline is not None and time.monotonic() > self._deadline
                if not late:
                    filled = fetch([k for _, keys, _ in group for k in keys],
                                   [o for _, _, outs in group for o in outs])
            except Exception:  # a loader thread's top level: log, count as failed, go on
                log.exception("kv load of layers %s failed", [layer for layer, _, _ in group])
            finally:
                at = 0
                for layer, keys, _ in group:
                    mine = filled[at:at + len(keys)]
                    self._ok[layer] = len(mine) == len(keys) and all(mine)
                    self._done[layer].set()
                    at += len(keys)

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

"""The linker's layer counter, timed: how long SGLang's forward waited for a layer to land.

SGLang's forward calls ``wait_until(layer)`` before each layer of a batch that loads; the time
it blocks there is the load's cost the forward could not hide (``layer_wait`` of
``gcache.kv.load_phases``). A batch without a load returns at once and is not recorded, so the
histogram counts only what loading requests waited.
"""

from __future__ import annotations

import time

from gcache.kv import LoadPhases
from gcache_sglang._compat import LayerWiseLoadCounter


def batch_id(index: int) -> str:
    """The name a load batch's phases are kept under (SGLang loads requests by batch)."""
    return f"sglang-load-{index}"


class TimedLoadCounter(LayerWiseLoadCounter):
    """``LayerWiseLoadCounter`` that marks each wait of a loading batch's forward."""

    def __init__(self, num_layers: int, phases: LoadPhases) -> None:
        super().__init__(num_layers)
        self.phases = phases

    def wait_until(self, threshold: int) -> None:
        index = self.consumer_index
        if index not in self.futures:
            super().wait_until(threshold)
            return
        began = time.perf_counter()
        super().wait_until(threshold)
        self.phases.add(batch_id(index), "layer_wait", time.perf_counter() - began)

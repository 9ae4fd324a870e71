"""Test-only linker that SGLang loads by module path (``linker_module_path``): the GCache linker,
except that on its ``GCACHE_TEST_KILL_ON_LOAD``-th load batch of at least two pages (the
engine's own one-page warm-up request may load too) it SIGKILLs the gcache-server
``GCACHE_TEST_KILL_PID`` once the batch's first layer has landed: a server dies in the middle of
a layer-by-layer load, every time, at the same point."""

from __future__ import annotations

import os
import signal
import time

from gcache_sglang.linker import GCacheLinker


class KillingLinker(GCacheLinker):
    _batches = 0
    _armed = -1                                     # the counter index of the batch to kill in

    def start_layer_wise_loading(self) -> int:
        pages = sum(len(keys) for plan in self.pending_loads.values()
                    for name, keys, _ in plan if name == "kv")
        if pages >= 2:                              # armed before the load thread sees it
            self._batches += 1
            if self._batches == int(os.environ["GCACHE_TEST_KILL_ON_LOAD"]):
                self._armed = self.layer_done_counter.producer_index + 1
        return super().start_layer_wise_loading()

    def _read_layer(self, index, layer, keys, starts) -> None:
        super()._read_layer(index, layer, keys, starts)
        if index == self._armed and layer.layer == 0:
            kill(int(os.environ["GCACHE_TEST_KILL_PID"]))


def kill(pid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL ``pid`` (not our child: its parent reaps it) and wait until it no longer runs."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)

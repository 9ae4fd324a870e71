"""``LossyECConnector``: the GCache EC connector, and a GCache server SIGKILLed between the
scheduler's probe and the worker's read. For ``run_engine.py`` (``ec_kill_on_load``), which
vLLM loads by module path as it loads the real one (``ec_connector_module_path``).

The scheduler side kills the server named by ``test_kill_on_load`` in the extra config
(``[pid, "host:port"]``) right after the first step whose metadata plans a read (the probe
found the item), and returns once the server refuses connections, so the worker's read of that
step is the one that finds it gone. Once per engine.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

from gcache_vllm.ec_connector import GCacheECConnector

DEAD_WITHIN_S = 10.0


class LossyECConnector(GCacheECConnector):
    def __init__(self, vllm_config: Any, role: Any) -> None:
        super().__init__(vllm_config, role)
        extra = vllm_config.ec_transfer_config.ec_connector_extra_config or {}
        self._victim = extra.get("test_kill_on_load")

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        meta = super().build_connector_meta(scheduler_output)
        if meta.loads and self._victim:
            (pid, address), self._victim = self._victim, None
            os.kill(pid, signal.SIGKILL)
            wait_refused(address)
            print(f"KILLED {pid} after planning the read of {meta.loads}", flush=True)
        return meta


def wait_refused(address: str) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + DEAD_WITHIN_S
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
        except OSError:
            return
        time.sleep(0.05)
    raise AssertionError(f"the server at {address} still accepts after {DEAD_WITHIN_S} s")

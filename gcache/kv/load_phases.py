"""Where a hit's time to first token goes, phase by phase, as an engine's connector sees it.

The connectors of both engines mark the same phases of every request that loads from GCache:
- ``probe``: the scheduler's match (the wait for its probe of the servers);
- ``parked``: how long vLLM (or SGLang) kept the request waiting for an asynchronous load,
  from the step that placed the load to the step that learnt it was done;
- ``fetch``: the load through the SDK, from its start to its last layer's bytes in host memory;
- ``place``: putting fetched bytes into the engine's KV memory (copies, scatters, host to
  device), summed over layers;
- ``layer_wait``: how long the forward pass waited for a layer that had not arrived yet;
- ``save_wait``: the save work the forward pass waited for at its end.
Phases overlap (a fetch runs while the request is parked), so they are reported side by side,
not summed. Each is observed in ``gcache_kv_load_phase_seconds{engine, phase}`` (Prometheus, in
the engine's process: an SGLang engine started with ``--enable-metrics`` serves its scheduler's
on ``/metrics``) and kept per request until ``take`` hands them out (the benchmark reads them
after each request of an in-process engine); ``bytes`` counts what was placed, also in
``gcache_kv_load_bytes_total{engine}``.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from prometheus_client import Counter, Histogram

from gcache.kv.metrics import LOAD_BUCKETS_S

PHASES = ("probe", "parked", "fetch", "place", "layer_wait", "save_wait")
KEPT_REQUESTS = 4096        # requests kept for ``take`` at most (the oldest go first)

PHASE_SECONDS = Histogram("gcache_kv_load_phase_seconds",
                          "Time a loading request spent in each phase of its time to first token",
                          ["engine", "phase"], buckets=LOAD_BUCKETS_S)
PLACED_BYTES = Counter("gcache_kv_load_bytes", "Bytes a connector placed into the engine's KV "
                       "memory from GCache", ["engine"])


class LoadPhases:
    """Thread-safe: the scheduler, the forward pass and the loader threads all mark."""

    def __init__(self, engine: str, *, kept: int = KEPT_REQUESTS) -> None:
        self.engine = engine
        self.kept = kept
        self._lock = threading.Lock()
        self._requests: dict[str, dict[str, float]] = {}

    def add(self, req_id: str, phase: str, seconds: float) -> None:
        """``seconds`` more of ``phase`` for ``req_id`` (a phase this module does not name is
        a ``ValueError``: a typo must not create a series)."""
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r} is not one of {PHASES}")
        PHASE_SECONDS.labels(self.engine, phase).observe(seconds)
        self._bump(req_id, phase, seconds)

    def placed(self, req_id: str, n_bytes: int) -> None:
        PLACED_BYTES.labels(self.engine).inc(n_bytes)
        self._bump(req_id, "bytes", n_bytes)

    def _bump(self, req_id: str, name: str, amount: float) -> None:
        with self._lock:
            phases = self._requests.get(req_id)
            if phases is None:
                if len(self._requests) >= self.kept:
                    del self._requests[next(iter(self._requests))]
                phases = self._requests[req_id] = defaultdict(float)
            phases[name] += amount

    def take(self) -> dict[str, dict[str, float]]:
        """Every request's phases so far (seconds; ``bytes`` placed), forgotten here."""
        with self._lock:
            out = {req: dict(phases) for req, phases in self._requests.items()}
            self._requests = {}
        return out


_RECORDERS: dict[str, LoadPhases] = {}
_RECORDERS_LOCK = threading.Lock()


def load_phases(engine: str) -> LoadPhases:
    """The process's recorder for ``engine`` (``vllm``, ``sglang``): one, shared by the
    scheduler and the workers of an engine in this process."""
    with _RECORDERS_LOCK:
        if engine not in _RECORDERS:
            _RECORDERS[engine] = LoadPhases(engine)
        return _RECORDERS[engine]

"""The connector's figures in vLLM's own metrics: ``GCacheStats`` is the ``KVConnectorStats``
that vLLM collects from the scheduler and every worker each step, adds up (``aggregate``) and
logs every interval (``reduce``, in its "KV Transfer metrics" line).

Counts are summed; latencies are kept as samples until the interval's reduce (mean and max in
milliseconds). SDK misses are counted by reason (``miss_absent``, ``miss_timeout``, ...), the
connector's own errors by kind (``failed_layers``, ``save_errors``, ``skipped_saves``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gcache_vllm._compat import KVConnectorStats

SAMPLES = ("load_wait_s", "save_s", "load_times")   # load_times: [tokens, seconds] per load


@dataclass
class GCacheStats(KVConnectorStats):
    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> GCacheStats:
        for key, value in other.data.items():
            if key in SAMPLES:
                self.data.setdefault(key, []).extend(value)
            else:
                self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {}
        for key, value in sorted(self.data.items()):
            if key == "load_times":
                tokens = sum(t for t, _ in value)
                if tokens:              # what the scheduler weighs against recomputing them
                    out["load_us_per_token"] = round(1e6 * sum(s for _, s in value) / tokens, 3)
            elif key in SAMPLES:
                if value:
                    name = key.removesuffix("_s")
                    out[f"{name}_mean_ms"] = round(1000 * sum(value) / len(value), 3)
                    out[f"{name}_max_ms"] = round(1000 * max(value), 3)
            else:
                out[key] = value
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


def take_delta(current: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """What ``current`` counters gained since ``last`` (which is updated to ``current``)."""
    delta = {k: v - last.get(k, 0) for k, v in current.items() if v != last.get(k, 0)}
    last.clear()
    last.update(current)
    return delta

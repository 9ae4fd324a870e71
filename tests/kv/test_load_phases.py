"""``gcache.kv.load_phases``: what the connectors mark per loading request, and what Prometheus
sees of it (the SGLang benchmark reads an engine's phases from its ``/metrics``)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from gcache.kv import LoadPhases, load_phases


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_phases_are_kept_per_request_and_handed_out_once():
    phases = LoadPhases("unit")
    phases.add("r1", "probe", 0.25)
    phases.add("r1", "fetch", 0.5)
    phases.add("r1", "fetch", 0.25)
    phases.placed("r1", 4096)
    phases.add("r2", "layer_wait", 0.125)
    assert phases.take() == {"r1": {"probe": 0.25, "fetch": 0.75, "bytes": 4096},
                             "r2": {"layer_wait": 0.125}}
    assert phases.take() == {}


def test_prometheus_counts_every_phase_and_the_bytes_placed():
    phases = LoadPhases("unit-prom")
    before = sample("gcache_kv_load_phase_seconds_sum", engine="unit-prom", phase="fetch")
    placed = sample("gcache_kv_load_bytes_total", engine="unit-prom")
    phases.add("r", "fetch", 0.5)
    phases.placed("r", 1 << 20)
    assert sample("gcache_kv_load_phase_seconds_sum", engine="unit-prom",
                  phase="fetch") == before + 0.5
    assert sample("gcache_kv_load_bytes_total", engine="unit-prom") == placed + (1 << 20)


def test_a_phase_not_named_is_refused():
    with pytest.raises(ValueError, match="'fecth' is not one of"):
        LoadPhases("unit").add("r", "fecth", 1.0)


def test_requests_kept_are_bounded_oldest_first():
    phases = LoadPhases("unit", kept=3)
    for i in range(5):
        phases.add(f"r{i}", "probe", 1.0)
    assert sorted(phases.take()) == ["r2", "r3", "r4"]


def test_one_recorder_per_engine_in_a_process():
    assert load_phases("vllm") is load_phases("vllm")
    assert load_phases("vllm") is not load_phases("sglang")

"""Helpers shared by the tests: waiting on conditions and reading Prometheus counters."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import REGISTRY


def wait_until(predicate: Callable[[], object], timeout_s: float, *,
               period_s: float = 0.02) -> None:
    """Poll ``predicate`` until it is truthy; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(period_s)
    raise AssertionError(f"condition not met within {timeout_s}s")


def sdk_metric(name: str, **labels: str) -> float:
    """Sum of a metric's samples (over all labels unless some are given)."""
    total = 0.0
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total

"""Prometheus metrics of a data server: the tier's own counters, read at scrape time, and the
request loop's latency and value bytes.

A collector rather than counters updated on the hot path for everything the tier already counts
under its lock: a scrape every few seconds is cheaper than an increment per request. What only
the connection handler sees is counted there, once per request: ``gcache_server_op_seconds{op}``
(from the request's header to the end of its reply, payloads included) and
``gcache_server_bytes_total{direction}``, value bytes in (PUT, BATCH_PUT, WRITE over the socket
or in place) and out (GET, BATCH_GET, and LEASE / BATCH_LEASE, whose values a same-host or RDMA
client copies itself; a READ moves bytes of a lease already counted), so a dashboard's GB/s
covers every transport. Label children are resolved once here: ``labels()`` takes a lock.
Per tenant (``tenant_stats``; the administrator's keys as ``_admin``), with a ``tenant`` label:
``gcache_server_tenant_bytes{tier}`` and ``..._quota_bytes{tier}`` (memory, disk),
``..._pinned_bytes``, and the counters ``..._hits_total``, ``..._misses_total``,
``..._puts_total``, ``..._evictions_total`` and ``..._refusals_total`` (NO_SPACE answers and
refused AUTHs).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gcache.frame import Op
from gcache.metrics_http import serve_metrics_http
from gcache.server.tenant_stats import tenant_figures
from gcache.server.tier_protocol import Upkeep

if TYPE_CHECKING:
    from gcache.server.daemon import DataServer

# From a same-host lease (tens of µs) to a large value over a slow link (seconds).
LATENCY_BUCKETS_S = (50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
OP_SECONDS = Histogram("gcache_server_op_seconds", "Time to serve one request, by op", ["op"],
                       buckets=LATENCY_BUCKETS_S)
VALUE_BYTES = Counter("gcache_server_bytes", "Value bytes received (in) and sent (out)",
                      ["direction"])
OP_TIMERS = {op: OP_SECONDS.labels(op.name.lower()) for op in Op}
BYTES_IN, BYTES_OUT = VALUE_BYTES.labels("in"), VALUE_BYTES.labels("out")

_COUNTERS = {"hits": "gcache_server_hits_total", "misses": "gcache_server_misses_total",
             "puts": "gcache_server_puts_total", "deletes": "gcache_server_deletes_total",
             "checksum_failures": "gcache_server_checksum_failures_total",
             "evicted_objects": "gcache_server_evicted_objects_total",
             "evicted_segments": "gcache_server_evicted_segments_total",
             "expired_pins": "gcache_server_expired_pins_total",
             "unreachable_evicted": "gcache_server_unreachable_evicted_total",
             "young_spans_reclaimed": "gcache_server_young_spans_reclaimed_total",
             "pin_waits_expired": "gcache_server_pin_waits_expired_total"}
_GAUGES = {"objects": "gcache_server_objects", "bytes": "gcache_server_value_bytes",
           "capacity_bytes": "gcache_server_capacity_bytes",
           "used_bytes": "gcache_server_used_bytes", "pins": "gcache_server_pins",
           "pinned_objects": "gcache_server_pinned_objects",
           "pinned_bytes": "gcache_server_pinned_bytes",
           "pin_budget_bytes": "gcache_server_pin_budget_bytes",
           "unreachable_objects": "gcache_server_unreachable_objects",
           "unreachable_bytes": "gcache_server_unreachable_bytes"}


class TierCollector(Collector):
    def __init__(self, server: DataServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        stats = self._server.tier.stats()
        for key, name in _COUNTERS.items():
            yield CounterMetricFamily(name, f"hot tier {key}", value=stats[key])
        for key, name in _GAUGES.items():
            yield GaugeMetricFamily(name, f"hot tier {key}", value=stats[key])
        tier = self._server.tier
        tiers = tier.tier_stats() if isinstance(tier, Upkeep) else None
        if tiers is not None:
            yield from _per_tier(tiers)
        yield from _per_tenant(tenant_figures(tier, self._server.tenants))


_TENANT_COUNTERS = {"hits": "hits", "misses": "misses", "puts": "puts",
                    "evicted_objects": "evictions", "refusals": "refusals"}


def _per_tenant(figures: dict[str, dict[str, int]]) -> Iterator[Metric]:
    """``gcache_server_tenant_*`` with a ``tenant`` label (see the module docstring)."""
    held = GaugeMetricFamily("gcache_server_tenant_bytes", "bytes a tenant holds, by tier",
                             labels=["tenant", "tier"])
    quota = GaugeMetricFamily("gcache_server_tenant_quota_bytes", "a tenant's quota, by tier",
                              labels=["tenant", "tier"])
    pinned = GaugeMetricFamily("gcache_server_tenant_pinned_bytes",
                               "bytes of spans holding a tenant's pinned values",
                               labels=["tenant"])
    counters = {key: CounterMetricFamily(f"gcache_server_tenant_{name}",
                                         f"a tenant's {name}", labels=["tenant"])
                for key, name in _TENANT_COUNTERS.items()}
    for tenant, row in figures.items():
        for tier in ("memory", "disk"):
            held.add_metric([tenant, tier], row[f"{tier}_bytes"])
            quota.add_metric([tenant, tier], row[f"{tier}_quota_bytes"])
        pinned.add_metric([tenant], row["pinned_bytes"])
        for key, family in counters.items():
            family.add_metric([tenant], row[key])
    yield from (held, quota, pinned, *counters.values())


def _per_tier(tiers: dict[str, dict[str, int]]) -> Iterator[Metric]:
    """``gcache_server_tier_*`` with a ``tier`` label (hot, cold): counters end in _total."""
    names = sorted({key for values in tiers.values() for key in values})
    for key in names:
        gauge = key in ("bytes", "objects", "capacity_bytes")
        family = (GaugeMetricFamily if gauge else CounterMetricFamily)(
            f"gcache_server_tier_{key}", f"per-tier {key}", labels=["tier"])
        for tier, values in tiers.items():
            if key in values:
                family.add_metric([tier], values[key])
        yield family


def serve_metrics(address: str, server: DataServer) -> None:
    """Register the collector and serve /metrics on ``address`` from a daemon thread, behind
    the cluster token when there is one."""
    REGISTRY.register(TierCollector(server))
    serve_metrics_http(address, lambda: generate_latest(REGISTRY), token=server.config.token,
                       content_type=CONTENT_TYPE_LATEST)

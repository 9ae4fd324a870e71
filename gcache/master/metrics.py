"""Prometheus metrics of a master: the Raft group and liveness read at scrape time, and the
time each RPC takes.

``gcache_master_heartbeat_age_seconds{server}`` (seconds since each server's last beat) is
exported by the leader only: beats go to the leader, so a follower's ages are of beats it saw
while it led, if ever, and would read as servers going silent. The label is a server id,
bounded by the cluster's size. RPC latency is one wrapper (``timed``) on each servicer method,
with the label children resolved at import: ``labels()`` takes a lock.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gcache.master.liveness import Liveness
from gcache.master.raft import RaftGroup
from gcache.master.state import STATES
from gcache.metrics_http import serve_metrics_http

P = ParamSpec("P")
R = TypeVar("R")

RPCS = ("Register", "Heartbeat", "GetClusterMap", "Drain", "Leave", "Status", "AnnounceEngine",
        "ListEngines", "AddTenant", "SetTenant", "RevokeTenant", "RemoveTenant", "GetTenants")
# From a map answered out of memory (tens of µs) to a Raft commit under an election (seconds).
LATENCY_BUCKETS_S = (50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RPC_SECONDS = Histogram("gcache_master_rpc_seconds", "Time to answer one RPC, by method",
                        ["rpc"], buckets=LATENCY_BUCKETS_S)
_RPC_TIMERS = {rpc: RPC_SECONDS.labels(rpc) for rpc in RPCS}


def timed(method: Callable[P, R]) -> Callable[P, R]:
    """Observe each call of the servicer method ``method`` (named as in master.proto) in
    ``gcache_master_rpc_seconds``, refusals and aborts included."""
    timer = _RPC_TIMERS[method.__name__]

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        started_s = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            timer.observe(time.perf_counter() - started_s)
    return wrapper


class MasterCollector(Collector):
    def __init__(self, group: RaftGroup, liveness: Liveness) -> None:
        self._group = group
        self._liveness = liveness

    def collect(self) -> Iterator[Metric]:
        state = self._group.state
        leading = self._group.is_leader()
        yield GaugeMetricFamily("gcache_master_is_leader", "1 on the Raft leader",
                                value=int(leading))
        yield GaugeMetricFamily("gcache_master_raft_term", "current Raft term",
                                value=self._group.term())
        yield GaugeMetricFamily("gcache_master_map_epoch", "cluster map epoch", value=state.epoch)
        servers = GaugeMetricFamily("gcache_master_servers", "data servers by state",
                                    labels=["state"])
        records = list(state.servers.values())
        for name in STATES:
            servers.add_metric([name], sum(r.state == name for r in records))
        yield servers
        ages = GaugeMetricFamily("gcache_master_heartbeat_age_seconds",
                                 "seconds since each server's last heartbeat (on the leader)",
                                 labels=["server"])
        if leading:
            # a server that left keeps its last beat in liveness: it is no gap in the cluster
            present = {r.id for r in records if r.state != "left"}
            for server_id, age_s in sorted(self._liveness.beat_ages_s().items()):
                if server_id in present:
                    ages.add_metric([server_id], age_s)
        yield ages


def serve_metrics(address: str, group: RaftGroup, liveness: Liveness, *,
                  token: str | None) -> None:
    """Register the collector and serve /metrics on ``address`` from a daemon thread, behind
    the cluster token when there is one."""
    REGISTRY.register(MasterCollector(group, liveness))
    serve_metrics_http(address, lambda: generate_latest(REGISTRY), token=token,
                       content_type=CONTENT_TYPE_LATEST)

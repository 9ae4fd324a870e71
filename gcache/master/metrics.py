"""Prometheus metrics of a master, read from the Raft group at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gcache.master.raft import RaftGroup
from gcache.master.state import STATES
from gcache.metrics_http import serve_metrics_http


class MasterCollector(Collector):
    def __init__(self, group: RaftGroup) -> None:
        self._group = group

    def collect(self) -> Iterator[Metric]:
        state = self._group.state
        yield GaugeMetricFamily("gcache_master_is_leader", "1 on the Raft leader",
                                value=int(self._group.is_leader()))
        yield GaugeMetricFamily("gcache_master_raft_term", "current Raft term",
                                value=self._group.term())
        yield GaugeMetricFamily("gcache_master_map_epoch", "cluster map epoch", value=state.epoch)
        servers = GaugeMetricFamily("gcache_master_servers", "data servers by state",
                                    labels=["state"])
        records = list(state.servers.values())
        for name in STATES:
            servers.add_metric([name], sum(r.state == name for r in records))
        yield servers


def serve_metrics(address: str, group: RaftGroup, *, token: str | None) -> None:
    """Register the collector and serve /metrics on ``address`` from a daemon thread, behind
    the cluster token when there is one."""
    REGISTRY.register(MasterCollector(group))
    serve_metrics_http(address, lambda: generate_latest(REGISTRY), token=token,
                       content_type=CONTENT_TYPE_LATEST)

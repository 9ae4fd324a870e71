"""/metrics of a real master and a real server move with traffic, and every query of the Grafana
dashboard names a metric that a live scrape exports (the daemons', or an engine process's after
a ``gcache.kv`` save and load), not one from a list."""

from __future__ import annotations

import json
import os
import pathlib
import re
import urllib.request

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gcache import Client
from gcache.cli.arenas import SHM_DIR
from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.cli.ports import free_port
from gcache.kv import KVStore, LayerArrays
from gcache.master_client import MasterClient
from tests.helpers import wait_until
from tests.kv.layouts import hybrid

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gcache.json"
VALUE = b"m" * (64 << 10)
N_KEYS = 8

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Metrics:
    """A cluster of one master and one tiered server, each serving /metrics."""

    def __init__(self, masters: LocalMasters, cluster: LocalCluster, master_port: int,
                 server_port: int) -> None:
        self.masters, self.cluster = masters, cluster
        self.master_url = f"http://127.0.0.1:{master_port}/metrics"
        self.server_url = f"http://127.0.0.1:{server_port}/metrics"

    def master(self) -> Samples:
        return parse(scrape(self.master_url))

    def server(self) -> Samples:
        return parse(scrape(self.server_url))


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.read().decode()


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def exported(samples: Samples) -> set[str]:
    """Names a query can select: the samples' own (a histogram ``x`` is ``x_bucket``,
    ``x_count``, ``x_sum``; a counter ``x`` is ``x_total``), without ``_created``."""
    return {name for name, _ in samples if not name.endswith("_created")}


@pytest.fixture(scope="module")
def metrics(tmp_path_factory):
    logs = tmp_path_factory.mktemp("metrics")
    master_port, server_port = free_port(), free_port()
    disk = logs / "disk"
    disk.mkdir()
    with LocalMasters(1, args=("--metrics-listen", f"127.0.0.1:{master_port}"),
                      log_dir=str(logs / "masters")) as masters, \
            LocalCluster(1, memory="64MiB", master=masters.spec, server_args=(
                "--segment-size", "4MiB", "--metrics-listen", f"127.0.0.1:{server_port}",
                "--disk-dir", str(disk), "--disk-capacity", "256MiB"),
                log_dir=str(logs / "servers")) as cluster:
        with MasterClient(masters.addresses, timeout_s=2.0) as link:
            wait_until(lambda: [s.address for s in link.status().servers] == cluster.addresses,
                       timeout_s=20)
        yield Metrics(masters, cluster, master_port, server_port)
        arena = os.path.join(SHM_DIR, cluster.servers[0].shm_name)
    assert not os.path.exists(arena), f"{arena} outlived its cluster"


def test_counters_and_histograms_move_with_traffic(metrics):
    server0, master0 = metrics.server(), metrics.master()
    keys = [f"traffic-{i}" for i in range(N_KEYS)]
    with Client(master=metrics.masters.spec, timeout_s=5.0, transport="tcp") as client:
        wait_until(lambda: client.stats()["servers"], timeout_s=10)
        assert all(client.put(k, VALUE) for k in keys)
        assert [client.get(k) for k in keys] == [VALUE] * N_KEYS
        assert client.get("traffic-never-put") is None
    server1 = metrics.server()

    def moved(name: str, **labels: str) -> float:
        return value(server1, name, **labels) - value(server0, name, **labels)
    assert moved("gcache_server_op_seconds_count", op="put") == N_KEYS
    assert moved("gcache_server_op_seconds_count", op="get") == N_KEYS + 1
    assert moved("gcache_server_op_seconds_bucket", op="get", le="+Inf") == N_KEYS + 1
    assert moved("gcache_server_op_seconds_sum", op="get") > 0
    assert moved("gcache_server_bytes_total", direction="in") == N_KEYS * len(VALUE)
    assert moved("gcache_server_bytes_total", direction="out") == N_KEYS * len(VALUE)
    assert moved("gcache_server_hits_total") == N_KEYS
    assert moved("gcache_server_misses_total") >= 1

    # Same host: the client copies values in and out of the arena itself (ALLOC, in-place
    # WRITE notices, COMMIT; LEASE, RELEASE), and the server still counts their bytes.
    with Client(metrics.cluster.addresses, timeout_s=5.0, transport="shm") as client:
        assert client.put("traffic-shm", VALUE)
        assert client.get(keys[0]) == VALUE
        assert client.stats()["shm_servers"] == metrics.cluster.addresses
    server2 = metrics.server()
    for op in ("alloc", "commit", "lease"):
        assert value(server2, "gcache_server_op_seconds_count", op=op) > value(
            server1, "gcache_server_op_seconds_count", op=op), op
    for direction in ("in", "out"):
        assert value(server2, "gcache_server_bytes_total", direction=direction) - value(
            server1, "gcache_server_bytes_total", direction=direction) == len(VALUE), direction

    beats0 = value(master0, "gcache_master_rpc_seconds_count", rpc="Heartbeat")
    wait_until(lambda: value(metrics.master(), "gcache_master_rpc_seconds_count",
                             rpc="Heartbeat") > beats0, timeout_s=10)
    master1 = metrics.master()
    assert value(master1, "gcache_master_rpc_seconds_count", rpc="GetClusterMap") > value(
        master0, "gcache_master_rpc_seconds_count", rpc="GetClusterMap")
    assert value(master1, "gcache_master_is_leader") == 1
    ages = [v for (name, _), v in master1.items() if name == "gcache_master_heartbeat_age_seconds"]
    assert len(ages) == 1 and 0 <= ages[0] < 5.0, ages      # one server, beating every 0.5 s


def walk(panels: list[dict]):
    for panel in panels:
        yield panel
        yield from walk(panel.get("panels", []))     # a collapsed row holds its panels


def kv_round_trip(addresses: list[str]) -> None:
    """What a connector does in an engine: save a sequence, look it up, load its hit."""
    layout = hybrid(window=128, page=64, model="metrics-dashboard")
    n = 4 * layout.page_size
    rng = np.random.default_rng(21)
    tokens = rng.integers(0, 50_000, n)
    src = {layer: rng.integers(1, 256, (n, layout.layer_bytes_per_token(layer)), dtype=np.uint8)
           for layer in range(layout.num_layers)}
    out = {layer: np.zeros_like(a) for layer, a in src.items()}
    with Client(addresses, timeout_s=5.0) as client, \
            KVStore(client, layout, policy="tail") as store:
        assert store.save(tokens, LayerArrays(layout, src)).objects_failed == 0
        hit = store.match(tokens)
        assert hit == n
        assert store.load(tokens, hit, LayerArrays(layout, out)).wait(timeout_s=10)


def test_every_dashboard_query_names_a_metric_a_live_scrape_exports(metrics):
    engine0 = parse(generate_latest().decode())
    kv_round_trip(metrics.cluster.addresses)
    engine = parse(generate_latest().decode())       # the engine process's /metrics
    assert value(engine, "gcache_kv_load_seconds_count") == value(
        engine0, "gcache_kv_load_seconds_count") + 1
    assert value(engine, "gcache_kv_hit_tokens_total") > value(engine0,
                                                               "gcache_kv_hit_tokens_total")
    scrapes = {"master": exported(metrics.master()), "server": exported(metrics.server()),
               "sdk": exported(engine), "kv": exported(engine)}

    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] == 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    queries = [v["query"]["query"] for v in variables.values() if v["type"] == "query"]
    panels = [p for p in walk(dashboard["panels"]) if p["type"] != "row"]
    assert len(panels) >= 15
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        queries += [t["expr"] for t in panel["targets"]]
    missing = set()
    named = set()
    for query in queries:
        for name in re.findall(r"\bgcache_[a-z_]+", query):
            named.add(name)
            component = name.split("_")[1]        # a server's metric must be in its scrape
            if name not in scrapes[component]:
                missing.add(name)
    assert not missing, f"dashboard queries name metrics no scrape exports: {sorted(missing)}"
    for wanted in ("gcache_server_tier_hits_total", "gcache_server_bytes_total",
                   "gcache_server_op_seconds_bucket", "gcache_sdk_misses_total",
                   "gcache_master_heartbeat_age_seconds", "gcache_kv_load_seconds_bucket",
                   "gcache_kv_hit_tokens_total", "gcache_server_tier_demoted_objects_total"):
        assert wanted in named, f"no panel queries {wanted}"

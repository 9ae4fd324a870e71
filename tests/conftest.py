"""Fixtures: real gcache-server processes on 127.0.0.1, with shrunken timeouts."""

from __future__ import annotations

import os

import pytest

from gcache.cli.local_cluster import LocalCluster
from gcache.sdk import Client
from gcache.server.arena import ARENA_DIR
from tests import shm_leftovers
from tests.network_hosts import NetworkHosts
from tests.network_hosts import available as network_hosts_unavailable

FAST_SERVER_ARGS = ("--segment-size", "4MiB", "--lease-ttl", "1.0")
# A server offers NIXL whenever it imports, and its agent takes about a second of CPU to start:
# the servers of these tests go without it unless a test passes --nixl (the NIXL suites do).
os.environ.setdefault("GCACHE_SERVER_NIXL", "false")
# The network-host tests reach their namespaces through a bridge, which UCX's TCP transport skips
# unless told; UCX reads its device list once per process, so it is told before any agent.
os.environ.setdefault("UCX_TCP_BRIDGE_ENABLE", "y")
# For the same reason the hosts that NIXL tests reach (fixture ``nixl_network_hosts``) are made
# when collection ends, before any test can start an agent: made later, by a module fixture
# after another module's test had started one, UCX bound to an interface the hosts cannot
# answer and every connect hung until the kernel gave up (2 min each).
_nixl_network_hosts: NetworkHosts | None = None


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """Two servers shared by a module's tests (tests use distinct keys), with the default lease
    TTL: none of these tests waits for a lease to expire, and with 1 s the write window (half
    of it) of a 256-key batch put ran out while make test's other lane ran vLLM engines."""
    with LocalCluster(2, memory="512MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path_factory.mktemp("logs"))) as cluster:
        yield cluster


@pytest.fixture(params=["shm", "tcp"])
def client(request, shared_cluster):
    """A client of the shared cluster, once over shared memory and once over TCP."""
    with Client(shared_cluster.addresses, timeout_s=2.0, transport=request.param) as c:
        yield c
        stats = c.stats()
        did_io = any(v for k, v in stats.items() if k.endswith("_requests"))
        if request.param == "shm" and did_io:        # every server it talked to, over shm
            assert stats["shm_servers"], "no server was reached over shared memory"


@pytest.fixture
def cluster_factory(tmp_path):
    """Start a private cluster: ``cluster_factory(n, memory=..., server_args=...)``."""
    started: list[LocalCluster] = []

    def make(n_servers: int = 1, *, memory: str = "64MiB",
             server_args: tuple[str, ...] = FAST_SERVER_ARGS,
             arena_dir: str = ARENA_DIR) -> LocalCluster:
        cluster = LocalCluster(n_servers, memory=memory, server_args=server_args,
                               log_dir=str(tmp_path / f"cluster{len(started)}"),
                               arena_dir=arena_dir)
        started.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _rdma_available() -> bool:
    import os
    return os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="requires_gpu: no CUDA device on this machine "
                                       "(torch.cuda.is_available() is False)")
    skip_rdma = pytest.mark.skip(reason="requires_rdma: no RDMA device under /sys/class/infiniband")
    gpu, rdma = _cuda_available(), _rdma_available()
    for item in items:
        if "requires_gpu" in item.keywords and not gpu:
            item.add_marker(skip_gpu)
        if "requires_rdma" in item.keywords and not rdma:
            item.add_marker(skip_rdma)


def pytest_collection_finish(session):
    global _nixl_network_hosts
    wanted = any("nixl_network_hosts" in item.fixturenames for item in session.items)
    if wanted and not session.config.option.collectonly and network_hosts_unavailable() is None:
        _nixl_network_hosts = NetworkHosts(2).__enter__()


def pytest_sessionfinish(session):
    global _nixl_network_hosts
    if _nixl_network_hosts is not None:
        _nixl_network_hosts.__exit__()
        _nixl_network_hosts = None


@pytest.fixture(scope="session", autouse=True)
def dev_shm_as_found():
    """The run leaves /dev/shm as it found it (``tests.shm_leftovers``): torn down last, an
    error naming each file left behind."""
    before = shm_leftovers.snapshot()
    yield
    left = shm_leftovers.left_behind(before)
    assert not left, f"left in /dev/shm by this run: {left}"


@pytest.fixture(scope="session")
def nixl_network_hosts() -> NetworkHosts | None:
    """Two network hosts made before the session's first test (see ``_nixl_network_hosts``);
    None where namespaces cannot be made here."""
    return _nixl_network_hosts

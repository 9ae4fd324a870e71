"""A real local GCache cluster for the connector's tests."""

from __future__ import annotations

import os

import pytest

from gcache.cli.local_cluster import LocalCluster

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.fixture(scope="session", autouse=True)
def leaves_dev_shm_as_found():
    """A test run leaves /dev/shm as it found it: engine files (``engine_testing.shm``) that
    appeared during the run and that no process uses fail the run at its end, by name."""
    from engine_testing import shm
    before = shm.names()
    yield
    shm.assert_left_nothing(before)


@pytest.fixture(autouse=True)
def shut_down_connectors():
    """The connectors a test made (``harness.MADE``) release their clients, threads and
    sockets when it ends, as vLLM's shutdown does."""
    yield
    from .harness import MADE
    while MADE:
        connector = MADE.pop()
        if connector is not None:
            connector.shutdown()


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(2, memory="128MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path / "gcache")) as running:
        yield running


@pytest.fixture
def as_transfer_group(monkeypatch):
    """Make ``connector`` vLLM's global KV transfer group, as the worker's init does."""
    from vllm.distributed.kv_transfer import kv_transfer_state

    def install(connector) -> None:
        monkeypatch.setattr(kv_transfer_state, "_KV_CONNECTOR_AGENT", connector)
    return install


@pytest.fixture
def managers():
    """vLLM tiering managers a test builds (``engine_testing.vllm_tiering.build_manager``), shut
    down after it; then none of their CPU tiers is still mapped (a view the tier kept, or gave
    away, would keep it)."""
    from engine_testing.vllm_tiering import build_manager, offload_mappings
    made = []
    mapped = offload_mappings()

    def make(*args, **kwargs):
        made.append(build_manager(*args, **kwargs))
        return made[-1]

    yield make
    for manager in made:
        manager.shutdown()
    assert offload_mappings() <= mapped, "a CPU tier is still mapped after its shutdown"

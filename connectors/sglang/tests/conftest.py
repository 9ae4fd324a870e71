"""A real local GCache cluster for the connector's tests (real servers, real sockets)."""

from __future__ import annotations

import pytest

from gcache.cli.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(2, memory="256MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path_factory.mktemp("gcache-logs"))) as running:
        yield running


@pytest.fixture(scope="session", autouse=True)
def leaves_dev_shm_as_found():
    """A test run leaves /dev/shm as it found it: engine files (``engine_testing.shm``) that
    appeared during the run and that no process uses fail the run at its end, by name."""
    from engine_testing import shm
    before = shm.names()
    yield
    shm.assert_left_nothing(before)

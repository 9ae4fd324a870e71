"""A real local GCache cluster for the connector's tests (real servers, real sockets)."""

from __future__ import annotations

import os
import pathlib

import pytest

from gcache.cli.local_cluster import LocalCluster

from .engine import Engine


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


@pytest.fixture
def gcache(tmp_path):
    """A two-server cluster of the engine tests' own (each test a fresh one)."""
    with LocalCluster(2, memory="256MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path / "gcache")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def forkserver(tmp_path_factory):
    """One process that imported SGLang's server, which every test engine's server process is
    forked from (``engine_testing.forkserver``): 12-15 s of CPU an engine less on these
    machines. Its environment is the engines' own, but for what ``Engine`` adds per engine."""
    from engine_testing.forkserver import Forkserver
    connectors = str(pathlib.Path(__file__).resolve().parents[2])
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "SGLANG_PLUGINS": "cpu_testshim",
           "PYTHONPATH": os.pathsep.join(filter(None, [connectors,
                                                       os.environ.get("PYTHONPATH")]))}
    server = Forkserver(["sglang.launch_server"], env=env,
                        log=tmp_path_factory.mktemp("forkserver") / "forkserver.log")
    yield server
    server.close()


@pytest.fixture
def engines(tmp_path, forkserver):
    """Starts SGLang engines (``Engine``'s arguments), ready; stops them after the test."""
    started: list[Engine] = []

    def start(*args, **kwargs) -> Engine:
        engine = Engine(*args, log_dir=tmp_path, forkserver=forkserver, **kwargs)
        started.append(engine)
        engine.wait_ready()
        return engine

    yield start
    for engine in started:
        engine.stop()

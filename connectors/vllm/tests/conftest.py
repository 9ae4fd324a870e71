"""A real local GCache cluster, and vLLM's parallel state for one CPU process."""

from __future__ import annotations

import os

import pytest

from gcache.cli.local_cluster import LocalCluster

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(2, memory="128MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path / "gcache")) as running:
        yield running


@pytest.fixture(scope="session", autouse=True)
def one_process_group():
    from .harness import init_one_process_group
    init_one_process_group()

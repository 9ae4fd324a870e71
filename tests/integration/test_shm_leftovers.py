"""The /dev/shm check every suite ends with (``tests.shm_leftovers``) blames a run only for what
it left: not for a neighbour suite's running server (make test's lanes run suites side by side),
whose arena is held open and whose ``.key`` sidecar is not."""

from __future__ import annotations

import os
import uuid

from gcache.cli.local_cluster import LocalCluster
from tests import shm_leftovers


def test_a_running_neighbours_arena_and_sidecars_are_not_left_behind(tmp_path):
    before = shm_leftovers.snapshot()
    with LocalCluster(1, memory="64MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path)) as cluster:
        arena = cluster.servers[0].shm_name
        assert {arena, arena + ".key"} <= shm_leftovers.snapshot()
        assert shm_leftovers.left_behind(before, settle_s=0.1) == []


def test_a_sidecar_whose_arena_is_gone_is_left_behind():
    before = shm_leftovers.snapshot()
    orphan = f"gcache-orphan-{uuid.uuid4().hex[:8]}.key"
    path = os.path.join(shm_leftovers.SHM, orphan)
    with open(path, "wb") as fh:
        fh.write(b"k" * 32)
    try:
        assert shm_leftovers.left_behind(before, settle_s=0.1) == [orphan]
    finally:
        os.unlink(path)

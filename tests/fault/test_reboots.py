"""What a host reboot (the arena in /dev/shm gone) and a power cut (what was not synced gone
too) leave of a server's values (real servers with a cold tier, real RocksDB and files).

A power cut is simulated by ``powercut/powercut.c``, an LD_PRELOAD library that keeps beside
the cold tier's directory a copy of what a real power cut would leave of it (each file as of its
last fsync); the test SIGKILLs the server, puts that copy in the directory's place and removes
the arena, as a reboot would.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

from gcache.cli.local_cluster import SIDECARS
from gcache.sdk import Client
from tests.helpers import wait_until

SHIM = pathlib.Path(__file__).resolve().parent / "powercut" / "powercut.c"


@pytest.fixture(scope="module")
def powercut_library(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("powercut") / "powercut.so"
    subprocess.run(["cc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(out), str(SHIM), "-ldl"],
                   check=True, timeout=120)
    return str(out)


def reboot(cluster, *, disk: pathlib.Path | None = None) -> None:
    """The server gone (killed when ``disk`` is given: a power cut, its disk back as synced;
    stopped otherwise), /dev/shm emptied of its arena, the server started again."""
    server = cluster.servers[0]
    if disk is None:
        assert cluster.terminate(0) == 0
    else:
        cluster.kill(0)
        shutil.rmtree(disk)
        shutil.copytree(f"{disk}.durable", disk)
    arena = os.path.join(cluster.arena_dir, server.shm_name)
    for path in (arena, *(arena + suffix for suffix in SIDECARS)):
        if os.path.exists(path):
            os.unlink(path)
    cluster.restart(0)


def cold_objects(client: Client, address: str) -> int:
    stats = client.server_stats()[address]
    return stats["tiers"]["cold"]["objects"] if stats else -1


def test_pinned_values_reach_the_disk_and_a_rebooted_host_serves_them(cluster_factory,
                                                                      tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    cluster = cluster_factory(1, memory="16MiB", server_args=(
        "--segment-size", "1MiB", "--disk-dir", str(disk)))
    address = cluster.addresses[0]
    files = {f"file/model/part-{i}": os.urandom(300 << 10) for i in range(6)}
    with Client([address], timeout_s=5.0) as client:
        assert all(client.put(key, value, pinned=True) for key, value in files.items())
        assert client.put("kv/page", b"p" * 1000)                  # never demoted: memory only
        wait_until(lambda: cold_objects(client, address) == len(files), 10)
    reboot(cluster)
    with Client([address], timeout_s=5.0) as client:
        assert client.list_pinned("file/") == sorted(k.encode() for k in files)
        assert {key: client.get(key) for key in files} == files
        assert client.get("kv/page") is None
        stats = client.server_stats()[address]["tier"]
        assert stats["pinned_objects"] == len(files)               # kept in memory again


def test_an_acknowledged_delete_or_overwrite_survives_a_power_cut(cluster_factory, tmp_path,
                                                                  powercut_library,
                                                                  monkeypatch):
    """A key on disk, deleted (or replaced by a value in memory only), then the power goes:
    its old value never comes back from disk (the delete, and the drop of the old copy, are
    synced before the acknowledgement)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    os.mkdir(f"{disk}.durable")
    monkeypatch.setenv("LD_PRELOAD", powercut_library)
    monkeypatch.setenv("POWERCUT_DIR", str(disk))
    cluster = cluster_factory(1, memory="8MiB", server_args=(
        "--segment-size", "1MiB", "--disk-dir", str(disk)))
    address = cluster.addresses[0]
    with Client([address], timeout_s=5.0) as client:
        for key in ("deleted", "replaced", "kept"):
            assert client.put(key, f"old {key}".encode() * 1000)
        for i in range(24):                                  # 12 MiB through 8: demotions
            assert client.put(f"filler-{i}", os.urandom(512 << 10))
        wait_until(lambda: cold_objects(client, address) >= 3, 10)
    reboot(cluster)                  # a clean stop syncs the disk; memory is gone
    with Client([address], timeout_s=5.0) as client:
        assert client.get("kept") == b"old kept" * 1000       # from disk
        assert client.delete("deleted")
        assert client.put("replaced", b"new value, in memory only")
    reboot(cluster, disk=disk)       # the power goes: only what was synced is left
    with Client([address], timeout_s=5.0) as client:
        assert client.get("kept") == b"old kept" * 1000
        assert client.get("deleted") is None
        assert client.get("replaced") in (None, b"new value, in memory only")

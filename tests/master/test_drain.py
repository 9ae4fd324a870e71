"""Drain: a server hands every key to its owner in the map without it, then leaves. Nothing is
lost, grouped keys included (their group travels with them since the put)."""

import subprocess
import sys

from gcache import Client
from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.master_client import MasterClient
from gcache.proto import master_pb2 as pb
from tests.helpers import wait_until


def servers(masters: LocalMasters) -> list:
    link = MasterClient(masters.addresses, timeout_s=1.0)
    try:
        return list(link.status().servers)
    finally:
        link.close()


def test_a_drained_server_hands_over_every_key_and_leaves(tmp_path):
    with LocalMasters(3, log_dir=str(tmp_path / "m")) as masters, \
            LocalCluster(3, memory="64MiB", master=masters.spec,
                         log_dir=str(tmp_path / "s")) as cluster:
        wait_until(lambda: len(servers(masters)) == 3, 15)
        plain = {f"plain{i}": f"value{i}".encode() * 50 for i in range(150)}
        grouped = {f"seq{g}/{b}": f"block{g}.{b}".encode() * 50
                   for g in range(20) for b in range(8)}
        with Client(master=masters.spec, timeout_s=1.0, map_refresh_s=0.2) as client:
            assert all(client.batch_put(list(plain), list(plain.values())))
            for g in range(20):
                keys = [f"seq{g}/{b}" for b in range(8)]
                assert all(client.batch_put(keys, [grouped[k] for k in keys], group=f"g{g}"))
            victim = next(s for s in servers(masters) if s.address == cluster.addresses[1])
            held = client.server_stats()[victim.address]["tier"]["objects"]
            assert held > 20
            out = subprocess.run([sys.executable, "-m", "gcache.cli", "drain", victim.id,
                                  "--master", masters.spec, "--wait", "60"],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            assert "left" in out.stdout
            wait_until(lambda: not cluster.servers[1].is_running(), timeout_s=10)
            assert cluster.servers[1].proc.returncode == 0
            wait_until(lambda: victim.address not in client.stats()["servers"], timeout_s=5)
            assert client.batch_get(list(plain)) == list(plain.values())
            for g in range(20):
                keys = [f"seq{g}/{b}" for b in range(8)]
                assert client.batch_get(keys, group=f"g{g}") == [grouped[k] for k in keys], g
            assert client.stats()["misses"] == 0
        assert f"handoff.done id={victim.id} moved={held} failed=0" in \
            cluster.tail(cluster.servers[1], 50)


def test_a_drained_server_hands_over_its_disk_resident_keys_too(tmp_path):
    disks = [tmp_path / f"disk{i}" for i in range(3)]
    for disk in disks:
        disk.mkdir()
    with LocalMasters(3, log_dir=str(tmp_path / "m")) as masters, \
            LocalCluster(3, memory="8MiB", master=masters.spec, log_dir=str(tmp_path / "s"),
                         server_args=("--segment-size", "1MiB")) as cluster:
        # One disk directory per server: the flag goes on each server's own command line.
        for server, disk in zip(cluster.servers, disks):
            server.args += ["--disk-dir", str(disk)]
        for i in range(3):
            cluster.terminate(i)
            cluster.restart(i)
        wait_until(lambda: sum(s.state == pb.ALIVE for s in servers(masters)) == 3, 15)
        assert len(servers(masters)) == 3                    # each kept its id
        values = {f"big{i}": bytes([i % 256]) * (200 << 10) for i in range(240)}   # 48 MiB
        with Client(master=masters.spec, timeout_s=2.0, map_refresh_s=0.2) as client:
            for key, value in values.items():
                assert client.put(key, value)
            victim = next(s for s in servers(masters)
                          if s.address == cluster.addresses[0] and s.state == pb.ALIVE)
            wait_until(lambda: client.server_stats()[victim.address]["tiers"]["cold"]["objects"]
                       > 0, timeout_s=10)                   # some of its keys live on disk
            out = subprocess.run([sys.executable, "-m", "gcache.cli", "drain", victim.id,
                                  "--master", masters.spec, "--wait", "90"],
                                 capture_output=True, text=True, timeout=150)
            assert out.returncode == 0, out.stderr
            wait_until(lambda: victim.address not in client.stats()["servers"], timeout_s=5)
            got = {k: client.get(k) for k in values}
            assert got == values


def test_clients_and_a_draining_server_place_keys_by_the_masters_placement(tmp_path):
    """The masters' ``--group-width`` and ``--vnodes`` reach clients and servers in the map:
    a client whose own config says width 2 stripes a group over 3 servers, and a drain hands
    the keys to exactly where that client reads them."""
    with LocalMasters(1, args=("--group-width", "3", "--vnodes", "64"),
                      log_dir=str(tmp_path / "m")) as masters, \
            LocalCluster(4, memory="64MiB", master=masters.spec,
                         log_dir=str(tmp_path / "s")):
        wait_until(lambda: len(servers(masters)) == 4, 15)
        keys = [f"tree/{b}" for b in range(60)]
        values = [f"page{b}".encode() * 40 for b in range(60)]
        with Client(master=masters.spec, timeout_s=1.0, map_refresh_s=0.2) as client:
            assert client.config.group_width == 2
            assert all(client.batch_put(keys, values, group="tree"))
            held = {a: s["tier"]["objects"] for a, s in client.server_stats().items()}
            assert sorted(n > 0 for n in held.values()) == [False, True, True, True], held
            victim_address = max(held, key=held.get)
            victim = next(s for s in servers(masters) if s.address == victim_address)
            out = subprocess.run([sys.executable, "-m", "gcache.cli", "drain", victim.id,
                                  "--master", masters.spec, "--wait", "60"],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            wait_until(lambda: victim_address not in client.stats()["servers"], timeout_s=5)
            assert client.batch_get(keys, group="tree") == values
            assert client.stats()["misses"] == 0
            # the drained slot falls through to a live server clockwise of its anchor, which
            # may hold another slot already: every key is on the three left, not one per slot
            after = {a: s["tier"]["objects"] for a, s in client.server_stats().items()}
            assert len(after) == 3 and sum(after.values()) >= len(keys), after

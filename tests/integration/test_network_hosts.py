"""Servers, masters and clients on different hosts: network namespaces joined by a bridge
(``tests/network_hosts.py``), so they talk over an interface with its own address, as across
machines. A host id names a network namespace too, so shared memory is never offered across
them: same-host clients map the arena, every other client goes over TCP."""

from __future__ import annotations

import json
import sys

import pytest

from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.sdk import Client
from tests.conftest import FAST_SERVER_ARGS
from tests.helpers import wait_until
from tests.network_hosts import NetworkHosts, available

pytestmark = pytest.mark.skipif(available() is not None, reason=f"{available()}")
VALUE = bytes(range(256)) * 4096                  # 1 MiB
TOKEN = "network-hosts-test-token"               # off loopback, a token is required
SERVER_ARGS = (*FAST_SERVER_ARGS, "--token", TOKEN)


def test_servers_on_other_hosts_are_reached_over_tcp_and_never_over_shm(tmp_path):
    with NetworkHosts(2) as net, LocalCluster(2, memory="64MiB", server_args=SERVER_ARGS,
                                              hosts=net.hosts(),
                                              log_dir=str(tmp_path / "servers")) as cluster:
        assert [a.split(":")[0] for a in cluster.addresses] == net.addresses
        keys = [f"k{i}" for i in range(16)]
        with Client(cluster.addresses, timeout_s=5.0, token=TOKEN) as client:   # "auto"
            assert client.batch_put(keys, [VALUE] * 16) == [True] * 16
            assert client.batch_get(keys) == [VALUE] * 16
            assert client.stats()["shm_servers"] == []
        with Client(cluster.addresses, transport="shm", timeout_s=2.0, token=TOKEN) as shm:
            assert shm.get("k0") is None                 # refused: another host, a miss
            assert shm.stats()["misses_by_reason"].get("unreachable", 0) >= 1
        # a client on server 0's host maps its arena and reaches server 1 over the bridge
        code = ("import json, sys; from gcache.sdk import Client\n"
                "with Client(sys.argv[1].split(','), timeout_s=5.0, token=sys.argv[2]) as c:\n"
                "    got = c.batch_get([f'k{i}' for i in range(16)])\n"
                "    whole = all(g is not None and len(g) == 1 << 20 for g in got)\n"
                "    print(json.dumps({'shm': c.stats()['shm_servers'], 'ok': whole}))")
        done = net.run_in(0, [sys.executable, "-c", code, ",".join(cluster.addresses), TOKEN],
                          capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen == {"shm": [cluster.addresses[0]], "ok": True}


def test_masters_and_servers_on_separate_hosts_form_one_cluster(tmp_path):
    """Masters on this host's bridge address, servers on two other hosts heartbeating to them:
    a client that knows only the masters finds both servers and stores through them."""
    with NetworkHosts(2) as net, \
            LocalMasters(1, host=net.own_address, env={"GCACHE_TOKEN": TOKEN},
                         log_dir=str(tmp_path / "masters")) as masters, \
            LocalCluster(2, memory="64MiB", server_args=SERVER_ARGS, hosts=net.hosts(),
                         master=masters.spec, log_dir=str(tmp_path / "servers")) as cluster, \
            Client(master=masters.spec, timeout_s=5.0, token=TOKEN) as client:
        wait_until(lambda: sorted(client.stats()["servers"]) == sorted(cluster.addresses),
                   timeout_s=20)
        keys = [f"m{i}" for i in range(32)]
        assert client.batch_put(keys, [VALUE[:4096]] * 32) == [True] * 32
        assert client.batch_get(keys) == [VALUE[:4096]] * 32
        assert client.stats()["shm_servers"] == []

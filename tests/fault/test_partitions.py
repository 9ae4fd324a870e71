"""Partitions: a peer cut off mid-transfer (``tests/network_hosts.py``: hosts as network
namespaces, a link cut with a tc drop filter, traffic slowed with tbf so that the transfer is
still under way when the cut comes). Whatever the local send buffer still accepts, a transfer
the peer has stopped acknowledging ends within one IO timeout (TCP_USER_TIMEOUT), plus at most
``BOUND_S``: the retransmission timer that notices, the handler's wake-up and, for the server,
the STAT poll that sees it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gcache.cli.local_cluster import LocalCluster
from gcache.sdk import Client
from tests.conftest import FAST_SERVER_ARGS
from tests.helpers import wait_until
from tests.network_hosts import NetworkHosts, available

pytestmark = pytest.mark.skipif(available() is not None, reason=f"{available()}")
TOKEN = "partition-test-token"
IO_TIMEOUT_S = 2.0
BOUND_S = 1.0
RATE = "40mbit"                  # 5 MB/s: a 24 MiB value takes about 5 s to cross
BIG = bytes(range(256)) * (96 * 1024)            # 24 MiB
# Fits a 64 MiB arena of 4 MiB segments only in a run of consecutive segments that BIG's span,
# while pinned, leaves to nobody: stored only once BIG's leases are let go.
AFTER = bytes(range(256)) * (176 * 1024)         # 44 MiB
SERVER_ARGS = (*FAST_SERVER_ARGS, "--token", TOKEN, "--io-timeout", str(IO_TIMEOUT_S))

# Runs on the client's host: one operation on one key, then what it returned and when it ended.
CLIENT = """
import json, sys, time
from gcache.sdk import Client
op, key, address, token = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
value = bytes(range(256)) * (96 * 1024)
with Client([address], timeout_s=float(sys.argv[5]), token=token, transport="tcp") as client:
    print("started", flush=True)
    ok = client.get(key) is not None if op == "get" else client.put(key, value)
    print(json.dumps({"ok": ok, "ended": time.time()}), flush=True)
"""


def _client_on(net: NetworkHosts, index: int, op: str, key: str, address: str,
               timeout_s: float) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", net.names[index], sys.executable, "-c",
                             CLIENT, op, key, address, TOKEN, str(timeout_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> dict:
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def _started(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "started", proc.stderr.read()[-2000:]


def test_a_reply_cut_off_mid_transfer_releases_its_leases_within_one_io_timeout(tmp_path):
    with NetworkHosts(2) as net, \
            LocalCluster(1, memory="64MiB", server_args=SERVER_ARGS, hosts=net.hosts()[:1],
                         log_dir=str(tmp_path / "servers")) as cluster, \
            Client(cluster.addresses, timeout_s=5.0, token=TOKEN) as here:
        address = cluster.addresses[0]
        assert here.put("big", BIG)
        pins = lambda: here.server_stats()[address]["tier"]["pins"]  # noqa: E731
        net.limit(1, RATE)
        reader = _client_on(net, 1, "get", "big", address, timeout_s=IO_TIMEOUT_S)
        try:
            _started(reader)
            wait_until(lambda: pins() >= 1, 10)           # the reply is on its way
            assert not here.put("after", AFTER)          # its pinned span holds the room
            time.sleep(0.5)
            net.cut(1)
            cut_at = time.monotonic()
            wait_until(lambda: pins() == 0, IO_TIMEOUT_S + BOUND_S)
            released_s = time.monotonic() - cut_at
        finally:
            outcome = _finish(reader)
        assert outcome["ok"] is False                    # the reader got a miss, not a stall
        assert released_s >= IO_TIMEOUT_S - 0.5          # ended by the timeout, not by luck
        assert here.put("after", AFTER) and here.get("after") == AFTER    # the space is reusable
        assert here.put("small", b"s" * 1000)
        net.heal(1)                                      # and the cut-off host is served again
        assert _finish(_client_on(net, 1, "get", "small", address, timeout_s=2.0))["ok"]


def test_a_put_cut_off_mid_transfer_is_a_miss_within_one_timeout(tmp_path):
    timeout_s = 1.0
    with NetworkHosts(2) as net, \
            LocalCluster(1, memory="128MiB", server_args=SERVER_ARGS, hosts=net.hosts()[:1],
                         log_dir=str(tmp_path / "servers")) as cluster:
        net.limit(1, RATE)
        writer = _client_on(net, 1, "put", "cut-off", cluster.addresses[0], timeout_s=timeout_s)
        try:
            _started(writer)
            time.sleep(1.5)                                 # connected, well into the value
            net.cut(1)
            cut_at = time.time()
        finally:
            outcome = _finish(writer)
        assert outcome["ok"] is False
        assert outcome["ended"] - cut_at <= timeout_s + BOUND_S, outcome["ended"] - cut_at

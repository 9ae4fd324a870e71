"""The same-host shared-memory path: route choice, the arena descriptor, leases, restarts, GPU."""

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from gcache import Client
from gcache.frame import FLAG_IN_PLACE, FLAG_NO_REPLY, HANDLE, Op, Status, encode_keys
from gcache.keys import checksum
from gcache.sdk.protocol import Channel
from gcache.transport.shm import connect_unix
from tests.helpers import wait_until


def socket_path(cluster, index: int = 0) -> str:
    return f"/tmp/{cluster.servers[index].shm_name}.sock"


def test_shm_is_chosen_automatically_for_a_same_host_server(cluster_factory):
    cluster = cluster_factory(1)
    with Client(cluster.addresses) as client:
        assert client.put("k", b"v" * 5000) and client.get("k") == b"v" * 5000
        assert client.stats()["shm_servers"] == cluster.addresses


def test_tcp_when_forced(cluster_factory):
    cluster = cluster_factory(1)
    with Client(cluster.addresses, transport="tcp") as client:
        assert client.put("k", b"v") and client.get("k") == b"v"
        assert client.stats()["shm_servers"] == []


def test_shm_forced_on_a_server_without_a_socket_is_a_miss(cluster_factory):
    cluster = cluster_factory(1, server_args=("--unix-socket", "off", "--lease-ttl", "1.0"))
    with Client(cluster.addresses, transport="shm") as client:
        assert client.put("k", b"v") is False
        assert client.stats()["misses_by_reason"] == {"unreachable": 1}
    with Client(cluster.addresses) as client:                   # auto falls back to TCP
        assert client.put("k", b"v") and client.stats()["shm_servers"] == []


def test_socket_and_arena_are_private_to_the_servers_user(cluster_factory):
    cluster = cluster_factory(1)
    for path in (socket_path(cluster), f"/dev/shm/{cluster.servers[0].shm_name}"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path


def test_values_written_over_shm_read_back_over_tcp_and_back(cluster_factory):
    cluster = cluster_factory(1)
    value = np.random.default_rng(3).integers(0, 256, 3 << 20, dtype=np.uint8)
    with Client(cluster.addresses, transport="shm") as shm, \
            Client(cluster.addresses, transport="tcp") as tcp:
        assert shm.put("a", value) and tcp.get("a") == value.tobytes()
        assert tcp.put("b", value) and shm.get("b") == value.tobytes()


def test_a_restarted_server_is_mapped_afresh(cluster_factory):
    cluster = cluster_factory(1)
    with Client(cluster.addresses, suspect_s=0.1) as client:
        assert client.put("before", b"1" * 100)
        cluster.kill(0)
        assert client.get("before") is None
        cluster.restart(0)
        time.sleep(0.15)
        assert client.put("after", b"2" * 100) and client.get("after") == b"2" * 100
        assert client.stats()["shm_servers"] == cluster.addresses


def raw_channel(cluster) -> Channel:
    conn = connect_unix(socket_path(cluster), timeout_s=2, io_size=1 << 20)
    return Channel(conn, timeout_s=2)


def test_batch_lease_and_a_batched_release_without_reply(cluster_factory):
    cluster = cluster_factory(1)
    with Client(cluster.addresses) as client:
        assert client.batch_put(["x", "y"], [b"xx", b"yyy"]) == [True, True]
        ch = raw_channel(cluster)
        reply = ch.reply(ch.request(Op.BATCH_LEASE, payload=(encode_keys([b"x", b"z", b"y"]),),
                                    count=3))
        table = ch.payload(reply)
        assert len(table) == 3 * 33 and table[0] == Status.OK and table[33] == Status.NOT_FOUND
        stats = lambda: client.server_stats()[cluster.addresses[0]]["tier"]  # noqa: E731
        assert stats()["pins"] == 2
        handles = [int.from_bytes(table[1:9], "little"), int.from_bytes(table[67:75], "little")]
        ch.request(Op.RELEASE, payload=(b"".join(HANDLE.pack(h) for h in handles),), count=2,
                   flags=FLAG_NO_REPLY)
        wait_until(lambda: stats()["pins"] == 0, timeout_s=2)
        ch.conn.close()


def test_in_place_writes_with_a_wrong_commit_checksum_are_rejected(cluster_factory):
    cluster = cluster_factory(1)
    ch = raw_channel(cluster)
    alloc = ch.reply(ch.request(Op.ALLOC, key=b"inplace", length=8))
    ch.request(Op.WRITE, handle=alloc.handle, offset=0, length=8,
               flags=FLAG_IN_PLACE | FLAG_NO_REPLY)
    assert ch.reply(ch.request(Op.COMMIT, handle=alloc.handle,
                               checksum=checksum(b"whatever"))).status == Status.CHECKSUM_MISMATCH
    ch.conn.close()


# One connection a key: a connection may hold at most half the arena (``max_held_share``).
LEASE_HOLDER = textwrap.dedent("""
    import sys, time
    from gcache.frame import Op
    from gcache.sdk.protocol import Channel
    from gcache.transport.shm import connect_unix
    channels = []
    for key in sys.argv[2:]:
        ch = Channel(connect_unix(sys.argv[1], timeout_s=2, io_size=1 << 20), timeout_s=2)
        channels.append(ch)
        assert ch.reply(ch.request(Op.LEASE, key=key.encode())).handle > 0
    print("leased", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_client_holding_leases_does_not_block_eviction_after_the_ttl(cluster_factory, how):
    cluster = cluster_factory(1, memory="16MiB")            # four 4 MiB segments, TTL 1 s
    big = b"z" * (3 << 20)
    with Client(cluster.addresses, timeout_s=2.0) as client:
        assert all(client.put(f"old{i}", big) for i in range(4))
        holder = subprocess.Popen([sys.executable, "-c", LEASE_HOLDER, socket_path(cluster)]
                                  + [f"old{i}" for i in range(4)], stdout=subprocess.PIPE)
        try:
            assert holder.stdout.readline().strip() == b"leased"
            assert client.put("new", big) is False                # every segment is pinned
            os.kill(holder.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
            wait_until(lambda: client.put("new", big), timeout_s=5)  # close or TTL frees them
            assert client.get("new") == big
        finally:
            holder.kill()
            holder.wait(10)


@pytest.mark.requires_gpu
def test_cuda_tensors_round_trip_through_the_registered_arena(cluster_factory):
    import torch

    cluster = cluster_factory(1)
    value = torch.randint(0, 255, (3 << 20,), dtype=torch.uint8, device="cuda")
    out = torch.zeros_like(value)
    with Client(cluster.addresses, transport="shm") as client:
        assert client.put("gpu", value)
        assert client.get_into("gpu", out) == value.numel()
        assert torch.equal(out, value)
        assert client.get("gpu") == value.cpu().numpy().tobytes()
        outs = [torch.zeros_like(value) for _ in range(2)]
        assert client.batch_put(["g1", "g2"], [value, value]) == [True, True]
        assert client.batch_get_into(["g1", "g2"], outs) == [value.numel()] * 2
        assert all(torch.equal(o, value) for o in outs)

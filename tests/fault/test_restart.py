"""The hot tier outlives a crash: SIGKILL, restart on the same arena, everything committed is back.

Shared memory is the point: the arena file stays in /dev/shm, the restarted server re-attaches
and rebuilds its index, verifying every value's checksum on the way.
"""

import mmap
import os

import numpy as np

from gcache import Client
from gcache.frame import Op
from gcache.sdk.protocol import Channel
from gcache.transport.tcp import connect


def block(i: int, size: int) -> bytes:
    return np.random.default_rng(1000 + i).integers(0, 256, size, dtype=np.uint8).tobytes()


def readable(client: Client, keys: list[str]) -> dict[str, bytes]:
    values = client.batch_get(keys)
    return {k: v for k, v in zip(keys, values) if v is not None}


def test_after_sigkill_and_restart_every_committed_value_is_back_intact(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")        # 4 MiB segments
    sizes = [1, 4096, 300_000, 1 << 20, 6 << 20]          # the last spans two segments
    expected = {f"v{i}": block(i, sizes[i % len(sizes)]) for i in range(25)}
    with Client(cluster.addresses) as client:
        for key, value in expected.items():
            assert client.put(key, value)
        for i in (3, 7):                                   # overwrite: the newest must win
            expected[f"v{i}"] = block(100 + i, 5000)
            assert client.put(f"v{i}", expected[f"v{i}"])
        for i in (4, 9):                                   # delete: must stay deleted
            assert client.delete(f"v{i}")
            del expected[f"v{i}"]
    cluster.kill(0)
    cluster.restart(0)
    with Client(cluster.addresses) as client:
        assert readable(client, [f"v{i}" for i in range(25)]) == expected
        tier = client.server_stats()[cluster.addresses[0]]["tier"]
    assert tier["recovered_objects"] == len(expected) and tier["checksum_failures"] == 0


def test_a_write_not_committed_before_the_crash_is_never_visible(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")
    conn = connect(cluster.addresses[0], timeout_s=2, io_size=1 << 20)
    ch = Channel(conn, timeout_s=2)
    alloc = ch.reply(ch.request(Op.ALLOC, key=b"torn", length=8))
    ch.reply(ch.request(Op.WRITE, payload=(b"12345678",), handle=alloc.handle, offset=0))
    cluster.kill(0)                                        # before COMMIT
    conn.close()
    cluster.restart(0)
    with Client(cluster.addresses) as client:
        assert client.get("torn") is None
        assert client.put("after", b"ok") and client.get("after") == b"ok"


def test_evicted_values_do_not_come_back_from_reused_segments(cluster_factory):
    cluster = cluster_factory(1, memory="32MiB")
    keys = [f"e{i}" for i in range(120)]
    with Client(cluster.addresses) as client:
        for i, key in enumerate(keys):                     # about 4x the arena: lots of reuse
            assert client.put(key, block(i, 700_000 + 1000 * (i % 7)))
        before = readable(client, keys)
    assert 0 < len(before) < len(keys)
    cluster.kill(0)
    cluster.restart(0)
    with Client(cluster.addresses) as client:
        assert readable(client, keys) == before


def test_a_flipped_byte_is_dropped_at_recovery_and_logged(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")
    marker = b"FLIPME" * 1000
    with Client(cluster.addresses) as client:
        assert client.put("victim", marker) and client.put("bystander", b"safe" * 100)
    cluster.kill(0)
    path = f"/dev/shm/{cluster.servers[0].shm_name}"
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as arena:
        where = arena.find(marker)
        assert where >= 0
        arena[where + 10] ^= 0xFF
    cluster.restart(0)
    with Client(cluster.addresses) as client:
        assert client.get("victim") is None                # a miss, never wrong bytes
        assert client.get("bystander") == b"safe" * 100
        assert client.server_stats()[cluster.addresses[0]]["tier"]["checksum_failures"] == 1
    assert "recovery.checksum_mismatch" in cluster.tail(cluster.servers[0], lines=50)


def test_a_restart_with_another_size_starts_empty(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")
    with Client(cluster.addresses) as client:
        assert client.put("k", b"v")
    cluster.kill(0)
    server = cluster.servers[0]
    server.args[server.args.index("--memory") + 1] = "32MiB"
    cluster.restart(0)
    with Client(cluster.addresses) as client:
        assert client.get("k") is None and client.put("k", b"new")
    assert os.path.getsize(f"/dev/shm/{server.shm_name}") == 32 << 20

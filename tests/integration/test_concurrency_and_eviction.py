"""Many clients at once, and memory pressure: the oldest data goes and nothing is corrupt."""

import threading

import numpy as np

from gcache import Client


def block(i: int, size: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_concurrent_clients_read_their_own_writes(shared_cluster):
    errors: list[str] = []

    def worker(n: int) -> None:
        with Client(shared_cluster.addresses, timeout_s=5.0, io_threads=2) as client:
            for i in range(40):
                key, value = f"conc/{n}/{i}", block(n * 1000 + i, 1 + (i * 7919) % 300_000)
                if not client.put(key, value):
                    errors.append(f"put {key}")
                got = client.get(key)
                if got != value:
                    errors.append(f"get {key}: {None if got is None else len(got)}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_one_client_shared_by_threads(client):
    keys = [f"shared/{i}" for i in range(64)]
    values = [block(i, 64 * 1024) for i in range(64)]
    results: dict[int, bool] = {}

    def worker(part: int) -> None:
        for i in range(part, 64, 4):
            results[i] = client.put(keys[i], values[i]) and client.get(keys[i]) == values[i]

    threads = [threading.Thread(target=worker, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 64 and all(results.values())


def test_memory_pressure_evicts_oldest_first_and_never_corrupts(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")
    size, count = 1 << 20, 200                   # about 3x the arena
    with Client(cluster.addresses, timeout_s=5.0) as client:
        assert all(client.put(f"ev/{i}", block(i, size)) for i in range(count))
        present = []
        for i in range(count):
            got = client.get(f"ev/{i}")
            if got is not None:
                assert got == block(i, size), f"ev/{i} corrupt"
                present.append(i)
        tier = client.server_stats()[cluster.addresses[0]]["tier"]
    assert present == list(range(count - len(present), count))    # a suffix: newest survive
    assert 40 <= len(present) <= 64
    assert tier["evicted_objects"] == count - len(present)
    assert tier["used_bytes"] <= tier["capacity_bytes"]


def test_a_value_larger_than_the_arena_is_refused_cleanly(cluster_factory):
    cluster = cluster_factory(1, memory="16MiB")
    with Client(cluster.addresses, timeout_s=5.0) as client:
        assert client.put("too-big", b"x" * (20 << 20)) is False
        assert client.stats()["misses_by_reason"] == {"no_space": 1}
        assert client.put("fits", b"y" * 1000) and client.get("fits") == b"y" * 1000


def test_a_shm_batch_of_many_write_windows_is_stored_whole(cluster_factory):
    """A 1 s lease TTL gives a same-host writer 0.5 s from each ALLOC: a batch put that
    allocated all 3000 values before copying any lost the windows of the first ones (with
    0.4 s it stored none; 0.4 s was too short for any put while make test's other lane ran)."""
    cluster = cluster_factory(1, memory="64MiB",
                              server_args=("--segment-size", "4MiB", "--lease-ttl", "1.0"))
    keys = [f"w{i}" for i in range(3000)]
    values = [i.to_bytes(4, "little") * 64 for i in range(3000)]
    with Client(cluster.addresses, timeout_s=2.0, transport="shm") as client:
        assert sum(client.batch_put(keys, values)) == len(keys), client.stats()
        assert client.batch_get(keys) == values


def test_a_large_shm_batch_of_small_values_does_not_deadlock(cluster_factory):
    """Thousands of ALLOCs and COMMITs on one Unix socket: pipelined without a bound, the
    server blocked sending replies nobody read while the client blocked sending (a timeout)."""
    cluster = cluster_factory(1, memory="64MiB")
    keys = [f"small{i}" for i in range(3000)]
    values = [i.to_bytes(4, "little") * 64 for i in range(3000)]
    with Client(cluster.addresses, timeout_s=2.0, transport="shm") as client:
        assert all(client.batch_put(keys, values))
        assert client.batch_get(keys) == values
        assert client.stats()["misses"] == 0


def test_values_whose_write_window_passed_are_put_once_more(cluster_factory, monkeypatch):
    """A machine busy enough lets a value's window pass between its ALLOC and its copy: the
    batch puts those values again (in smaller chunks) instead of dropping them."""
    from gcache.sdk.leases import WriteWindowPassed
    from gcache.sdk.shm_exchange import ShmExchange
    cluster = cluster_factory(1)
    original, refused = ShmExchange.copy_in, set()

    def late_once(self, extent, value, landed=None):
        if bytes(value[:4]) not in refused:
            refused.add(bytes(value[:4]))
            raise WriteWindowPassed("the machine was busy")
        return original(self, extent, value, landed)

    monkeypatch.setattr(ShmExchange, "copy_in", late_once)
    keys = [f"late{i}" for i in range(40)]
    values = [i.to_bytes(4, "little") * 16 for i in range(40)]
    with Client(cluster.addresses, timeout_s=2.0, transport="shm") as client:
        assert client.batch_put(keys, values) == [True] * 40
        assert len(refused) == 40 and client.stats()["misses_by_reason"] == {}
        assert client.batch_get(keys) == values

"""PREFETCH over the wire with real servers: keys on the cold tier come into memory without
being read, keys in memory and absent keys are told apart, a server without a cold tier answers
from memory, and the KV layer's prefix prefetch promotes exactly what a load would read."""

import os

import numpy as np
import pytest

from gcache import Client
from gcache.errors import InvalidRequest
from gcache.kv import KVStore, ModelLayout, prefetch_prefix
from gcache.kv.prefetch import prefix_keys
from gcache.prefetched import Prefetched
from tests.integration.test_tiers import SERVER_ARGS, VALUE, tiered, tiers, value

ARENA_BYTES = 8 << 20


def _fill_past_the_arena(client: Client, n: int) -> None:
    for i in range(n):
        assert client.put(f"k{i}", value(i)), i


def test_prefetch_promotes_cold_keys_without_reading_them(cluster_factory, tmp_path):
    cluster = tiered(cluster_factory, tmp_path / "disk")
    n = 3 * ARENA_BYTES // VALUE                   # the first keys end up on disk only
    with Client(cluster.addresses, timeout_s=3.0) as client:
        _fill_past_the_arena(client, n)
        cold = [f"k{i}" for i in range(4)]
        before = tiers(client)
        assert before["cold"]["objects"] >= 4
        states = client.prefetch([*cold, f"k{n - 1}", "never-put"])
        assert states[:4] == [Prefetched.PROMOTED] * 4
        assert states[4:] == [Prefetched.IN_MEMORY, Prefetched.ABSENT]
        after = tiers(client)
        assert after["hot"]["promoted_objects"] == before["hot"]["promoted_objects"] + 4
        assert after["cold"]["hits"] == before["cold"]["hits"] + 4
        assert after["hot"]["hits"] == before["hot"]["hits"]      # nothing was read
        # a second prefetch finds them in memory, and a read gets them without the disk
        assert client.prefetch(cold) == [Prefetched.IN_MEMORY] * 4
        assert [client.get(k) for k in cold] == [value(i) for i in range(4)]
        assert tiers(client)["cold"]["hits"] == after["cold"]["hits"]


def test_a_server_without_a_cold_tier_answers_from_memory(cluster_factory):
    cluster = cluster_factory(2, memory="16MiB", server_args=SERVER_ARGS)
    with Client(cluster.addresses, timeout_s=3.0) as client:
        assert client.put("here", b"x" * 100)
        assert client.prefetch(["here", "not-here"]) == [Prefetched.IN_MEMORY,
                                                         Prefetched.ABSENT]
        assert client.prefetch([]) == []


def test_keys_of_a_server_that_is_gone_are_not_asked(cluster_factory):
    cluster = cluster_factory(1, memory="16MiB", server_args=SERVER_ARGS)
    with Client(cluster.addresses, timeout_s=1.0) as client:
        assert client.put("a", b"1")
        cluster.terminate(0)
        assert client.prefetch(["a"]) == [Prefetched.NOT_ASKED]


def test_the_kv_prefix_prefetch_promotes_what_a_load_reads(cluster_factory, tmp_path):
    from gcache.cli.replay import ZeroKV

    os.makedirs(tmp_path / "disk")
    cluster = cluster_factory(1, memory="8MiB", server_args=(
        *SERVER_ARGS, "--disk-dir", str(tmp_path / "disk")))
    layout = ModelLayout.from_config("gemma-3-1b", page_size=16).scaled(64)
    tokens = np.arange(16 * 12, dtype=np.int64)
    with Client(cluster.addresses, timeout_s=3.0) as client, \
            KVStore(client, layout, pressure_poll_s=0.0) as store:
        assert store.save(tokens, ZeroKV(layout)).bytes_written > 0
        hit = store.match(tokens)
        assert hit > 0
        keys = prefix_keys(store, tokens, hit)
        assert len(keys) == len(store.paged_layers) * (hit // 16) + len(store.tail_layers)
        for i in range(3 * ARENA_BYTES // VALUE):      # push the prefix out to disk
            assert client.put(f"filler{i}", value(i))
        done = prefetch_prefix(store, tokens, hit)
        assert done.keys == len(keys) and done.in_memory == len(keys) and done.promoted > 0
        again = prefetch_prefix(store, tokens, hit)
        assert again.promoted == 0 and again.in_memory == len(keys)
        cold_hits = tiers(client)["cold"]["hits"]
        load = store.load(tokens, hit, ZeroKV(layout))
        load.wait(timeout_s=10.0)
        assert not load.failed_layers
        assert tiers(client)["cold"]["hits"] == cold_hits     # the load read memory only
        with pytest.raises(InvalidRequest, match="multiple of the page size"):
            prefetch_prefix(store, tokens, 5)

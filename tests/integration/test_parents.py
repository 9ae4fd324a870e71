"""Values put with a parent on a real server (``FLAG_PARENT``), over shared memory and TCP:
the server gives no second chance to a read value whose parent it no longer holds, counts
such values in STAT, and a KV save names each page's previous page."""

import numpy as np
import pytest

from gcache.errors import InvalidRequest
from gcache.kv import KVStore, LayerArrays, page_keys
from gcache.sdk import Client
from tests.helpers import wait_until
from tests.kv.layouts import hybrid

SEG = 64 * 1024
VALUE = b"p" * (SEG // 4 - 256)          # four records a segment


def tier_of(client: Client) -> dict:
    (stat,) = client.server_stats().values()
    assert stat is not None
    return stat["tier"]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_read_pages_below_a_deleted_page_are_let_go_first(cluster_factory, transport):
    cluster = cluster_factory(1, memory="2MiB",
                              server_args=("--segment-size", "64KiB", "--unreachable-sweep",
                                           "0.1"))
    with Client(cluster.addresses, timeout_s=2.0, transport=transport) as client:
        orphan = "seq/x"                         # the first put: the link is made by it
        assert client.put(orphan, VALUE, parent=["missing", "also-missing"])
        keys = [f"seq/{i}" for i in range(4)]
        assert client.batch_put(keys, [VALUE] * 4, parents=[None, *keys[:3]]) == [True] * 4
        assert all(client.get(key) == VALUE for key in [*keys, orphan])
        wait_until(lambda: tier_of(client)["unreachable_objects"] == 1, 5.0)
        assert client.delete(keys[1])
        wait_until(lambda: tier_of(client)["unreachable_objects"] == 3, 5.0)
        assert tier_of(client)["unreachable_bytes"] == 3 * len(VALUE)
        for i in range(4 * 32):                  # an arena's worth: every segment reclaimed
            assert client.put(f"churn/{i}", VALUE)
        assert [client.exists(k) for k in keys] == [True, False, False, False]
        assert not client.exists(orphan)
        assert tier_of(client)["unreachable_evicted"] == 3


def test_a_parent_key_too_long_to_keep_is_refused_by_name(cluster_factory):
    cluster = cluster_factory(1)
    with Client(cluster.addresses, timeout_s=2.0) as client:
        with pytest.raises(InvalidRequest, match=r"parents\[1\].*64 bytes.*at most 63"):
            client.batch_put(["a", "b"], [b"1", b"2"], parents=[None, "k" * 64])
        with pytest.raises(InvalidRequest, match="2 parents for 1 keys"):
            client.batch_put(["a"], [b"1"], parents=[None, None])


def test_a_kv_save_names_each_page_s_previous_page(cluster_factory):
    """Deleting one page of a saved sequence leaves the pages and tails below it on the same
    server unreachable, and the servers count them."""
    cluster = cluster_factory(2, server_args=("--segment-size", "4MiB",
                                              "--unreachable-sweep", "0.1"))
    layout = hybrid(window=128, page=64, model="parents")
    n = 12 * layout.page_size
    tokens = np.random.default_rng(7).integers(0, 50_000, n)
    rng = np.random.default_rng(8)
    src = {layer: rng.integers(1, 256, (n, layout.layer_bytes_per_token(layer)), dtype=np.uint8)
           for layer in range(layout.num_layers)}

    def unreachable() -> int:
        return sum(s["tier"]["unreachable_objects"] for s in client.server_stats().values())

    with Client(cluster.addresses, timeout_s=2.0) as client, \
            KVStore(client, layout, policy="tail", group_head_tokens=64) as store:
        assert store.save(tokens, LayerArrays(layout, src)).objects_failed == 0
        wait_until(lambda: all(s["tier"]["objects"] for s in client.server_stats().values()), 5.0)
        assert unreachable() == 0
        hashes = store.hashes(tokens)
        gone = [page_keys.page_key(hashes[3], layer) for layer in layout.full_layers]
        assert all(client.delete(key, group=g)
                   for key, g in zip(gone, store.key_groups(hashes, gone)))
        wait_until(lambda: unreachable() > 0, 5.0)
        assert store.match(tokens) <= 3 * layout.page_size


def test_a_killed_server_keeps_the_parents_it_was_given(cluster_factory):
    """The parent is in the record: after SIGKILL and a restart on the same arena the server
    finds the same value unreachable, and the chain above it whole."""
    cluster = cluster_factory(1, server_args=("--segment-size", "4MiB", "--unreachable-sweep",
                                              "0.1"))
    with Client(cluster.addresses, timeout_s=2.0) as client:
        assert client.batch_put(["k/0", "k/1", "k/2"], [b"a", b"b", b"c"],
                                parents=[None, "k/0", "k/gone"]) == [True] * 3
        wait_until(lambda: tier_of(client)["unreachable_objects"] == 1, 5.0)
    cluster.kill(0)
    cluster.restart(0)
    with Client(cluster.addresses, timeout_s=2.0) as client:
        assert [client.get(f"k/{i}") for i in range(3)] == [b"a", b"b", b"c"]
        wait_until(lambda: tier_of(client)["unreachable_objects"] == 1, 5.0)
        assert tier_of(client)["unreachable_bytes"] == 1
        assert client.put("k/gone", b"g")
        wait_until(lambda: tier_of(client)["unreachable_objects"] == 0, 5.0)

"""Unit tier: our backend through SGLang's own factory, on SGLang's real host pools (CPU),
against a real local GCache cluster. No engine."""

from __future__ import annotations

import threading

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolTransfer,
)

from gcache.errors import ConfigError
from gcache.sdk import Client
from gcache_sglang.storage import GCacheHiCacheStorage

from .pools import PAGE, backend, fill, mha_host, mla_host, page_keys, pages_of, storage_config

TOKENS = list(range(1000, 1000 + 8 * PAGE))


def tokens(seed: int, n_pages: int = 8) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 for i in range(n_pages * PAGE)]


def round_trip(made, host, keys, seed):
    written = fill(host, len(keys), seed)
    expected = pages_of(host, written)
    assert made.batch_set_v1(keys, written) == [True] * len(keys)
    into = host.alloc(len(keys) * PAGE)
    host.kv_buffer.zero_()
    assert made.batch_get_v1(keys, into) == [True] * len(keys)
    got = pages_of(host, into)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    host.free(written)
    host.free(into)


# Each case its own token seed, unused elsewhere in this module: pages are keyed by tokens and
# filled with random bytes, so a test that met another's keys would read the other's bytes
# (the seed was hash((kind, layout)) % 1000, which PYTHONHASHSEED=1729 sent onto seed 100).
@pytest.mark.parametrize("kind,layout,seed", [
    ("mha", "page_first", 500), ("mha", "page_first_direct", 501), ("mha", "layer_first", 502),
    ("mla", "page_first", 503), ("mla", "page_first_direct", 504), ("mla", "layer_first", 505)])
def test_zero_copy_round_trip_is_byte_exact(cluster, kind, layout, seed):
    host = mha_host(layout) if kind == "mha" else mla_host(layout)
    made = backend(storage_config(cluster.addresses, mla=kind == "mla"), host)
    assert isinstance(made, GCacheHiCacheStorage)
    keys = page_keys(tokens(seed))
    assert made.batch_exists(keys) == 0
    round_trip(made, host, keys, seed=1)
    assert made.batch_exists(keys) == len(keys)
    assert made.counters["pages_written"] == len(keys) and made.counters["errors"] == 0
    # a second save of the same pages sends nothing (the objects exist)
    before = made.client.stats()["bytes_written"]
    again = fill(host, len(keys), seed=2)
    assert made.batch_set_v1(keys, again) == [True] * len(keys)
    assert made.client.stats()["bytes_written"] == before
    made.close()


def test_generic_path_round_trip_with_flat_pages(cluster):
    host = mha_host("page_first")
    made = backend(storage_config(cluster.addresses, zero_copy=False), host)
    keys = page_keys(tokens(11))
    written = fill(host, len(keys), seed=3)
    values = [host.get_data_page(int(written[i]), flat=True) for i in range(0, len(written), PAGE)]
    assert made.batch_set(keys, values) is True
    assert made.batch_exists(keys) == len(keys) and made.exists(keys[0])
    targets = [host.get_dummy_flat_data_page() for _ in keys]
    got = made.batch_get(keys, targets)
    assert all(g is t for g, t in zip(got, targets))
    assert all(torch.equal(g.view(torch.uint8), v.view(torch.uint8)) for g, v in zip(got, values))
    one = made.get(keys[1], host.get_dummy_flat_data_page())
    assert torch.equal(one.view(torch.uint8), values[1].view(torch.uint8))
    assert made.get("0" * 64, host.get_dummy_flat_data_page()) is None
    assert made.set("1" * 64, values[0]) is True and made.exists("1" * 64)
    made.close()


def test_batch_exists_counts_the_leading_pages_only(cluster):
    host = mha_host("page_first_direct")
    made = backend(storage_config(cluster.addresses), host)
    keys = page_keys(tokens(21))
    round_trip(made, host, keys, seed=4)
    gen = made.pages.generation()
    with Client(cluster.addresses) as client:           # drop one object of page 5 (its V part)
        assert client.delete(made.pages.object_key("kv", keys[5], 1, gen))
    assert made.batch_exists(keys) == 5
    into = host.alloc(len(keys) * PAGE)
    assert made.batch_get_v1(keys, into) == [True] * 5 + [False] + [True] * 2
    assert made.batch_exists(keys[:3]) == 3 and made.batch_exists(keys[6:]) == 2
    made.close()


def test_tensor_parallel_ranks_do_not_share_mha_pages(cluster):
    keys = page_keys(tokens(31))
    hosts = [mha_host("page_first"), mha_host("page_first")]
    ranks = [backend(storage_config(cluster.addresses, tp_rank=r, tp_size=2), hosts[r])
             for r in range(2)]
    round_trip(ranks[0], hosts[0], keys, seed=5)
    assert ranks[0].batch_exists(keys) == len(keys)
    assert ranks[1].batch_exists(keys) == 0               # same hashes, other heads: not its KV
    other_model = backend(storage_config(cluster.addresses, tp_rank=0, tp_size=2,
                                         model="tests/other"), mha_host("page_first"))
    assert other_model.batch_exists(keys) == 0
    other_layout = backend(storage_config(cluster.addresses, tp_rank=0, tp_size=2),
                           mha_host("layer_first"))
    assert other_layout.batch_exists(keys) == 0           # same pages, another byte order
    for made in (*ranks, other_model, other_layout):
        made.close()


def test_mla_pages_are_shared_and_written_by_the_writer_rank_only(cluster):
    keys = page_keys(tokens(41))
    hosts = [mla_host("page_first"), mla_host("page_first")]
    ranks = [backend(storage_config(cluster.addresses, tp_rank=r, tp_size=2, mla=True), hosts[r])
             for r in range(2)]
    assert ranks[0].config.is_storage_writer and not ranks[1].config.is_storage_writer
    slots = fill(hosts[1], len(keys), seed=6)
    assert ranks[1].batch_set_v1(keys, slots) == [True] * len(keys)   # accepted, not written
    assert ranks[1].counters["pages_skipped"] == len(keys)
    assert ranks[0].batch_exists(keys) == 0 and ranks[1].batch_exists(keys) == 0
    written = fill(hosts[0], len(keys), seed=7)
    expected = pages_of(hosts[0], written)
    assert ranks[0].batch_set_v1(keys, written) == [True] * len(keys)
    assert ranks[1].batch_exists(keys) == len(keys)         # one copy serves every rank
    into = hosts[1].alloc(len(keys) * PAGE)
    assert ranks[1].batch_get_v1(keys, into) == [True] * len(keys)
    assert all(torch.equal(a, b) for a, b in zip(pages_of(hosts[1], into), expected))
    for made in ranks:
        made.close()


def hybrid(cluster, **extra):
    """A hybrid-SWA pair as SGLang's assembler builds it: a full-layer anchor pool and an SWA
    pool, each an ordinary host pool over its own layers."""
    full, swa = mha_host("page_first_direct", layers=2), mha_host("page_first_direct", layers=4)
    made = backend(storage_config(cluster.addresses, model="tests/hybrid", **extra), full,
                   swa=swa)
    return made, full, swa


def test_hybrid_existence_is_window_safe(cluster):
    made, full, swa = hybrid(cluster)
    keys = page_keys(tokens(51, n_pages=6))
    round_trip(made, full, keys, seed=8)
    # SWA window of 2 pages, saved for the node that ends at page 4 only (pages 2 and 3)
    swa_slots = fill(swa, 2, seed=9)
    expected = pages_of(swa, swa_slots)
    tail = PoolTransfer(name="swa", host_indices=swa_slots, keys=keys[2:4],
                        hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert made.batch_set_v2([tail]) == {"swa": [True, True]}
    query = [PoolTransfer(name="swa", keys=["__placeholder__"] * 2,
                          hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    result = made.batch_exists_v2(keys, query)
    assert result.restorable_prefix_pages == [4] and result.kv_hit_pages == 4
    assert result.extra_pool_hit_pages == {"kv": 6, "swa": 4}
    # a window longer than what was saved has no safe boundary: no pseudo-hit
    longer = [PoolTransfer(name="swa", keys=["x"] * 3, hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    assert made.batch_exists_v2(keys, longer).kv_hit_pages == 0
    # a sequence shorter than the window is whole from page 0
    assert made.batch_set_v2([PoolTransfer(name="swa", host_indices=fill(swa, 1, seed=10),
                                           keys=keys[:1])])["swa"] == [True]
    assert made.batch_exists_v2(keys, query).restorable_prefix_pages == [1, 4]
    # the SWA pages come back byte for byte
    into = swa.alloc(2 * PAGE)
    swa.kv_buffer.zero_()
    got = made.batch_get_v2([PoolTransfer(name="swa", host_indices=into, keys=keys[2:4])])
    assert got == {"swa": [True, True]}
    assert all(torch.equal(a, b) for a, b in zip(pages_of(swa, into), expected))
    made.close()


def test_hybrid_all_pages_pool_limits_the_hit(cluster):
    made, full, swa = hybrid(cluster)
    keys = page_keys(tokens(61, n_pages=5))
    round_trip(made, full, keys, seed=11)
    slots = fill(swa, 3, seed=12)
    made.batch_set_v2([PoolTransfer(name="swa", host_indices=slots, keys=keys[:3])])
    query = [PoolTransfer(name="swa", keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)]
    result = made.batch_exists_v2(keys, query)
    assert result.kv_hit_pages == 3 and result.restorable_prefix_pages == [1, 2, 3]
    made.close()


def test_prefix_keys_place_the_head_by_the_first_page_and_the_rest_past_it(cluster):
    host = mha_host("page_first")
    made = backend(storage_config(cluster.addresses, hicache_storage_pass_prefix_keys=True,
                                  gcache_group_head_tokens=2 * PAGE), host)
    assert made.grouped
    keys = page_keys(tokens(71, n_pages=6))
    head, rest = keys[:3], keys[3:]            # the calls need not split where the head ends
    slots = fill(host, len(keys), seed=13)
    assert made.batch_set_v1(head, slots[:3 * PAGE], HiCacheStorageExtraInfo(prefix_keys=[]))
    assert made.batch_set_v1(rest, slots[3 * PAGE:], HiCacheStorageExtraInfo(prefix_keys=head))
    assert made.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=[])) == 6
    assert made.batch_exists(rest, HiCacheStorageExtraInfo(prefix_keys=head)) == 3
    # SGLang's storage hit query passes None for a query from the root: that is the root
    assert made.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=None)) == 6
    # the head's two pages were placed by the first page, the rest by the first page past the
    # head; looked up key by key, some land on the other server and miss, so groups were used
    gen = made.pages.generation()
    objects = [made.pages.object_key("kv", k, part, gen) for k in keys for part in (0, 1)]
    groups = [keys[0]] * 4 + [keys[2]] * 8
    with Client(cluster.addresses) as client:
        assert all(client.batch_exists(objects, group=groups))
        assert not all(client.batch_exists(objects))
    spread = backend(storage_config(cluster.addresses), mha_host("page_first"))
    assert not spread.grouped and spread.batch_exists(keys) < 6
    for one in (made, spread):
        one.close()


def test_a_server_killed_mid_prefetch_is_a_clean_miss(tmp_path):
    from gcache.cli.local_cluster import LocalCluster
    with LocalCluster(2, memory="128MiB", log_dir=str(tmp_path)) as private:
        host = mha_host("page_first_direct")
        made = backend(storage_config(private.addresses, gcache_timeout_ms=200), host)
        keys = page_keys(tokens(81, n_pages=24))
        written = fill(host, len(keys), seed=14)
        expected = pages_of(host, written)
        assert made.batch_set_v1(keys, written) == [True] * len(keys)
        assert made.batch_exists(keys) == len(keys)          # the prefetch's query: all there
        private.kill(1)                                      # ... then a server dies
        into = host.alloc(len(keys) * PAGE)
        host.kv_buffer.zero_()
        got = made.batch_get_v1(keys, into)                  # no exception, per-page answers
        assert len(got) == len(keys) and not all(got) and any(got)
        pages = pages_of(host, into)
        assert all(torch.equal(pages[i], expected[i]) for i, ok in enumerate(got) if ok)
        assert made.batch_exists(keys) < len(keys)
        assert made.counters["read_misses"] == got.count(False)
        made.close()


def test_an_internal_error_is_a_miss_not_an_exception(cluster):
    host = mha_host("page_first")
    made = backend(storage_config(cluster.addresses), host)
    keys = page_keys(tokens(91, n_pages=2))
    wrong = host.alloc(PAGE)                                 # one page of slots for two keys
    assert made.batch_get_v1(keys, wrong) == [False, False]
    assert made.batch_set_v1(keys, wrong) == [False, False]
    assert made.batch_get_v2([PoolTransfer(name="nope", host_indices=wrong, keys=keys)]) == \
        {"nope": [False, False]}
    assert made.counters["errors"] == 3
    made.close()


def test_concurrent_calls_from_sglangs_four_threads(cluster):
    host = mha_host("page_first_direct")
    made = backend(storage_config(cluster.addresses), host)
    errors: list[str] = []

    def worker(n: int) -> None:
        for round_ in range(3):
            keys = page_keys(tokens(100 + 10 * n + round_, n_pages=4))
            slots = host.alloc(4 * PAGE)
            expected = pages_of(host, slots)
            if made.batch_set_v1(keys, slots) != [True] * 4:
                errors.append(f"set {n}/{round_}")
            into = host.alloc(4 * PAGE)
            got = made.batch_get_v1(keys, into)
            same = [torch.equal(a, b) for a, b in zip(pages_of(host, into), expected)]
            if got != [True] * 4 or not all(same):
                errors.append(f"get {n}/{round_}: read {got}, equal {same}")
            host.free(slots)
            host.free(into)

    fill(host, 1, seed=15)
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and made.counters["errors"] == 0, (errors, made.counters)
    made.close()


def test_clear_makes_the_namespace_empty_for_every_process(cluster):
    hosts = [mha_host("page_first"), mha_host("page_first")]
    config = storage_config(cluster.addresses, model="tests/clear")
    first, second = backend(config, hosts[0]), backend(config, hosts[1])
    second.pages._refresh_s = 0.0                      # re-read the generation at every call
    keys = page_keys(tokens(201))
    round_trip(first, hosts[0], keys, seed=16)
    assert second.batch_exists(keys) == len(keys)
    assert first.clear() is True
    assert first.batch_exists(keys) == 0 and second.batch_exists(keys) == 0
    round_trip(first, hosts[0], keys, seed=17)           # and it fills again
    assert second.batch_exists(keys) == len(keys)
    for made in (first, second):
        made.close()


def test_storage_metrics_report_pages_and_bandwidth(cluster):
    host = mha_host("page_first")
    made = backend(storage_config(cluster.addresses, model="tests/metrics"), host)
    keys = page_keys(tokens(301))
    round_trip(made, host, keys, seed=18)
    stats = made.get_stats()
    assert stats.backup_pgs == [len(keys)] and stats.prefetch_pgs == [len(keys)]
    assert stats.backup_bandwidth[0] > 0 and stats.prefetch_bandwidth[0] > 0
    assert made.get_stats().backup_pgs == []            # drained by each poll, as SGLang expects
    made.close()


@pytest.mark.parametrize("extra,named", [({"gcache_servrs": "x"}, "gcache_servrs"),
                                         ({"gcache_timeout_ms": -1}, "gcache_timeout_ms"),
                                         ({"gcache_policy": "tail"}, "gcache_policy"),
                                         ({"gcache_pinned_mb": 64}, "gcache_pinned_mb"),
                                         ({"gcache_async_load_tokens": 0},
                                          "gcache_async_load_tokens"),
                                         ({"gcache_name": "m"}, "gcache_name")])
def test_bad_settings_fail_at_creation_naming_the_key(cluster, extra, named):
    with pytest.raises(ConfigError, match=named):
        backend(storage_config(cluster.addresses, **extra), mha_host("page_first"))


def test_no_servers_and_no_master_is_a_clear_error():
    config = storage_config([])
    config.extra_config.pop("gcache_servers")
    with pytest.raises(ConfigError, match="gcache_master"):
        backend(config, mha_host("page_first"))


def flat_pages(host, keys, seed):
    written = fill(host, len(keys), seed)
    return [host.get_data_page(int(written[i]), flat=True) for i in range(0, len(written), PAGE)]


def test_generic_path_with_prefix_keys_finds_every_page_it_stored(cluster):
    """SGLang's generic path passes prefix keys to ``batch_exists`` only, never to
    ``batch_set``/``batch_get``: all three must still look in the same place."""
    host = mha_host("page_first")
    made = backend(storage_config(cluster.addresses, zero_copy=False,
                                  hicache_storage_pass_prefix_keys=True), host)
    assert made.grouped and not made.zero_copy
    keys = page_keys(tokens(41, n_pages=16))
    values = flat_pages(host, keys, seed=12)
    assert made.batch_set(keys[:4], values[:4]) and made.batch_set(keys[4:], values[4:])
    assert made.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=[])) == len(keys)
    assert made.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=None)) == len(keys)
    assert made.batch_exists(keys[4:], HiCacheStorageExtraInfo(prefix_keys=keys[:4])) == 12
    targets = [host.get_dummy_flat_data_page() for _ in keys]
    got = made.batch_get(keys, targets)
    assert all(torch.equal(g.view(torch.uint8), v.view(torch.uint8)) for g, v in zip(got, values))
    made.close()


def test_exists_agrees_with_set_with_interface_v1_on(cluster):
    host = mha_host("page_first")
    made = backend(storage_config(cluster.addresses), host)
    assert made.zero_copy
    keys = page_keys(tokens(43))
    values = flat_pages(host, keys, seed=13)
    assert not made.exists(keys[0])
    assert made.set(keys[0], values[0]) is True and made.exists(keys[0])
    assert made.batch_set(keys[1:3], values[1:3]) and made.exists(keys[1]) and made.exists(keys[2])
    round_trip(made, host, keys[3:], seed=14)            # the zero-copy objects count too
    assert made.exists(keys[3])
    made.close()

"""``GCacheEmbeddingStore`` through SGLang's own ``EmbeddingStore`` interface, on real tensors and
a real local GCache cluster: found by name through SGLang's plugin loader and factory, items put
from pool pages by address and read back into other pages of another pool, single- and
multi-buffer. SGLang 0.5.23's multimodal global cache runs in its encoder-disaggregation server,
which needs a GPU transfer engine; it is not run on these CPUs (README)."""

from __future__ import annotations

import json

import pytest
import torch

DIM, PAGE = 64, 16                     # a pool page: PAGE tokens of DIM bf16 values


@pytest.fixture
def store_factory(cluster, monkeypatch):
    from sglang.srt.mem_cache.embedding_store import EmbeddingStoreFactory
    from sglang.srt.plugins import load_plugins

    load_plugins()                     # what every SGLang process does at start
    made = []

    def make(**settings):
        monkeypatch.setenv("GCACHE_SGLANG_EMBEDDINGS", json.dumps(
            {"gcache_servers": ",".join(cluster.addresses), "gcache_timeout_ms": 5000,
             **{f"gcache_{k}": v for k, v in settings.items()}}))
        made.append(EmbeddingStoreFactory.create_backend("gcache"))
        return made[-1]
    yield make
    for store in made:
        store.client.close()


def pool(pages: int, seed: int | None = None) -> torch.Tensor:
    if seed is None:
        return torch.zeros(pages * PAGE, DIM, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(pages * PAGE, DIM, generator=g).to(torch.bfloat16)


def page_buffers(tensor: torch.Tensor, pages: list[int]) -> tuple[list[int], list[int]]:
    size = PAGE * DIM * tensor.element_size()
    return [tensor[p * PAGE].data_ptr() for p in pages], [size] * len(pages)


def test_the_plugin_registers_the_backend_with_sglangs_factory(store_factory):
    from sglang.srt.mem_cache.embedding_store import EmbeddingStoreFactory
    store = store_factory()
    assert "gcache" in EmbeddingStoreFactory._registry
    assert type(store).__name__ == "GCacheEmbeddingStore"


def test_an_item_spread_over_pages_reads_back_into_other_pages(store_factory):
    writer, reader = store_factory(), store_factory()
    source, target = pool(8, seed=1), pool(8)
    assert writer.batch_is_exist(["img-a", "img-b"]) == [False, False]
    ptrs_a, sizes_a = page_buffers(source, [1, 4, 5])      # three pages, not adjacent
    ptrs_b, sizes_b = page_buffers(source, [6])
    assert writer.batch_put_from_multi_buffers(["img-a", "img-b"], [ptrs_a, ptrs_b],
                                               [sizes_a, sizes_b]) == [True, True]
    assert reader.batch_is_exist(["img-a", "img-b", "img-c"]) == [True, True, False]
    got_a, got_b = page_buffers(target, [0, 7, 3]), page_buffers(target, [2])
    assert reader.batch_get_into_multi_buffers(
        ["img-a", "img-b", "img-c"], [got_a[0], got_b[0], got_b[0]],
        [got_a[1], got_b[1], got_b[1]]) == [True, True, False]
    for src, dst in ((1, 0), (4, 7), (5, 3), (6, 2)):
        assert torch.equal(target[dst * PAGE:(dst + 1) * PAGE],
                           source[src * PAGE:(src + 1) * PAGE])


def test_single_buffer_calls_read_and_write_the_pool_in_place(store_factory):
    store = store_factory()
    source, target = pool(4, seed=2), pool(4)
    size = 2 * PAGE * DIM * 2
    assert store.batch_put(["clip"], [source[PAGE].data_ptr()], [size]) == [True]
    assert store.batch_put(["clip"], [source[PAGE].data_ptr()], [size]) == [True]   # held
    assert store.batch_get(["clip"], [target[2 * PAGE].data_ptr()], [size]) == [True]
    assert torch.equal(target[2 * PAGE:], source[PAGE:3 * PAGE])
    assert store.batch_get(["clip"], [target.data_ptr()], [size - 2]) == [False]  # not its size
    assert store.counters["puts"] == 1


def test_namespaces_keep_tenants_apart_and_a_dead_cluster_is_a_miss(store_factory,
                                                                    monkeypatch):
    first, other = store_factory(), store_factory(namespace="tenant-2")
    source = pool(1, seed=3)
    ptrs, sizes = page_buffers(source, [0])
    assert first.batch_put(["img"], ptrs, sizes) == [True]
    assert other.batch_is_exist(["img"]) == [False]
    from sglang.srt.mem_cache.embedding_store import EmbeddingStoreFactory
    monkeypatch.setenv("GCACHE_SGLANG_EMBEDDINGS",
                       json.dumps({"gcache_servers": "127.0.0.1:9", "gcache_timeout_ms": 200}))
    dead = EmbeddingStoreFactory.create_backend("gcache")
    try:
        assert dead.batch_is_exist(["img"]) == [False]
        assert dead.batch_put(["img"], ptrs, sizes) == [False]
        assert dead.batch_get(["img"], ptrs, sizes) == [False]
    finally:
        dead.client.close()


def test_bad_settings_are_refused_by_name(monkeypatch):
    from gcache.errors import ConfigError
    from gcache_sglang.embedding_store import GCacheEmbeddingStore
    monkeypatch.setenv("GCACHE_SGLANG_EMBEDDINGS", "not json")
    with pytest.raises(ConfigError, match="GCACHE_SGLANG_EMBEDDINGS"):
        GCacheEmbeddingStore()
    monkeypatch.setenv("GCACHE_SGLANG_EMBEDDINGS", json.dumps({"gcache_policy": "tail"}))
    with pytest.raises(ConfigError, match="gcache_policy"):
        GCacheEmbeddingStore()

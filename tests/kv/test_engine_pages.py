"""``EnginePages``: pages under an engine's own keys, moved straight from its memory; the
trailing-window rule for per-page window pools; the connectors' shared settings."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from gcache.errors import ConfigError, InvalidRequest
from gcache.kv import (
    EnginePages,
    client_from_settings,
    gcache_settings,
    page_regions,
    restorable_prefixes,
)
from gcache.sdk import Client

T, F = True, False


@pytest.mark.parametrize("present, tail, expected", [
    ([T, T, T, T], 2, [1, 2, 3, 4]),
    ([F, F, T, T], 2, [4]),                  # a window saved only for the node ending at 4
    ([T, F, T, T], 2, [1, 4]),               # a prefix shorter than the window is whole
    ([F, T, T, F], 2, [3]),
    ([T, T, T, T], 5, [1, 2, 3, 4]),         # every prefix shorter than the window
    ([T, F, T, T], 5, [1]),
    ([F, F, F, T], 1, [4]),
    ([], 2, []),
])
def test_restorable_prefixes_table(present, tail, expected):
    assert restorable_prefixes(len(present), present, tail) == expected


def test_restorable_prefixes_refuses_an_empty_window():
    with pytest.raises(ValueError, match="tail_pages"):
        restorable_prefixes(2, [T, T], 0)


@pytest.fixture
def pages(shared_cluster):
    # 5 s: these tests check what is stored, not how fast; beside make test's other lane a
    # 2 s IO timeout is within reach, and a timed-out write reads as a missing page
    with Client(shared_cluster.addresses, timeout_s=5.0) as client:
        store = EnginePages(client, "test/engine", {"model": "m", "tp": "0/1"},
                            generation_refresh_s=0.0)
        store.add_pool("kv", layout="page_first", dtype="bf16")
        store.add_pool("swa", layout="page_first", dtype="bf16", window=2)
        yield store


def host_pool(n_pages: int, parts: int, part_bytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n_pages, parts, part_bytes),
                                                dtype=np.uint8)


def views(pool: np.ndarray) -> list[list[memoryview]]:
    """The parts of every page as the engine hands them out: raw (pointer, size) pairs."""
    base = pool.ctypes.data
    n_pages, parts, size = pool.shape
    pointers = [base + (p * parts + i) * size for p in range(n_pages) for i in range(parts)]
    return page_regions(pointers, [size] * len(pointers), n_pages)


def test_pages_round_trip_in_place(pages):
    keys = [f"{i:064x}" for i in range(1, 6)]
    src, dst = host_pool(5, 2, 4096, seed=1), np.zeros((5, 2, 4096), np.uint8)
    assert pages.leading_present("kv", keys, 2) == 0
    assert pages.write("kv", keys, views(src)) == [T] * 5
    assert pages.present("kv", keys, 2) == [T] * 5
    assert pages.read("kv", keys, views(dst)) == [T] * 5
    assert np.array_equal(src, dst)
    # the same page keys in another pool or namespace are other objects
    assert pages.leading_present("swa", keys, 2) == 0
    other = EnginePages(pages.client, "test/engine", {"model": "m", "tp": "1/2"})
    other.add_pool("kv", layout="page_first", dtype="bf16")
    assert other.leading_present("kv", keys, 2) == 0


def test_a_missing_part_fails_its_page_only(pages):
    keys = [f"{i:064x}" for i in range(10, 14)]
    src = host_pool(4, 2, 1024, seed=2)
    pages.write("kv", keys, views(src))
    assert pages.client.delete(pages.object_key("kv", keys[2], 1, pages.generation()))
    assert pages.present("kv", keys, 2) == [T, T, F, T]
    assert pages.leading_present("kv", keys, 2) == 2
    dst = np.zeros_like(src)
    assert pages.read("kv", keys, views(dst)) == [T, T, F, T]
    assert np.array_equal(src[[0, 1, 3]], dst[[0, 1, 3]])


def test_writing_existing_pages_sends_nothing(pages):
    keys = [f"{i:064x}" for i in range(20, 23)]
    pages.write("kv", keys, views(host_pool(3, 2, 2048, seed=3)))
    before = pages.client.stats()["bytes_written"]
    assert pages.write("kv", keys, views(host_pool(3, 2, 2048, seed=4))) == [T] * 3
    assert pages.client.stats()["bytes_written"] == before


def test_a_part_of_another_size_is_a_miss_not_a_partial_read(pages):
    keys = [f"{i:064x}" for i in range(30, 32)]
    pages.write("kv", keys, views(host_pool(2, 1, 1024, seed=5)))
    bigger = np.zeros((2, 1, 2048), np.uint8)
    assert pages.read("kv", keys, views(bigger)) == [F, F]


def test_clear_moves_the_namespace_to_a_new_generation(pages):
    keys = [f"{i:064x}" for i in range(40, 43)]
    assert pages.write("kv", keys, views(host_pool(3, 1, 512, seed=6))) == [True] * 3
    twin = EnginePages(pages.client, "test/engine", {"model": "m", "tp": "0/1"},
                       generation_refresh_s=0.0)
    twin.add_pool("kv", layout="page_first", dtype="bf16")
    assert twin.leading_present("kv", keys, 1) == 3, pages.client.stats()["misses_by_reason"]
    assert pages.clear()
    assert pages.leading_present("kv", keys, 1) == 0 and twin.leading_present("kv", keys, 1) == 0


def test_bad_arguments_name_the_rule(pages):
    with pytest.raises(InvalidRequest, match="unknown pool"):
        pages.present("nope", ["k"], 1)
    with pytest.raises(InvalidRequest, match="same non-zero number of parts"):
        pages.write("kv", ["a", "b"], [[b"x"], [b"y", b"z"]])
    with pytest.raises(InvalidRequest, match="do not split evenly"):
        page_regions([1, 2, 3], [4, 4, 4], 2)
    with pytest.raises(ValueError, match="address"):
        page_regions([0], [4], 1)
    with pytest.raises(InvalidRequest, match="pool name"):
        pages.add_pool("a/b")


def test_settings_are_read_and_checked(shared_cluster):
    extra = {"backend_name": "x", "gcache_servers": ",".join(shared_cluster.addresses),
             "gcache_timeout_ms": 500, "gcache_io_threads": 2, "unrelated": 1}
    settings = gcache_settings(extra)
    assert settings == {"servers": ",".join(shared_cluster.addresses), "timeout_ms": 500,
                        "io_threads": 2}
    with client_from_settings(settings) as client:
        assert client.config.timeout_s == 0.5 and client.config.io_threads == 2
    with pytest.raises(ConfigError, match="gcache_tiemout_ms"):
        gcache_settings({"gcache_tiemout_ms": 5})
    with pytest.raises(ConfigError, match="gcache_master"):
        client_from_settings({})
    with pytest.raises(ConfigError, match="gcache_timeout_ms"):
        client_from_settings({"servers": "127.0.0.1:1", "timeout_ms": "soon"})
    with pytest.raises(ConfigError, match="transport"):
        client_from_settings({"servers": "127.0.0.1:1", "transport": "pigeon"})


def test_memory_at_reads_and_writes_in_place():
    from gcache.buffer import memory_at
    buf = (ctypes.c_ubyte * 8)(*range(8))
    view = memory_at(ctypes.addressof(buf), 8)
    assert bytes(view) == bytes(range(8))
    view[0] = 255
    assert buf[0] == 255


def test_a_corrupted_part_is_a_miss_and_is_dropped_so_the_page_can_be_saved_again(
        cluster_factory):
    import mmap
    cluster = cluster_factory(1)
    # a same-host reader hashes arena bytes only when asked to (docs/protocol.md, Checksums)
    with Client(cluster.addresses, timeout_s=2.0, verify_arena_reads=True) as client:
        store = EnginePages(client, "test/corrupt", {"model": "m"})
        store.add_pool("kv", layout="page_first")
        keys = [f"{i:064x}" for i in range(50, 52)]
        src = host_pool(2, 1, 8192, seed=7)
        assert store.write("kv", keys, views(src)) == [T, T]
        marker = bytes(src[1, 0, 100:164])                 # 64 bytes only page 1 holds
        with open(f"/dev/shm/{cluster.servers[0].shm_name}", "r+b") as fh, \
                mmap.mmap(fh.fileno(), 0) as arena:       # the live server maps this file
            where = arena.find(marker)
            assert where >= 0
            arena[where] ^= 0xFF
        dst = np.zeros_like(src)
        assert store.read("kv", keys, views(dst)) == [T, F]    # never the wrong bytes
        assert store.present("kv", keys, 1) == [T, F]          # dropped ...
        assert store.write("kv", keys, views(src)) == [T, T]   # ... so the next save stores it
        assert store.read("kv", keys, views(dst)) == [T, T] and np.array_equal(src, dst)

"""One suite for every ``ColdStore``: segment files and RocksDB blobs keep, find, read back (in
pieces), forget, count and evict values the same way through the interface ``TieredStore`` uses
(real RocksDB, real files under the test's temporary directory)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gcache.keys import checksum
from gcache.server.cold_blobs import BlobColdStore
from gcache.server.cold_segments import SegmentColdStore
from gcache.server.cold_store import ColdStore

CAPACITY_BYTES = 2 << 20


# Each factory is annotated ``-> ColdStore``: mypy checks the implementation conforms.
def segments(path: Path) -> ColdStore:
    path.mkdir(exist_ok=True)
    return SegmentColdStore(str(path), CAPACITY_BYTES, file_bytes=1 << 20)


def blobs(path: Path) -> ColdStore:
    return BlobColdStore(str(path), CAPACITY_BYTES)


STORES: dict[str, Callable[[Path], ColdStore]] = {"segments": segments, "blobs": blobs}


@pytest.fixture(params=sorted(STORES))
def make(request: pytest.FixtureRequest) -> Callable[[Path], ColdStore]:
    return STORES[str(request.param)]


@pytest.fixture
def store(make: Callable[[Path], ColdStore], tmp_path: Path) -> Iterator[ColdStore]:
    opened = make(tmp_path / "cold")
    try:
        yield opened
    finally:
        opened.close()


def value_of(n_bytes: int, seed: int) -> bytes:
    return bytes((seed + i * 7) % 251 for i in range(n_bytes))


def put(store: ColdStore, key: bytes, value: bytes, *, group: int = 0,
        parent: bytes = b"") -> None:
    assert store.put(key, memoryview(value), checksum(value), group, parent)


def test_a_put_value_is_found_with_its_length_checksum_and_group(store):
    value = value_of(10_000, 1)
    put(store, b"k", value, group=0xFEED)
    entry = store.lookup(b"k")
    assert entry is not None
    assert (entry.length, entry.checksum, entry.group) == (len(value), checksum(value), 0xFEED)
    assert entry.parent == b""
    assert store.lookup(b"absent") is None


def test_a_parent_is_kept_with_its_value_and_through_eviction_of_others(store):
    """What a value hangs from comes back with it (a promotion gives it back to memory);
    an entry put without one, as every entry written before parents existed, has none."""
    put(store, b"child", value_of(1000, 2), parent=b"p" * 63)
    put(store, b"orphan", value_of(1000, 3))
    for i in range(6):                                   # fill past the capacity: evictions
        put(store, b"filler%d" % i, value_of(400 << 10, i), parent=b"filler%d" % (i - 1))
    newest = store.lookup(b"filler5")
    assert newest is not None and newest.parent == b"filler4"
    out = bytearray(newest.length)
    assert store.read_into(newest, memoryview(out)) and out == value_of(400 << 10, 5)
    for key, parent in ((b"child", b"p" * 63), (b"orphan", b"")):
        entry = store.lookup(key)
        assert entry is None or entry.parent == parent


def test_read_into_reads_the_whole_value_or_a_piece_at_an_offset(store):
    value = value_of(50_000, 2)
    put(store, b"before", value_of(3000, 9))      # the value is not at the start of a file
    put(store, b"k", value)
    put(store, b"after", value_of(3000, 8))
    entry = store.lookup(b"k")
    whole = bytearray(len(value))
    assert store.read_into(entry, memoryview(whole))
    assert whole == value
    piece = bytearray(1234)
    assert store.read_into(entry, memoryview(piece), offset=20_000)
    assert piece == value[20_000:21_234]
    assert store.read_chunk_bytes > 0


def test_a_second_put_replaces_the_first(store):
    put(store, b"k", b"old" * 100)
    put(store, b"k", b"new" * 200, group=3)
    entry = store.lookup(b"k")
    assert (entry.length, entry.checksum, entry.group) == (600, checksum(b"new" * 200), 3)
    out = bytearray(600)
    assert store.read_into(entry, memoryview(out)) and out == b"new" * 200
    assert store.keys() == [b"k"] and store.object_count() == 1


def test_delete_forgets_a_key_once(store):
    put(store, b"a", b"a" * 100)
    put(store, b"b", b"b" * 100)
    assert store.delete(b"a")
    assert not store.delete(b"a")
    assert store.lookup(b"a") is None
    assert store.keys() == [b"b"] and store.object_count() == 1


def test_keys_and_object_count_follow_puts_and_deletes(store):
    assert store.keys() == [] and store.object_count() == 0
    for i in range(10):
        put(store, b"k%d" % i, value_of(100, i))
    store.delete(b"k3")
    expected = sorted(b"k%d" % i for i in range(10) if i != 3)
    assert sorted(store.keys()) == expected and store.object_count() == 9


def test_stats_have_what_the_per_tier_counters_read(store):
    put(store, b"k", value_of(1000, 4))
    stats = store.stats()
    assert {"bytes", "capacity_bytes", "evicted_objects", "failed_writes"} <= set(stats)
    assert all(type(v) is int for v in stats.values())
    assert stats["capacity_bytes"] == CAPACITY_BYTES and stats["bytes"] >= 1000
    assert stats["evicted_objects"] == stats["failed_writes"] == 0


def test_the_capacity_evicts_the_oldest_values_first(store):
    keys = [b"e%d" % i for i in range(12)]              # 12 × 400 KiB into 2 MiB
    for i, key in enumerate(keys):
        put(store, key, value_of(400 << 10, i))
    held = [key for key in keys if store.lookup(key) is not None]
    assert held == keys[-len(held):] and 0 < len(held) < len(keys)   # a suffix: oldest went
    stats = store.stats()
    assert stats["evicted_objects"] >= len(keys) - len(held)
    assert stats["bytes"] <= CAPACITY_BYTES
    assert store.object_count() == len(store.keys()) == len(held)
    newest = store.lookup(keys[-1])
    out = bytearray(newest.length)
    assert store.read_into(newest, memoryview(out)) and out == value_of(400 << 10, 11)


def test_a_value_larger_than_the_capacity_is_refused(store):
    big = bytes(CAPACITY_BYTES + 1)
    assert not store.put(b"big", memoryview(big), checksum(big))
    assert store.lookup(b"big") is None and store.object_count() == 0


def test_what_was_put_and_synced_is_there_after_a_reopen(make, tmp_path):
    path = tmp_path / "cold"
    first = make(path)
    try:
        put(first, b"kept", b"kept" * 300, group=9, parent=b"its parent")
        put(first, b"dropped", b"d" * 10)
        first.delete(b"dropped")
        first.sync()
    finally:
        first.close()
    again = make(path)
    try:
        entry = again.lookup(b"kept")
        assert entry is not None and (entry.group, entry.parent) == (9, b"its parent")
        out = bytearray(entry.length)
        assert again.read_into(entry, memoryview(out)) and out == b"kept" * 300
        assert again.keys() == [b"kept"] and again.object_count() == 1
    finally:
        again.close()


def test_pinned_values_are_marked_listed_and_kept_through_the_capacity(make, tmp_path):
    """A file's parts written to disk stay there whatever KV values come after (the budget
    moves them on instead of evicting them), are listed by prefix, and keep their mark across
    a reopen (a rebooted host lists and serves them)."""
    path = tmp_path / "cold"
    store = make(path)
    try:
        assert store.put(b"file/a", memoryview(b"A" * 1000), checksum(b"A" * 1000),
                         pinned=True)
        assert store.put(b"file/b", memoryview(b"B" * 1000), checksum(b"B" * 1000),
                         pinned=True)
        put(store, b"kv/plain", b"p" * 1000)
        for i in range(12):                              # 12 × 400 KiB into 2 MiB
            put(store, b"kv/%d" % i, value_of(400 << 10, i))
        assert store.lookup(b"kv/plain") is None         # the budget evicted it, not them
        assert [store.lookup(k).pinned for k in (b"file/a", b"file/b")] == [True, True]
        assert store.pinned_keys(b"file/", limit=10) == [b"file/a", b"file/b"]
        assert store.pinned_keys(b"file/", after=b"file/a", limit=10) == [b"file/b"]
        assert store.pinned_keys(b"kv/", limit=10) == []
        put(store, b"file/b", b"unpinned now")           # the mark goes with the value
        assert store.pinned_keys(b"", limit=10) == [b"file/a"]
        store.sync()
    finally:
        store.close()
    again = make(path)
    try:
        entry = again.lookup(b"file/a")
        out = bytearray(entry.length)
        assert entry.pinned and again.read_into(entry, memoryview(out)) and out == b"A" * 1000
        assert again.pinned_keys(b"", limit=10) == [b"file/a"]
        assert again.delete(b"file/a") and again.pinned_keys(b"", limit=10) == []
    finally:
        again.close()

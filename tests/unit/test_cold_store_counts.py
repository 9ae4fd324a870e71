"""Both cold stores keep their object count as they go (STAT reads it every second, and walking
a RocksDB index under the store's lock would hold up every disk read and write meanwhile): after
puts, overwrites, deletes and budget evictions it equals what the index holds, and after a
reopen too. Real RocksDB and real files."""

from __future__ import annotations

import random

import pytest

from gcache.server.cold_blobs import BlobColdStore
from gcache.server.cold_segments import SegmentColdStore

STORES = {
    "segments": lambda path: SegmentColdStore(str(path), 3 << 20, file_bytes=1 << 20),
    "blobs": lambda path: BlobColdStore(str(path), 1 << 20),
}


@pytest.mark.parametrize("kind", sorted(STORES))
def test_the_object_count_follows_every_change_and_a_reopen(tmp_path, kind):
    make = STORES[kind]
    store = make(tmp_path)
    rng = random.Random(3)
    evictions_seen = False
    try:
        for step in range(600):
            key = b"c%d" % rng.randrange(120)
            if rng.random() < 0.15:
                store.delete(key)
            else:
                value = memoryview(bytes([step % 251]) * rng.randrange(1, 40_000))
                assert store.put(key, value, checksum=step)
            evictions_seen |= store.stats()["evicted_objects"] > 0
            if step % 50 == 0:
                assert store.object_count() == len(store.keys()), step
        assert evictions_seen                           # the budget evicted along the way
        held = len(store.keys())
        assert store.object_count() == held > 0
    finally:
        store.close()
    reopened = make(tmp_path)
    try:
        assert reopened.object_count() == len(reopened.keys()) == held
    finally:
        reopened.close()

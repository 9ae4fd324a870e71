"""A delete that lands while the demoter writes the same key: acknowledged, it stays deleted
in both tiers (real arena, real cold store; the interleaving is forced through the cold-store
seam, at the demoter's first call after its check that the value is still current)."""

import threading
import time
import uuid

from gcache.server.cold_segments import SegmentColdStore
from gcache.server.tier import HotTier
from gcache.server.tiered import TieredStore
from tests.unit.tier_ops import put, read

SEG = 64 * 1024


class DeletedDuringLookup:
    """A real cold store whose first ``lookup`` of ``key`` lets a delete of it land in
    memory first (the demoter has just found the value current and is about to write it)."""

    def __init__(self, cold, key: bytes) -> None:
        self.cold, self.key = cold, key
        self.store: TieredStore | None = None
        self.acknowledged = threading.Event()
        self._armed = True

    def lookup(self, key):
        if key == self.key and self._armed and self.store is not None:
            self._armed = False
            store = self.store
            threading.Thread(target=lambda: store.delete(key) and self.acknowledged.set(),
                             daemon=True).start()
            deadline = time.monotonic() + 5
            while store.hot.exists(key) and time.monotonic() < deadline:
                time.sleep(0.001)                     # deleted before the demoter writes
        return self.cold.lookup(key)

    def __getattr__(self, name):
        return getattr(self.cold, name)


def test_a_delete_between_the_demoters_check_and_its_write_is_never_undone(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    hot = HotTier(name=f"gcache-unit-{uuid.uuid4().hex[:8]}", size_bytes=8 * SEG,
                  segment_size=SEG, prefault=False, lease_ttl_s=60.0, cold_backed=True)
    cold = DeletedDuringLookup(SegmentColdStore(str(disk), 16 << 20), b"k")
    store = TieredStore(hot, cold, headroom_segments=2)
    try:
        put(store, b"k", b"v" * 1000)
        entry = hot.entry(b"k")
        cold.store = store
        store.demote([entry])
        assert cold.acknowledged.wait(10)
        assert cold.cold.lookup(b"k") is None
        assert read(store, b"k") is None and not store.exists(b"k")
    finally:
        store.close(unlink=True)

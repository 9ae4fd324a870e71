"""A delete that lands while the demoter writes the same key: acknowledged, it stays deleted
in both tiers (real arena, real cold store; the interleaving is forced at the demoter's check
that the value is still current)."""

import threading
import time
import uuid

from gcache.server.cold_segments import SegmentColdStore
from gcache.server.tier import HotTier
from gcache.server.tiered import TieredStore
from tests.unit.tier_ops import put, read

SEG = 64 * 1024


def test_a_delete_between_the_demoters_check_and_its_write_is_never_undone(tmp_path,
                                                                            monkeypatch):
    disk = tmp_path / "disk"
    disk.mkdir()
    hot = HotTier(name=f"gcache-unit-{uuid.uuid4().hex[:8]}", size_bytes=8 * SEG,
                  segment_size=SEG, prefault=False, lease_ttl_s=60.0, cold_backed=True)
    store = TieredStore(hot, SegmentColdStore(str(disk), 16 << 20), headroom_segments=2)
    try:
        put(store, b"k", b"v" * 1000)
        entry = hot.entry(b"k")
        acknowledged = threading.Event()
        real = hot.is_current

        def current_then_deleted(candidate):
            answer = real(candidate)                  # current when the demoter looks...
            threading.Thread(target=lambda: store.delete(b"k") and acknowledged.set(),
                             daemon=True).start()
            deadline = time.monotonic() + 5
            while hot.exists(b"k") and time.monotonic() < deadline:
                time.sleep(0.001)                     # ...and deleted before it writes
            return answer

        monkeypatch.setattr(hot, "is_current", current_then_deleted)
        store.demote([entry])
        assert acknowledged.wait(10)
        assert store.cold.lookup(b"k") is None
        assert read(store, b"k") is None and not store.exists(b"k")
    finally:
        store.close(unlink=True)

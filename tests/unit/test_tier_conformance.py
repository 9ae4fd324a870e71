"""One suite for every ``Tier``: the hot tier alone and the hot tier in front of each cold store
behave the same through the interface the request handler, the daemon and a drain use (real
shared memory, real RocksDB; every arena is removed from /dev/shm when its test ends)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gcache.errors import ChecksumMismatch, InvalidRequest, NoSpace
from gcache.keys import checksum
from gcache.server.cold_blobs import BlobColdStore
from gcache.server.cold_segments import SegmentColdStore
from gcache.server.tier import HotTier, Stored
from gcache.server.tier_protocol import Tier
from gcache.server.tiered import TieredStore
from tests.unit.tier_ops import fill, put, read, written

SEG = 64 * 1024
TTL_S = 60.0
DISK_BYTES = 16 << 20
PIN_BUDGET = 4 * SEG

# What STAT's ``tier`` and the server's /metrics read: the hot tier's, whatever is behind it.
STAT_KEYS = {"objects", "bytes", "capacity_bytes", "used_bytes", "segments", "pins", "hits",
             "misses", "puts", "deletes", "checksum_failures", "evicted_objects",
             "evicted_segments", "expired_pins", "recovered_objects", "demoted_objects",
             "promoted_objects", "second_chances", "whole_hashes", "pinned_objects",
             "pinned_bytes", "pin_budget_bytes", "young_spans_reclaimed", "pin_waits_expired"}
PER_TIER_KEYS = {
    "hot": {"bytes", "objects", "hits", "demoted_objects", "promoted_objects", "second_chances",
            "evicted_objects", "checksum_failures"},
    "cold": {"bytes", "objects", "capacity_bytes", "hits", "misses", "evicted_objects",
             "checksum_failures", "dropped_objects", "failed_writes"},
}


def _hot(name: str, *, cold_backed: bool) -> HotTier:
    return HotTier(name=name, size_bytes=8 * SEG, segment_size=SEG, prefault=False,
                   lease_ttl_s=TTL_S, cold_backed=cold_backed, pin_budget_bytes=PIN_BUDGET)


# Each factory is annotated ``-> Tier``: mypy checks the implementation conforms.
def hot_alone(name: str, disk: Path) -> Tier:
    return _hot(name, cold_backed=False)


def over_segments(name: str, disk: Path) -> Tier:
    disk.mkdir()
    cold = SegmentColdStore(str(disk), DISK_BYTES)         # first: a failure leaves no arena
    return TieredStore(_hot(name, cold_backed=True), cold, headroom_segments=2)


def over_blobs(name: str, disk: Path) -> Tier:
    cold = BlobColdStore(str(disk), DISK_BYTES)
    return TieredStore(_hot(name, cold_backed=True), cold, headroom_segments=2)


TIERS: dict[str, Callable[[str, Path], Tier]] = {
    "hot": hot_alone, "tiered-segments": over_segments, "tiered-blobs": over_blobs}


@pytest.fixture(params=sorted(TIERS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def open_tier(kind: str, tmp_path: Path) -> Tier:
    return TIERS[kind](f"gcache-conformance-{uuid.uuid4().hex[:8]}", tmp_path / "disk")


@pytest.fixture
def tier(kind: str, tmp_path: Path) -> Iterator[Tier]:
    made = open_tier(kind, tmp_path)
    try:
        yield made
    finally:
        made.close(unlink=True)


def test_a_committed_value_leases_reads_in_pieces_and_releases(tier):
    value = bytes(range(256)) * 40
    put(tier, b"k", value, group=0x5EED)
    lease = tier.lease(b"k")
    entry = lease.entry
    view = lease.view()
    try:
        assert bytes(view) == value
        assert (entry.length, entry.checksum, entry.group) == (len(value), checksum(value),
                                                               0x5EED)
        piece = lease.view(1000, 4096)
        assert bytes(piece) == value[1000:5096]
        piece.release()
        with pytest.raises(InvalidRequest, match="overruns"):
            lease.view(len(value) - 10, 11)
    finally:
        view.release()
    assert lease.release()
    assert not lease.release()                      # once only
    with pytest.raises(InvalidRequest):
        lease.view()
    assert tier.stats()["pins"] == 0


def test_a_write_received_in_order_pieces_is_hashed_as_it_lands(tier):
    value = bytes(range(256)) * 64
    write = tier.alloc(b"pieces", len(value))
    whole_before = tier.stats()["whole_hashes"]
    hashers = []
    for offset in range(0, len(value), 4096):
        def copy(view, hasher, offset=offset):
            view[:] = value[offset:offset + 4096]
            hashers.append(hasher)
            hasher.update(view)
        assert write.receive(offset, 4096, copy)
    assert all(h is not None for h in hashers)
    with pytest.raises(InvalidRequest, match="overruns"):
        write.receive(len(value) - 1, 2, lambda view, hasher: None)
    assert write.commit(checksum(value))
    assert tier.stats()["whole_hashes"] == whole_before
    assert read(tier, b"pieces") == value


def test_a_commit_with_the_wrong_checksum_is_refused_and_never_visible(tier):
    write = written(tier, b"bad", b"0123456789")
    with pytest.raises(ChecksumMismatch):
        write.commit(checksum(b"something else"))
    assert read(tier, b"bad") is None and not tier.exists(b"bad")
    assert tier.stats()["checksum_failures"] == 1
    with pytest.raises(InvalidRequest, match="not a write in flight"):
        write.commit(checksum(b"0123456789"))
    assert tier.stats()["pins"] == 0


def test_an_aborted_write_is_never_visible_and_frees_its_pin(tier):
    write = written(tier, b"gone", b"abcde")
    write.abort()
    write.abort()                                   # twice, or unknown: ignored
    assert read(tier, b"gone") is None
    with pytest.raises(InvalidRequest):
        write.commit(checksum(b"abcde"))
    assert tier.stats()["pins"] == 0


def test_exists_and_delete_follow_puts_and_replacements(tier):
    assert not tier.exists(b"e") and not tier.delete(b"e")
    put(tier, b"e", b"first")
    put(tier, b"e", b"second")
    assert tier.exists(b"e") and read(tier, b"e") == b"second"
    assert tier.delete(b"e")
    assert not tier.exists(b"e") and read(tier, b"e") is None
    assert not tier.delete(b"e")
    assert tier.stats()["deletes"] == 1


def test_a_lease_still_reads_the_value_it_pinned_after_a_delete(tier):
    put(tier, b"d", b"old bytes")
    lease = tier.lease(b"d")
    view = lease.view()
    assert tier.delete(b"d") and not tier.exists(b"d")
    assert bytes(view) == b"old bytes"
    view.release()
    assert lease.release()


def test_keys_with_groups_returns_the_group_each_key_was_put_with(tier):
    put(tier, b"grouped", b"g" * 100, group=0xABCDEF)
    put(tier, b"plain", b"p" * 100)
    put(tier, b"deleted", b"x" * 100, group=7)
    tier.delete(b"deleted")
    assert sorted(tier.keys_with_groups()) == [(b"grouped", 0xABCDEF), (b"plain", 0)]


def test_expired_leases_and_writes_are_reaped_and_server_driven_pins_are_not(tier):
    put(tier, b"r", b"r" * 100)
    expiring = tier.lease(b"r")
    kept = tier.lease(b"r", expires=False)
    write = tier.alloc(b"w", 10)
    assert tier.reap_expired() == 0                  # not yet
    assert tier.reap_expired(time.monotonic() + TTL_S + 1) == 2
    assert not expiring.release()
    with pytest.raises(InvalidRequest):
        expiring.view()
    with pytest.raises(InvalidRequest):
        fill(write, b"0123456789")
    stats = tier.stats()
    assert stats["expired_pins"] == 2 and stats["pins"] == 1
    assert kept.release()


def test_stats_have_every_key_stat_and_metrics_read(tier):
    put(tier, b"s", b"s" * 1000)
    read(tier, b"s")
    read(tier, b"absent")
    stats = tier.stats()
    assert set(stats) >= STAT_KEYS and all(type(v) is int for v in stats.values())
    assert (stats["objects"], stats["bytes"], stats["puts"]) == (1, 1000, 1)
    assert (stats["hits"], stats["misses"]) == (1, 1)
    assert stats["capacity_bytes"] == tier.arena.size_bytes == 8 * SEG


def test_tier_stats_are_per_tier_with_a_cold_tier_and_none_without(tier, kind):
    put(tier, b"t", b"t" * 1000)
    read(tier, b"absent")
    tiers = tier.tier_stats()
    if kind == "hot":
        assert tiers is None
        return
    assert tiers is not None and {k: set(v) for k, v in tiers.items()} == PER_TIER_KEYS
    assert all(type(v) is int for values in tiers.values() for v in values.values())
    assert tiers["hot"]["objects"] == 1 and tiers["hot"]["bytes"] == 1000
    assert tiers["cold"]["capacity_bytes"] == DISK_BYTES and tiers["cold"]["misses"] == 1


def test_the_arena_is_offered_and_close_with_unlink_removes_it(kind, tmp_path):
    made = open_tier(kind, tmp_path)
    path = made.arena.path
    try:
        assert made.arena.fd >= 0 and os.path.exists(path)
        put(made, b"c", b"c" * 10)
    finally:
        made.close(unlink=True)
    assert not os.path.exists(path) and not os.path.exists(path + ".key")


def test_put_many_stores_whole_values_refuses_bad_ones_and_replaces_old(tier):
    put(tier, b"old", b"first version")
    good = {f"many-{i}".encode(): bytes([i]) * (100 + i) for i in range(200)}
    good[b"old"] = b"second version"
    items = [(key, memoryview(value), checksum(value)) for key, value in good.items()]
    items.insert(7, (b"liar", memoryview(b"these bytes"), checksum(b"other bytes")))
    items.append((b"huge", memoryview(bytes(9 * SEG)), checksum(bytes(9 * SEG))))
    stored = tier.put_many(items, group=0xBEEF)
    assert stored[7] is Stored.MISMATCH and stored[-1] is Stored.NO_SPACE
    assert [s for i, s in enumerate(stored) if i not in (7, len(items) - 1)] == \
        [Stored.OK] * len(good)
    assert {key: read(tier, key) for key in good} == good
    assert read(tier, b"liar") is None and read(tier, b"huge") is None
    assert tier.stats()["checksum_failures"] == 1
    assert dict(tier.keys_with_groups())[b"many-3"] == 0xBEEF
    assert tier.stats()["objects"] == len(good)
    assert tier.stats()["bytes"] == sum(map(len, good.values()))
    assert tier.stats()["pins"] == 0


def test_read_many_copies_small_values_and_leaves_the_rest_to_leases(tier, kind):
    values = {f"r{i}".encode(): bytes([i]) * (1000 + i) for i in range(10)}
    for key, val in values.items():
        put(tier, key, val)
    keys = [*values, b"absent"]
    copies, left = tier.read_many(keys, budget_bytes=5100)
    copied = {keys[i]: c for i, c in enumerate(copies) if c is not None}
    assert list(copied) == keys[:5]                 # 1000 + 1001 + ... + 1004 fit in 5100
    assert all(c.value == values[k] and c.checksum == checksum(values[k])
               for k, c in copied.items())
    expected_left = list(range(5, 10)) + ([10] if kind != "hot" else [])
    assert left == expected_left                    # a cold tier may hold the absent key
    assert tier.stats()["pins"] == 0


def put_pinned(tier: Tier, key: bytes, value: bytes) -> None:
    assert written(tier, key, value, pinned=True).commit(checksum(value))


def churn(tier: Tier, arenas: int) -> None:
    """KV values (unpinned, never read) through the arena ``arenas`` times over."""
    value = b"v" * (SEG // 4)
    for i in range(arenas * 8 * 4):
        put(tier, f"kv/{i}".encode(), value)


def test_pinned_values_stay_in_memory_through_kv_churn(tier):
    pinned = {b"file/c/a": b"a" * (SEG // 2), b"file/c/b": b"b" * (SEG // 3),
              b"file/m/x": b"a manifest"}
    put_pinned(tier, b"file/c/a", pinned[b"file/c/a"])
    put(tier, b"kv/early", b"e" * 1000)
    put_pinned(tier, b"file/c/b", pinned[b"file/c/b"])
    value = pinned[b"file/m/x"]
    assert tier.put_many([(b"file/m/x", memoryview(value), checksum(value))],
                         pinned=True) == [Stored.OK]
    churn(tier, 3)
    copies, _ = tier.read_many(list(pinned), budget_bytes=PIN_BUDGET)
    assert [c.value if c else None for c in copies] == list(pinned.values())   # all in memory
    # a KV value of the first turn, in a span of its own: gone from memory (one that shares
    # the pinned values' span, such as kv/early, stays with it)
    assert tier.read_many([b"kv/10"], budget_bytes=SEG)[0] == [None]
    stats = tier.stats()
    assert stats["evicted_segments"] + stats["demoted_objects"] > 0
    assert stats["pinned_objects"] == 3 and 0 < stats["pinned_bytes"] <= PIN_BUDGET
    assert tier.pinned_keys(b"file/", limit=10) == sorted(pinned)
    assert tier.pinned_keys(b"file/c/", after=b"file/c/a", limit=10) == [b"file/c/b"]
    assert tier.pinned_keys(b"kv/", limit=10) == []


def test_a_pinned_put_past_the_budget_is_refused_and_a_delete_gives_its_room_back(tier):
    big = b"p" * (SEG - 1024)                     # one segment each
    for i in range(4):
        put_pinned(tier, f"file/c/{i}".encode(), big)
    with pytest.raises(NoSpace, match="pin budget"):
        tier.alloc(b"file/c/4", len(big), pinned=True)
    items = [(b"file/c/4", memoryview(big), checksum(big))]
    assert tier.put_many(items, pinned=True) == [Stored.NO_SPACE]
    put(tier, b"kv/plain", big)                   # unpinned values still go in
    assert read(tier, b"kv/plain") == big
    assert tier.delete(b"file/c/0")
    assert tier.put_many(items, pinned=True) == [Stored.OK]
    put(tier, b"file/c/1", b"put again, unpinned")  # the pin goes with the value it was on
    stats = tier.stats()
    assert (stats["pinned_objects"], stats["pinned_bytes"]) == (3, 3 * SEG)
    assert tier.pinned_keys(b"", limit=10) == [b"file/c/2", b"file/c/3", b"file/c/4"]
    churn(tier, 2)
    assert all(read(tier, f"file/c/{i}".encode()) == big for i in (2, 3, 4))


def test_pinned_writes_in_flight_count_against_the_budget_from_their_alloc(tier):
    big = b"w" * (SEG - 1024)                     # one segment each
    writes = [written(tier, f"file/c/{i}".encode(), big, pinned=True) for i in range(4)]
    assert tier.stats()["pinned_bytes"] == 4 * SEG and tier.stats()["pinned_objects"] == 0
    with pytest.raises(NoSpace, match="pin budget"):
        tier.alloc(b"file/c/4", len(big), pinned=True)
    writes[0].abort()                             # an abandoned write gives its room back
    with pytest.raises(ChecksumMismatch):         # and so does a refused one
        writes[1].commit(checksum(b"other bytes"))
    assert tier.stats()["pinned_bytes"] == 2 * SEG
    for write in writes[2:]:
        assert write.commit(checksum(big))
    stats = tier.stats()
    assert (stats["pinned_objects"], stats["pinned_bytes"]) == (2, 2 * SEG)
    put_pinned(tier, b"file/c/5", big)
    assert tier.pinned_keys(b"file/", limit=9) == [b"file/c/2", b"file/c/3", b"file/c/5"]


class HeldPuts:
    """A real cold store whose puts wait for ``release``: a demotion caught mid-write."""

    def __init__(self, cold) -> None:
        import threading
        self.cold, self.started, self.release = cold, threading.Event(), threading.Event()

    def put(self, *args, **kwargs):
        self.started.set()
        self.release.wait(10)
        return self.cold.put(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.cold, name)


def test_a_delete_during_its_keys_demotion_is_acknowledged_once_the_disk_copy_is_gone(
        tmp_path):
    """A crash between a demotion's disk write and its cleanup brought a deleted value back
    (the arena's tombstones do not reach the disk): the fault suite's cold-tier crash round
    read a deleted key's old value, once under load. The delete now waits for the write."""
    import threading
    (tmp_path / "disk").mkdir()
    cold = HeldPuts(SegmentColdStore(str(tmp_path / "disk"), DISK_BYTES))
    store = TieredStore(_hot(f"gcache-conformance-{uuid.uuid4().hex[:8]}", cold_backed=True),
                        cold, headroom_segments=2)
    try:
        put(store, b"k", b"old value")
        entry = store.hot.entry(b"k")
        demotion = threading.Thread(target=store.demote, args=([entry],))
        demotion.start()
        assert cold.started.wait(5)
        deleted: list[bool] = []
        delete = threading.Thread(target=lambda: deleted.append(store.delete(b"k")))
        delete.start()
        delete.join(0.5)
        assert delete.is_alive() and not deleted      # not acknowledged mid-write
        cold.release.set()
        demotion.join(5)
        delete.join(5)
        assert deleted == [True]
        assert cold.lookup(b"k") is None and not store.exists(b"k")
    finally:
        cold.release.set()
        store.close(unlink=True)

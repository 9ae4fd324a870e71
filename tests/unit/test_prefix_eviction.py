"""Prefix-aware reclaim in the hot tier (real shared memory): a value put with a parent
(``FLAG_PARENT``) is of no use once the parent is gone, so it gets no second chance, and the
tier counts such values (``sweep_unreachable``); the parent is in the record, so a restart
keeps it."""

import uuid

import pytest

from gcache.keys import checksum
from gcache.server.tier import HotTier
from tests.unit.tier_ops import put, read, written

SEG = 64 * 1024
VALUE = b"v" * (SEG // 4 - 256)           # four records per segment, 32 in the arena


@pytest.fixture
def tier_factory():
    made = []

    def make(name: str | None = None, **kwargs) -> HotTier:
        made.append(HotTier(name=name or f"gcache-unit-{uuid.uuid4().hex[:8]}",
                            size_bytes=8 * SEG, segment_size=SEG, prefault=False,
                            lease_ttl_s=60.0, **kwargs))
        return made[-1]
    yield make
    for t in made:
        t.close(unlink=True)


def chain(tier: HotTier, prefix: str, n: int) -> list[bytes]:
    """``n`` pages, each the parent of the next, every one read since it was written."""
    keys = [f"{prefix}{i}".encode() for i in range(n)]
    for i, key in enumerate(keys):
        put(tier, key, VALUE, keys[i - 1] if i else b"")
    assert all(read(tier, key) == VALUE for key in keys)
    return keys


def turn(tier: HotTier, tag: str) -> None:
    """A whole arena of new values without parents: every segment is reclaimed once."""
    for i in range(32):
        put(tier, f"{tag}{i}".encode(), VALUE)


def test_a_read_value_below_a_missing_page_gets_no_second_chance(tier_factory):
    """Deleting page 1 of a read chain leaves pages 2 and 3 unreachable: the reclaim keeps
    page 0, which can still hit, and lets 2 and 3 go though they were read; a chain left whole
    keeps every page."""
    tier = tier_factory()
    broken = chain(tier, "a", 4)
    assert tier.delete(broken[1])
    turn(tier, "x")
    assert [tier.exists(k) for k in broken] == [True, False, False, False]
    stats = tier.stats()
    assert stats["unreachable_evicted"] == 2 and stats["second_chances"] == 1, stats
    assert tier.entry(broken[0]).parent == b""

    whole = chain(tier, "b", 4)
    turn(tier, "y")
    assert all(tier.exists(k) for k in whole)
    assert [tier.entry(k).parent for k in whole] == [b""] + whole[:3]
    assert tier.stats()["unreachable_evicted"] == 2


def test_a_page_whose_unread_parent_is_reclaimed_with_it_goes_too(tier_factory):
    """The parent went in the same reclaim because nobody read it: its read child, in the same
    segment, cannot hit without it and is not re-appended."""
    tier = tier_factory()
    put(tier, b"p0", VALUE)
    put(tier, b"p1", VALUE, b"p0")
    put(tier, b"q0", VALUE)
    put(tier, b"q1", VALUE, b"q0")
    assert read(tier, b"p1") == VALUE
    assert read(tier, b"q0") == VALUE and read(tier, b"q1") == VALUE
    turn(tier, "x")
    assert [tier.exists(k) for k in (b"p0", b"p1", b"q0", b"q1")] == [False, False, True, True]
    assert tier.stats()["unreachable_evicted"] == 1


def test_the_sweep_counts_values_whose_prefix_is_broken_anywhere_above(tier_factory):
    tier = tier_factory()
    tier.sweep_unreachable()
    assert (tier.stats()["unreachable_objects"], tier.stats()["unreachable_bytes"]) == (0, 0)
    keys = chain(tier, "c", 5)
    put(tier, b"lone", VALUE, b"never-written")
    tier.sweep_unreachable()
    assert tier.stats()["unreachable_objects"] == 1
    assert tier.delete(keys[2])                  # 3 directly, 4 through 3
    tier.sweep_unreachable()
    stats = tier.stats()
    assert (stats["unreachable_objects"], stats["unreachable_bytes"]) == (3, 3 * len(VALUE))
    put(tier, keys[2], VALUE, keys[1])           # written again: whole once more
    tier.sweep_unreachable()
    assert tier.stats()["unreachable_objects"] == 1


def test_a_restart_keeps_each_value_s_parent(tier_factory):
    name = f"gcache-unit-{uuid.uuid4().hex[:8]}"
    first = tier_factory(name)
    keys = chain(first, "r", 3)
    put(first, b"orphan", VALUE, b"gone")
    write = written(first, b"many", b"0123456789", parent=b"r2")     # many records, one key
    write.commit(checksum(b"0123456789"))
    first.arena.close(unlink=False)
    second = tier_factory(name)
    assert second.stats()["recovered_objects"] == 5
    assert [second.entry(k).parent for k in keys] == [b"", keys[0], keys[1]]
    assert read(second, b"many") == b"0123456789" and read(second, b"orphan") == VALUE
    second.sweep_unreachable()
    assert second.stats()["unreachable_objects"] == 1


def test_the_demoter_neither_keeps_nor_demotes_what_can_no_longer_hit(tier_factory):
    """With a cold tier a value whose parent is in neither tier is let go with its span; one
    whose parent was demoted to disk can still hit and is demoted as usual."""
    tier = tier_factory(cold_backed=True)
    put(tier, b"d0", VALUE)
    put(tier, b"d1", VALUE, b"d0")
    put(tier, b"e1", VALUE, b"e0")
    live = [tier.entry(k) for k in (b"d0", b"d1", b"e1")]
    assert [e.key for e in tier.reclaim.keep_read(live, lambda key: False)] == [b"d0", b"d1"]
    assert tier.stats()["unreachable_evicted"] == 1
    kept = tier.reclaim.keep_read([tier.entry(b"e1")], lambda key: key == b"e0")
    assert [e.key for e in kept] == [b"e1"]


def test_under_churn_a_reclaim_keeps_exactly_the_read_values_that_can_still_hit(tier_factory):
    """Chains of read pages, each cut at a different page: one reclaim of every segment
    keeps each chain's pages above the cut and none below it."""
    tier = tier_factory()
    chains = [chain(tier, f"g{g}/", 5) for g in range(3)]
    cuts = [1, 2, 4]
    for keys, cut in zip(chains, cuts):
        assert tier.delete(keys[cut])
    turn(tier, "x")
    for keys, cut in zip(chains, cuts):
        assert [tier.exists(k) for k in keys] == [i < cut for i in range(len(keys))], keys
    stats = tier.stats()
    assert stats["unreachable_evicted"] == sum(len(k) - cut - 1 for k, cut in zip(chains, cuts))
    assert stats["second_chances"] == sum(cuts)


def test_a_span_mostly_unreachable_is_reclaimed_before_older_ones(tier_factory):
    """Segment 1 holds a chain hanging from a page that is gone; once a sweep has counted it,
    the next claim takes it rather than segment 0, whose values can still hit."""
    tier = tier_factory()
    plain = [f"a{i}".encode() for i in range(4)]
    for key in plain:
        put(tier, key, VALUE)
    broken = [f"b{i}".encode() for i in range(4)]
    for i, key in enumerate(broken):
        put(tier, key, VALUE, broken[i - 1] if i else b"gone")
    for i in range(24):                          # the rest of the arena: segment 1 ages
        put(tier, f"c{i}".encode(), VALUE)
    tier.sweep_unreachable()
    assert tier.stats()["unreachable_objects"] == 4
    put(tier, b"next", VALUE)
    assert all(tier.exists(k) for k in plain)
    assert not any(tier.exists(k) for k in broken)
    tier.sweep_unreachable()
    assert tier.stats()["unreachable_objects"] == 0
    put(tier, b"after", VALUE)                   # nothing counted now: the oldest goes again
    put(tier, b"after2", VALUE)
    put(tier, b"after3", VALUE)
    put(tier, b"after4", VALUE)
    assert not any(tier.exists(k) for k in plain)


def test_parents_that_make_a_cycle_cost_the_sweep_one_walk(tier_factory):
    """A client may name any key as a parent, its own included: the sweep counts a cycle as
    broken once instead of walking it forever."""
    tier = tier_factory()
    put(tier, b"self", b"x", b"self")
    put(tier, b"ping", b"x", b"pong")
    put(tier, b"pong", b"x", b"ping")
    put(tier, b"below", b"x", b"ping")
    tier.sweep_unreachable()
    assert tier.stats()["unreachable_objects"] == 4


def test_a_value_demoted_to_disk_and_read_back_keeps_its_parent(tier_factory, tmp_path):
    """The cold tier keeps what a value hangs from, so a promotion hands it back to memory's
    reclaim (a value promoted without it would keep second chances it can no longer use)."""
    from gcache.server.cold_segments import SegmentColdStore
    from gcache.server.tiered import TieredStore
    disk = tmp_path / "disk"
    disk.mkdir()
    store = TieredStore(tier_factory(cold_backed=True), SegmentColdStore(str(disk), 16 << 20),
                        headroom_segments=2)
    try:
        put(store, b"p0", VALUE)
        put(store, b"p1", VALUE, b"p0")
        assert store.demote([store.hot.entry(b"p0"), store.hot.entry(b"p1")]) == 2
        assert store.cold.lookup(b"p1").parent == b"p0"
        assert store.hot.delete(b"p1") and store.hot.entry(b"p1") is None   # memory let it go
        assert read(store, b"p1") == VALUE                                  # promoted
        assert store.hot.entry(b"p1").parent == b"p0"
    finally:
        store.cold.close()

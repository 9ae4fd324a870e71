"""The hot tier in-process: allocation, commit, leases, eviction order (real shared memory)."""

import threading
import time
import uuid

import pytest

from gcache.errors import ChecksumMismatch, InvalidRequest, NoSpace
from gcache.keys import checksum
from gcache.server.reclaim import PIN_WAIT_S
from gcache.server.tier import HotTier
from gcache.server.tier_protocol import Stored
from tests.unit.tier_ops import fill, put, read, written

SEG = 64 * 1024


@pytest.fixture
def tier_factory():
    made = []

    def make(**kwargs) -> HotTier:
        made.append(HotTier(name=f"gcache-unit-{uuid.uuid4().hex[:8]}", size_bytes=8 * SEG,
                            segment_size=SEG, prefault=True, lease_ttl_s=60.0, **kwargs))
        return made[-1]
    yield make
    for t in made:
        t.close(unlink=True)


@pytest.fixture
def tier(tier_factory):
    return tier_factory()


def test_committed_values_read_back(tier):
    put(tier, b"a", b"x" * 1000)
    assert read(tier, b"a") == b"x" * 1000
    assert tier.stats()["objects"] == 1


def test_uncommitted_and_mismatched_writes_are_never_visible(tier):
    write = written(tier, b"k", b"0123456789")
    assert read(tier, b"k") is None
    with pytest.raises(ChecksumMismatch):
        write.commit(checksum(b"something else"))
    assert read(tier, b"k") is None and tier.stats()["checksum_failures"] == 1
    with pytest.raises(InvalidRequest, match="not a write in flight"):
        write.commit(0)


def test_eviction_drops_the_oldest_segment_first(tier):
    value = b"v" * (SEG // 2 - 256)              # two records per segment
    keys = [f"k{i}".encode() for i in range(24)]
    for key in keys:
        put(tier, key, value)
    present = [k for k in keys if read(tier, k) is not None]
    assert present == keys[-len(present):]       # a suffix: the oldest went first
    assert 12 <= len(present) <= 16 and tier.stats()["evicted_segments"] >= 4


def test_a_lease_pins_its_segment_against_eviction(tier):
    value = b"p" * (SEG - 256)
    put(tier, b"pinned", value)
    lease = tier.lease(b"pinned")
    view = lease.view()
    for i in range(20):
        put(tier, f"other{i}".encode(), value)
    assert bytes(view) == value                  # never overwritten while leased
    view.release()
    lease.release()
    for i in range(20):
        put(tier, f"more{i}".encode(), value)
    assert read(tier, b"pinned") is None


def lease_every_segment(tier, value: bytes, segments: int = 8) -> list:
    """One value a segment, each leased: the leases."""
    leases = []
    for i in range(segments):
        put(tier, f"k{i}".encode(), value)
        leases.append(tier.lease(f"k{i}".encode()))
    return leases


def test_when_everything_is_pinned_there_is_no_space(tier):
    value = b"z" * (SEG - 256)
    leases = lease_every_segment(tier, value)
    with pytest.raises(NoSpace):
        tier.alloc(b"new", len(value))
    leases[0].release()
    tier.alloc(b"new", len(value))


def test_an_allocation_that_finds_every_span_pinned_waits_for_a_pin_to_drop(tier):
    """Pins are mostly transfers in flight or a dead peer's, let go within milliseconds: a
    writer waits for one (``PIN_WAIT_S``) instead of being refused at once."""
    value = b"z" * (SEG - 256)
    leases = lease_every_segment(tier, value)
    got: list[object] = []
    writer = threading.Thread(target=lambda: got.append(tier.alloc(b"new", len(value),
                                                                   wait_s=60.0)))
    writer.start()
    time.sleep(0.05)             # most likely waiting by now; the test holds either way
    leases[0].release()
    writer.join(60)
    assert len(got) == 1 and got[0].entry.key == b"new", got
    got[0].abort()
    for lease in leases[1:]:
        lease.release()


def test_once_a_wait_for_a_pin_runs_out_allocations_refuse_at_once_until_one_drops(tier):
    """A batch of ALLOCs into an arena pinned full must not take a wait each."""
    value = b"z" * (SEG - 256)
    leases = lease_every_segment(tier, value)
    with pytest.raises(NoSpace):
        tier.alloc(b"first", len(value))            # waits PIN_WAIT_S in vain
    assert tier.stats()["pin_waits_expired"] == 1
    with pytest.raises(NoSpace):
        tier.alloc(b"second", len(value))
    assert tier.stats()["pin_waits_expired"] == 1  # refused without a wait
    leases[0].release()
    tier.alloc(b"third", len(value)).abort()
    for lease in leases[1:]:
        lease.release()


def test_a_value_just_written_outlives_a_claim_while_older_spans_are_pinned_briefly(tier):
    """Older spans pinned by peers in flight, the young ones free: a claim waits for a pin to
    drop rather than take the segment of a value acknowledged a moment before (the fault
    suite's hostile-peers scenario lost one that way, read back at once, in 1 run of 40)."""
    value = b"z" * (SEG - 256)
    leases = lease_every_segment(tier, value)           # k6, k7: the last quarter, young
    for lease in leases[6:]:
        lease.release()
    releaser = threading.Timer(0.05, leases[0].release)
    releaser.start()
    put(tier, b"new", value)
    releaser.join()
    assert tier.exists(b"k6") and tier.exists(b"k7") and not tier.exists(b"k0")
    for lease in leases[1:6]:
        lease.release()


def test_when_no_older_pin_drops_in_time_a_young_span_is_taken_not_refused(tier):
    value = b"z" * (SEG - 256)
    leases = lease_every_segment(tier, value)
    for lease in leases[6:]:
        lease.release()
    started = time.monotonic()
    put(tier, b"new", value)
    assert time.monotonic() - started >= PIN_WAIT_S * 0.9       # it waited, then took k6
    assert not tier.exists(b"k6") and tier.exists(b"k7") and tier.exists(b"new")
    stats = tier.stats()
    assert stats["pin_waits_expired"] == 1 and stats["young_spans_reclaimed"] == 1
    for lease in leases[:6]:
        lease.release()


def write_late(tier, key: bytes, value: bytes, *, others: int = 7):
    """``key`` allocated and written but not committed while ``others`` segment-sized values
    claim the rest of the arena: its span (the first) is the oldest by the time it commits."""
    write = written(tier, key, value)
    for i in range(others):
        put(tier, f"k{i}".encode(), b"z" * (SEG - 256))
    return write


def test_a_value_committed_after_its_span_aged_counts_as_young_from_its_commit(tier):
    """ALLOC, then others claim most of the arena, then COMMIT: the next claim takes the oldest
    of the other spans, not the one holding the value acknowledged a moment ago (the fault
    suite's hostile-peers scenario lost one that way, read back 0.3 ms after its ack)."""
    value = b"late" * 250
    write_late(tier, b"late", value).commit(checksum(value))
    put(tier, b"new", b"n" * (SEG - 256))
    assert read(tier, b"late") == value and not tier.exists(b"k0") and tier.exists(b"k1")


def test_allocations_never_committed_do_not_age_a_committed_value(tier):
    """Peers that ALLOC and die claim spans without writing a value: a value committed
    before them stays young however many there are (counted by claims, the hostile-peers
    scenario's dying peers aged every span twice as fast as the values really written)."""
    value = b"v" * (SEG // 2)
    put(tier, b"kept", value)
    for i in range(5):                               # 5 of 8 segments, past a quarter arena
        tier.alloc(f"dead{i}".encode(), SEG - 256).abort()
    kept = tier.arena.segment_of(tier.entry(b"kept").record)
    assert tier.arena.is_young(kept)
    for i in range(3):                               # commits count: a quarter arena on, it
        put(tier, f"next{i}".encode(), b"n" * (SEG - 256))           # is old
    assert not tier.arena.is_young(kept) and tier.exists(b"kept")


def test_among_young_spans_the_claim_takes_the_one_written_least_recently(tier):
    """The older spans pinned past the wait, the claim takes a young span: the one whose last
    write is oldest, not the one claimed first (which may hold the value committed last)."""
    value = b"late" * 250
    write = write_late(tier, b"late", value)
    leases = [tier.lease(f"k{i}".encode()) for i in range(5)]        # k5, k6 young and free
    write.commit(checksum(value))
    put(tier, b"new", b"n" * (SEG - 256))                # after PIN_WAIT_S
    assert read(tier, b"late") == value and not tier.exists(b"k5") and tier.exists(b"k6")
    for lease in leases:
        lease.release()


def demote_once(tier) -> None:
    """What the demoter does with one span: re-append its values read since written (into the
    cleaner's reserve), take the rest as written to disk, and mark it clean."""
    head, live = tier.claim_dirty(len(tier.arena.segments))
    tier.reclaim.settle(head, demoted=len(tier.reclaim.keep_read(live)))


def test_with_a_cold_tier_a_clean_young_span_is_taken_at_once(tier_factory):
    """Behind a cold tier only clean spans are reused, and a clean span's values are on disk:
    the young ones are fair game. Sparing them, a promotion waited on the demoter (which had
    enough clean spans and rested) until it ran out of time: NO_SPACE under CPU load."""
    tier = tier_factory(cold_backed=True)
    value = b"z" * (SEG - 256)
    leases = lease_every_segment(tier, value, segments=5)          # k0-k4, pinned
    put(tier, b"y0", value)
    put(tier, b"y1", value)                                        # the young quarter
    assert read(tier, b"y0") == value
    demote_once(tier)                  # y0 re-appended into the reserve (a copy: not young)
    demote_once(tier)                  # y1
    for lease in leases:               # the old spans: dirty, unpinned; the clean ones young
        lease.release()
    started = time.monotonic()
    tier.alloc(b"new", len(value), wait_s=3.0)
    assert time.monotonic() - started < 1.0          # not a wait for a demoter with no work
    assert all(tier.exists(key) for key in [b"y0", b"y1", *(f"k{i}".encode() for i in range(5))])


def test_a_claim_refused_for_want_of_space_leaves_the_open_segment_open(tier):
    """A large value that finds every segment pinned must not close the open segment: the
    small values after it still fit there (else each would need a whole free segment too)."""
    leases = lease_every_segment(tier, b"z" * (SEG // 2))    # the newest keeps half its room
    with pytest.raises(NoSpace, match="8 of 8 spans pinned"):
        tier.alloc(b"large", SEG - 256)
    put(tier, b"small", b"s" * 1000)
    assert read(tier, b"small") == b"s" * 1000
    for lease in leases:
        lease.release()


def test_values_larger_than_a_segment_take_a_span(tier):
    big = bytes(range(256)) * (3 * SEG // 256)
    put(tier, b"big", big)
    assert read(tier, b"big") == big
    with pytest.raises(NoSpace, match="exceed"):
        tier.alloc(b"huge", 9 * SEG)


def test_expired_pins_are_reaped(tier):
    write = tier.alloc(b"abandoned", 100)
    assert tier.stats()["pins"] == 1

    assert tier.reap_expired(time.monotonic() + 61) == 1
    assert tier.stats()["pins"] == 0
    with pytest.raises(InvalidRequest):
        fill(write, b"x" * 10)


def test_a_deleted_key_stays_readable_through_an_open_lease(tier):
    put(tier, b"d", b"old bytes")
    lease = tier.lease(b"d")
    view = lease.view()
    assert tier.delete(b"d") and not tier.exists(b"d")
    assert bytes(view) == b"old bytes"
    view.release()
    lease.release()


def test_in_order_writes_are_hashed_as_they_land_and_any_order_still_commits(tier):
    value = bytes(range(256)) * 64
    for order in ([0, 1, 2, 3], [2, 0, 3, 1]):
        key = f"ordered-{order[0]}".encode()
        write = tier.alloc(key, len(value))
        for part in order:
            assert fill(write, value[part * 4096:(part + 1) * 4096], part * 4096)
        write.commit(checksum(value))
        assert read(tier, key) == value


def test_pins_of_server_driven_transfers_never_expire(tier):
    put(tier, b"streaming", b"s" * 100)
    lease = tier.lease(b"streaming", expires=False)
    write = tier.alloc(b"incoming", 100, expires=False)
    assert tier.reap_expired(time.monotonic() + 1e6) == 0
    view = lease.view()
    assert bytes(view) == b"s" * 100
    view.release()
    lease.release()
    write.abort()
    assert tier.stats()["pins"] == 0


def test_stat_bytes_follow_puts_overwrites_deletes_and_evictions(tier):
    # STAT's live bytes are a running sum (no scan under the lock): after every kind of change
    # they equal the bytes of what reads back.
    import random
    rng = random.Random(7)
    live: dict[bytes, int] = {}
    for step in range(400):
        key = b"k%d" % rng.randrange(40)
        if rng.random() < 0.2:
            tier.delete(key)
        else:
            size = rng.randrange(1, 9000)
            put(tier, key, bytes([step % 251]) * size)
    for i in range(40):
        value = read(tier, b"k%d" % i)
        if value is not None:
            live[b"k%d" % i] = len(value)
    stats = tier.stats()
    assert stats["evicted_segments"] > 0           # evictions happened along the way
    assert stats["bytes"] == sum(live.values()) and stats["objects"] == len(live)


def test_an_arena_its_tmpfs_cannot_hold_is_refused_before_a_page_is_touched():
    """Mapping it would succeed and the prefault would die of SIGBUS: refused as config."""
    import os
    import uuid

    from gcache.errors import ConfigError
    from gcache.server.arena import Arena
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    name = f"gcache-test-room-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(ConfigError, match="free"):
            Arena(name=name, size_bytes=(free // SEG + 16) * SEG, segment_size=SEG,
                  prefault=True)
        assert os.stat(f"/dev/shm/{name}").st_blocks == 0        # nothing allocated
    finally:
        for suffix in ("", ".key"):
            if os.path.exists(f"/dev/shm/{name}{suffix}"):
                os.unlink(f"/dev/shm/{name}{suffix}")


def test_a_value_read_since_it_was_written_gets_a_second_chance_once(tier):
    """Eviction by age alone drops a prefix's shared head first; a value read since it was
    written is re-appended where the evicted segment reopens (once per read), and the
    values nobody came back for go in its place."""
    value = b"v" * (SEG // 4 - 256)              # four records per segment, 32 in the arena
    old = [f"old{i}".encode() for i in range(4)]
    for key in old:
        put(tier, key, value)
    assert read(tier, old[0]) == value and read(tier, old[2]) == value

    def turn(tag: str) -> None:                  # a whole arena of new values: every segment
        for i in range(32):                      # is reclaimed once
            put(tier, f"{tag}{i}".encode(), value)

    turn("a")                                    # exists() is no read: it earns nothing
    assert [tier.exists(k) for k in old] == [True, False, True, False]
    assert tier.stats()["second_chances"] == 2
    assert read(tier, old[0]) == value
    turn("b")
    assert [tier.exists(k) for k in old] == [True, False, False, False]
    assert tier.stats()["second_chances"] == 3
    turn("c")                                    # unread through a whole turn: gone at last
    assert not any(tier.exists(k) for k in old)
    stats = tier.stats()
    assert stats["bytes"] == stats["objects"] * len(value)
    assert stats["evicted_objects"] + stats["objects"] == 4 + 3 * 32


def test_second_chances_never_take_the_segment_of_the_record_that_needed_the_room():
    """Re-appending read values may reclaim more segments; in a two-segment arena the next
    oldest is the one just opened for the caller's record, which is not written yet."""
    t = HotTier(name=f"gcache-unit-{uuid.uuid4().hex[:8]}", size_bytes=2 * SEG,
                segment_size=SEG, prefault=False, lease_ttl_s=60.0)
    try:
        value = b"r" * (SEG // 4 - 256)
        written = {}
        for round_ in range(12):
            for i in range(4):
                key = f"k{round_}-{i}".encode()
                items = [(key, memoryview(value), checksum(value))]
                assert t.put_many(items) == [Stored.OK]
                written[key] = value
            for key in list(written)[-6:]:
                if t.exists(key):
                    assert read(t, key) == value          # read: a second chance each time
        for key in written:
            got = read(t, key)
            assert got is None or got == value
        stats = t.stats()
        assert stats["second_chances"] > 0 and stats["bytes"] == stats["objects"] * len(value)
    finally:
        t.close(unlink=True)


def test_a_second_chance_sweep_never_wraps_round_to_a_value_just_written(tier):
    """When every value is read, each re-appended segment reclaims another; in a small arena
    a sweep of ``RESCUE_SEGMENTS`` would wrap around and evict a value acknowledged a moment
    ago, before its writer could read it back. The cap on a sweep and the young-span rule
    each keep it from wrapping."""
    value = b"w" * (SEG // 4 - 256)              # four records per segment, 32 in the arena
    for i in range(31):
        put(tier, f"read{i}".encode(), value)
        assert read(tier, f"read{i}".encode()) == value
    put(tier, b"fresh", value)                   # the last record of the newest segment
    put(tier, b"next", value)                    # opens a segment: the sweep starts
    assert read(tier, b"fresh") == value and read(tier, b"next") == value
    stats = tier.stats()
    assert stats["second_chances"] > 0 and stats["evicted_objects"] > 0, stats
    assert stats["bytes"] == stats["objects"] * len(value)


def test_a_value_outlives_a_quarter_arena_of_writes_when_everything_else_is_read(tier):
    """Second chances re-append read values at the young end, ahead of a value written before
    them that nobody has read yet; a sweep comes with each segment claimed, so in a small
    arena where every value is read, sweeps in a row came round to a value acknowledged a
    moment before (the fault suite's hostile-peers scenario). A span a client wrote into
    within the last quarter arena of client writes is reclaimed only when nothing older is
    left, and never to make room for copies."""
    value = b"q" * (SEG // 4 - 256)              # four records per segment, 32 in the arena
    for i in range(31):
        put(tier, f"read{i}".encode(), value)
        assert read(tier, f"read{i}".encode()) == value
    put(tier, b"fresh", value)
    for i in range(7):                           # a writer that reads each value back at once
        put(tier, f"later{i}".encode(), value)
        assert read(tier, f"later{i}".encode()) == value
        assert tier.exists(b"fresh"), f"gone after {i + 1} puts"
    stats = tier.stats()
    assert stats["second_chances"] > 0 and stats["bytes"] == stats["objects"] * len(value)


def test_pins_survive_a_restart_and_keep_holding_their_span():
    """The pin is in the record header: a server restarted on its arena finds its pinned values
    again, lists them, counts them against the budget and keeps them through churn."""
    name = f"gcache-unit-{uuid.uuid4().hex[:8]}"

    def open_tier() -> HotTier:
        return HotTier(name=name, size_bytes=8 * SEG, segment_size=SEG, prefault=False,
                       lease_ttl_s=60.0, pin_budget_bytes=2 * SEG)

    first = open_tier()
    try:
        files = {f"file/c/{i}".encode(): bytes([i]) * (SEG // 3) for i in range(4)}
        for key, value in files.items():
            written(first, key, value, pinned=True).commit(checksum(value))
        put(first, b"plain", b"x" * 100)
    finally:
        first.close(unlink=False)
    second = open_tier()
    try:
        assert second.pinned_keys(b"file/", limit=10) == sorted(files)
        stats = second.stats()
        assert (stats["pinned_objects"], stats["pinned_bytes"]) == (4, 2 * SEG)
        with pytest.raises(NoSpace, match="pin budget"):
            second.alloc(b"file/c/9", SEG // 2, pinned=True)
        for i in range(8 * 4 * 3):
            put(second, f"kv/{i}".encode(), b"v" * (SEG // 4))
        assert {key: read(second, key) for key in files} == files
        assert second.stats()["evicted_segments"] > 0
    finally:
        second.close(unlink=True)

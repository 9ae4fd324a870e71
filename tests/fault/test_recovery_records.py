"""What a restart keeps, record by record: the arena's own tier in-process, closed and reopened
on the same shared-memory file as a restarted server does (SIGKILL leaves the same bytes).

Each test pins one defect found under faults: a segment opened by a record other than a
committed PUT (an uncommitted write, a tombstone, a second-chance re-append) hid every later
value of that segment; a flipped bit in a key served one key's value under another; a flipped
byte in a header lost the rest of its segment.
"""

from __future__ import annotations

import uuid

import pytest

from gcache.keys import checksum
from gcache.record_layout import SPAN_HEADER_BYTES
from gcache.server.record import RECORD, RECORD_MAGIC, STATE_COMMITTED, header_check
from gcache.server.tier import HotTier
from gcache.server.tier_protocol import Stored
from tests.unit.tier_ops import put, read

SEG = 64 * 1024
SEGMENTS = 8


@pytest.fixture
def arena_name():
    name = f"gcache-recovery-{uuid.uuid4().hex[:8]}"
    opened: list[HotTier] = []

    def open_tier(pin_budget_bytes: int = 0) -> HotTier:
        tier = HotTier(name=name, size_bytes=SEGMENTS * SEG, segment_size=SEG, prefault=False,
                       lease_ttl_s=60.0, pin_budget_bytes=pin_budget_bytes)
        opened.append(tier)
        return tier

    yield open_tier
    for tier in opened:
        tier.close(unlink=True)


def restart(tier: HotTier, open_tier) -> HotTier:
    tier.close(unlink=False)
    return open_tier()


def value(i: int, size: int = 3000) -> bytes:
    return (f"value-{i}-".encode() * (size // 8 + 1))[:size]


def fill_open_segment(tier: HotTier, prefix: str) -> dict[bytes, bytes]:
    """Put values until one lands in a new segment (a committed PUT opens it)."""
    written: dict[bytes, bytes] = {}
    start = None
    for i in range(10_000):
        key, val = f"{prefix}{i}".encode(), value(i)
        put(tier, key, val)
        written[key] = val
        index = tier.arena.segment_of(record_offset(tier, key)).index
        if start is None:
            start = index
        elif index != start:
            return written
    raise AssertionError("no new segment was opened")


def record_offset(tier: HotTier, key: bytes) -> int:
    entry = tier.entry(key)
    assert entry is not None
    return entry.record


def test_an_uncommitted_write_opening_a_segment_hides_nothing(arena_name):
    tier = arena_name()
    tier.alloc(b"torn", 5000)                           # the first record of the first segment
    expected = {f"k{i}".encode(): value(i) for i in range(12)}
    for key, val in expected.items():
        put(tier, key, val)
    tier = restart(tier, arena_name)
    assert {key: read(tier, key) for key in expected} == expected
    assert read(tier, b"torn") is None
    assert tier.counters.recovered_objects == len(expected)


def test_a_tombstone_opening_a_segment_keeps_the_delete_and_what_follows(arena_name):
    tier = arena_name()
    put(tier, b"doomed", value(99))
    expected = fill_open_segment(tier, "a")
    pad = 0
    while tier.arena.fits_open(128) is not None:         # two 64-byte tombstones
        key = f"pad{pad}".encode()
        put(tier, key, b"p")
        expected[key] = b"p"
        pad += 1
    full = tier.arena.fits_open(0).index
    assert tier.delete(b"doomed")
    assert tier.arena.fits_open(0).index != full         # the tombstones opened a segment
    after = {f"b{i}".encode(): value(i) for i in range(5)}
    for key, val in after.items():
        put(tier, key, val)
    expected.update(after)
    tier = restart(tier, arena_name)
    assert read(tier, b"doomed") is None                 # the delete survived
    assert {key: read(tier, key) for key in expected} == expected


def test_a_second_chance_reappend_opening_a_segment_hides_nothing(arena_name):
    tier = arena_name()
    expected = fill_open_segment(tier, "c")
    tier.arena.seal_open()                               # the next allocation opens a segment
    first = next(iter(expected))
    assert read(tier, first) == expected[first]
    assert tier.reclaim.reappend(tier.entry(first))      # the first record of a new segment
    after = {f"d{i}".encode(): value(i) for i in range(5)}
    for key, val in after.items():
        put(tier, key, val)
    expected.update(after)
    tier = restart(tier, arena_name)
    assert {key: read(tier, key) for key in expected} == expected


def test_a_flipped_bit_in_a_key_is_a_miss_never_another_keys_value(arena_name):
    tier = arena_name()
    put(tier, b"key-C", b"the value of C" * 10)
    put(tier, b"key-A", b"the value of A" * 10)        # newer: it would win for its key
    offset = record_offset(tier, b"key-A") + RECORD.size + 4
    assert bytes(tier.arena.view[offset:offset + 1]) == b"A"
    tier.arena.view[offset] ^= 0x02                      # "key-A" reads "key-C" now
    tier = restart(tier, arena_name)
    assert read(tier, b"key-C") == b"the value of C" * 10
    assert read(tier, b"key-A") is None
    assert tier.counters.checksum_failures == 1


@pytest.mark.parametrize("field_offset", [6, 8, 16, 24, 32, 40])   # key_len .. header check
def test_a_flipped_byte_in_a_header_costs_one_value(arena_name, field_offset):
    tier = arena_name()
    expected = {f"h{i}".encode(): value(i, 1000 + 37 * i) for i in range(10)}
    for key, val in expected.items():
        put(tier, key, val)
    victim = b"h3"
    tier.arena.view[record_offset(tier, victim) + field_offset] ^= 0x10
    tier = restart(tier, arena_name)
    del expected[victim]
    assert {key: read(tier, key) for key in expected} == expected
    assert read(tier, victim) is None
    assert tier.counters.checksum_failures == 1


def test_one_flipped_byte_in_a_tombstone_does_not_undo_the_delete(arena_name):
    tier = arena_name()
    put(tier, b"gone", b"old value")
    assert tier.delete(b"gone")
    view = tier.arena.view
    start = SPAN_HEADER_BYTES
    tombstones = []
    pos = start
    while pos + RECORD.size <= tier.arena.segment_size:
        magic, state, *_ = RECORD.unpack_from(view, pos)
        if magic == RECORD_MAGIC and state == 3:
            tombstones.append(pos)
        pos += 64
    assert len(tombstones) == 2
    view[tombstones[0] + 4] ^= 0x01                      # TOMBSTONE -> another state
    tier = restart(tier, arena_name)
    assert read(tier, b"gone") is None


@pytest.mark.parametrize("byte", [0, 4, 8, 16, 24, 32])   # magic, span, claim, age, check, copy
def test_a_flipped_byte_in_a_segment_header_loses_nothing(arena_name, byte):
    tier = arena_name()
    expected = {f"s{i}".encode(): value(i) for i in range(12)}
    for key, val in expected.items():
        put(tier, key, val)
    head = tier.arena.segment_of(record_offset(tier, b"s0")).index
    tier.arena.view[head * SEG + byte] ^= 0x20
    tier = restart(tier, arena_name)
    assert {key: read(tier, key) for key in expected} == expected


def test_a_header_forged_inside_a_stored_value_never_becomes_a_record(arena_name):
    """Recovery resyncs past damage by scanning for headers, also among bytes that earlier
    values left behind. A client may store anything: a header it forges there, for another key
    and with a huge sequence number, must not verify (the check is keyed with the arena's
    secret, which clients never see)."""
    tier = arena_name()
    body = b"forged value for the victim"
    forged = bytearray(64 * 40)
    for slot in range(0, len(forged) - 128, 64):       # one at every alignment it could land on
        check = header_check(b"\0" * 32, STATE_COMMITTED, b"victim", len(body), checksum(body),
                             2**64 - 2, 0)
        RECORD.pack_into(forged, slot, RECORD_MAGIC, STATE_COMMITTED, 0, 6, len(body),
                         checksum(body), 2**64 - 2, 0, check)
        forged[slot + RECORD.size:slot + RECORD.size + 6] = b"victim"
    put(tier, b"carrier", bytes(forged))
    victim_offset = record_offset(tier, b"carrier")
    tier.arena.view[victim_offset + 8] ^= 0x01          # damage the carrier: recovery resyncs
    tier = restart(tier, arena_name)
    assert read(tier, b"victim") is None
    put(tier, b"after", b"writes still work")        # no sequence number near 2**64 was taken
    assert read(tier, b"after") == b"writes still work"


def test_values_of_a_batch_written_straight_as_committed_survive_a_restart(arena_name):
    tier = arena_name()
    put(tier, b"replaced", value(1))
    expected = {f"batch-{i}".encode(): value(i, 200) for i in range(40)}
    expected[b"replaced"] = value(2)
    items = [(key, memoryview(val), checksum(val)) for key, val in expected.items()]
    assert set(tier.put_many(items)) == {Stored.OK}
    assert tier.delete(b"batch-3")
    del expected[b"batch-3"]
    tier = restart(tier, arena_name)
    assert {key: read(tier, key) for key in expected} == expected
    assert read(tier, b"batch-3") is None
    assert tier.stats()["objects"] == len(expected)
    assert tier.stats()["bytes"] == sum(map(len, expected.values()))


def test_a_flipped_state_byte_never_revives_an_overwritten_value(arena_name):
    """An overwritten (SUPERSEDED) record's state is covered by its check. Here the old value
    shares a span with a pinned value, which keeps the span, while the new value's span is
    reclaimed by later writes: a flipped state byte made the old value current again after a
    restart (its check was the committed one); now the record fails its check."""
    tier = arena_name(pin_budget_bytes=2 * SEG)
    assert tier.put_many([(b"file/part", memoryview(b"p" * 1000), checksum(b"p" * 1000))],
                         pinned=True) == [Stored.OK]
    put(tier, b"k", b"old value")                        # beside the pinned part
    old = record_offset(tier, b"k")
    tier.arena.seal_open()
    put(tier, b"k", b"new value")                        # a span of its own
    for i in range(3 * SEGMENTS):                        # never read: reclaimed, oldest first
        put(tier, f"churn{i}".encode(), b"c" * (SEG // 2))
    assert read(tier, b"k") is None                      # the new value is gone, and rightly
    tier.arena.view[old + 4] = STATE_COMMITTED           # SUPERSEDED -> COMMITTED
    tier = restart(tier, lambda: arena_name(pin_budget_bytes=2 * SEG))
    assert read(tier, b"k") is None                      # never the old value
    assert read(tier, b"file/part") == b"p" * 1000
    assert tier.counters.checksum_failures == 1          # the record failed its check


def test_a_flipped_state_byte_of_a_replaced_value_keeps_the_newest(arena_name):
    tier = arena_name()
    put(tier, b"k", b"v1" * 100)
    first = record_offset(tier, b"k")
    put(tier, b"k", b"v2" * 100)
    tier.arena.view[first + 4] = STATE_COMMITTED
    tier = restart(tier, arena_name)
    assert read(tier, b"k") == b"v2" * 100

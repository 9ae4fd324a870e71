"""RecordTable against a dict, through growth, churn, colliding hashes and span removal."""

from __future__ import annotations

import random

from gcache.server.record_table import RecordTable


class Records:
    """Stands in for the arena: record offset -> key."""

    def __init__(self) -> None:
        self.keys: dict[int, bytes] = {}
        self.next = 64

    def new(self, key: bytes) -> int:
        record, self.next = self.next, self.next + 64
        self.keys[record] = key
        return record

    def matches(self, record: int, key: bytes) -> bool:
        return self.keys.get(record) == key


class Colliding(RecordTable):
    """Every key hashes into one of four values: long runs of equal hashes."""

    __slots__ = ()

    def hash(self, key: bytes | memoryview) -> int:
        return (1 + bytes(key)[-1] % 4) << 60


def check(table: RecordTable, oracle: dict[bytes, int], absent: list[bytes]) -> None:
    assert len(table) == len(oracle)
    for key, record in oracle.items():
        assert table.get(key) == record
    for key in absent:
        assert table.get(key) == -1
    assert sorted(table.records()) == sorted(oracle.values())


def churn(table: RecordTable, records: Records, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    oracle: dict[bytes, int] = {}
    universe = [f"key-{i}".encode() for i in range(steps // 3)]
    for step in range(steps):
        key = rng.choice(universe)
        if rng.random() < 0.65:
            record = records.new(key)
            assert table.put(key, record) == oracle.get(key, -1)
            oracle[key] = record
        else:
            assert table.remove(key) == oracle.pop(key, -1)
        if step % 997 == 0:
            check(table, oracle, [k for k in universe if k not in oracle][:50])
    check(table, oracle, [k for k in universe if k not in oracle])


def test_matches_a_dict_through_growth_and_churn():
    records = Records()
    table = RecordTable(records.matches, seed=7)
    churn(table, records, 30_000, seed=1)
    assert table.memory_bytes >= 16 * len(table)


def test_keys_with_the_same_hash_are_told_apart_by_their_records():
    records = Records()
    churn(Colliding(records.matches, seed=0), records, 3_000, seed=2)


def test_remove_in_drops_exactly_the_span_and_keeps_the_rest_reachable():
    records = Records()
    table = Colliding(records.matches, seed=0)
    keys = [f"k{i}".encode() for i in range(400)]
    placed = {key: table.put(key, records.new(key)) for key in keys}
    assert set(placed.values()) == {-1}
    spans = {key: table.get(key) for key in keys}
    start, end = sorted(spans.values())[100], sorted(spans.values())[300]
    hashes = {table.hash(key) for key in keys}
    removed = [r for h in hashes for r in table.remove_in([h], start, end)]
    assert sorted(removed) == sorted(r for r in spans.values() if start <= r < end)
    for key, record in spans.items():
        assert table.get(key) == (-1 if start <= record < end else record)
    assert all(table.find_in([h], start, end) == [] for h in hashes)
    kept = sorted(r for h in hashes for r in table.find_in([h], 0, 1 << 62))
    assert kept == sorted(r for r in spans.values() if not start <= r < end)


def test_the_hash_is_seeded_per_table_and_never_empty():
    records = Records()
    one, two = RecordTable(records.matches), RecordTable(records.matches)
    assert one.hash(b"key") != two.hash(b"key")
    assert all(one.hash(bytes([i])) != 0 for i in range(256))

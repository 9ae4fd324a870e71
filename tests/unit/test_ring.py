import random
from collections import Counter

import pytest

from gcache.placement import Ring

SERVERS = [f"10.0.0.{i}:7700" for i in range(8)]
KEYS = [f"key-{i}".encode() for i in range(20000)]


def test_owner_is_deterministic_and_on_the_ring():
    ring, reordered = Ring.uniform(SERVERS), Ring.uniform(list(reversed(SERVERS)))
    assert all(ring.owner(k) == reordered.owner(k) for k in KEYS[:500])
    assert {ring.owner(k) for k in KEYS} == set(SERVERS)


def test_uniform_ring_spreads_keys_within_a_third_of_the_mean():
    ring = Ring.uniform(SERVERS, vnodes=128)
    counts = Counter(ring.owner(k) for k in KEYS)
    mean = len(KEYS) / len(SERVERS)
    assert all(abs(c - mean) < mean / 3 for c in counts.values()), counts


def test_capacity_weights_pull_keys_in_proportion():
    weights = {SERVERS[0]: 3.0, SERVERS[1]: 1.0}
    ring = Ring(weights, vnodes=128)
    counts = Counter(ring.owner(k) for k in KEYS)
    assert 2.0 < counts[SERVERS[0]] / counts[SERVERS[1]] < 4.5


def test_removing_a_server_moves_only_its_keys():
    before = Ring.uniform(SERVERS)
    after = Ring.uniform(SERVERS[1:])
    moved = [k for k in KEYS if before.owner(k) != after.owner(k)]
    assert moved and all(before.owner(k) == SERVERS[0] for k in moved)


@pytest.mark.parametrize("width", [1, 2, 3])
def test_a_group_lives_on_width_distinct_servers(width):
    ring = Ring.uniform(SERVERS)
    owners = {ring.owner(k, group=b"prefix-root", group_width=width) for k in KEYS[:2000]}
    assert len(owners) == width


def test_a_dead_server_moves_only_the_grouped_keys_it_held():
    everyone = Ring.uniform(SERVERS)
    without = Ring(dict.fromkeys(SERVERS, 1.0), live=SERVERS[1:])
    moved = 0
    for g in range(60):
        group = f"g{g}".encode()
        for k in KEYS[:100]:
            was = everyone.owner(k, group=group)
            now = without.owner(k, group=group)
            assert now != SERVERS[0]
            if was != SERVERS[0]:
                assert now == was
            else:
                moved += 1
    assert moved > 0


def test_a_dead_server_moves_only_its_own_plain_keys():
    everyone = Ring.uniform(SERVERS)
    without = Ring(dict.fromkeys(SERVERS, 1.0), live=SERVERS[1:])
    assert all(without.owner(k) == everyone.owner(k) for k in KEYS if
               everyone.owner(k) != SERVERS[0])


def test_group_width_larger_than_cluster_uses_every_server():
    ring = Ring.uniform(SERVERS[:2])
    assert {ring.owner(k, group=b"g", group_width=5) for k in KEYS[:500]} == set(SERVERS[:2])


def test_empty_ring_owns_nothing_and_bad_weights_are_refused():
    assert Ring.uniform([]).owner(b"k") is None
    with pytest.raises(ValueError, match="positive"):
        Ring({"a:1": 0.0})


def test_a_keys_owner_is_the_first_live_server_clockwise_with_any_servers_dead():
    rng = random.Random(5)
    servers = [f"10.0.0.{i}:7700" for i in range(7)]
    for dead in ([], servers[:1], servers[2:6], servers[:6], servers):
        ring = Ring(dict.fromkeys(servers, 1.0), vnodes=16,
                    live=[s for s in servers if s not in dead])
        for _ in range(2000):
            point = rng.getrandbits(64)
            walked = next((s for s in ring._clockwise(point) if s in ring.live), None)
            assert ring._first_live(point) == walked

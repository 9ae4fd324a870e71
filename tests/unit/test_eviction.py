"""The eviction rule (``gcache.eviction``) by tables whose rows are the cases it was built for,
and the server's hot tier and the replay model picking the same victims on one recorded
sequence of operations (both call that one rule)."""

from __future__ import annotations

import random
import uuid

import pytest

from gcache.eviction import (
    FREE,
    NEVER_WRITTEN,
    Candidate,
    choose_victim,
    earns_second_chance,
    is_young,
    rescue_bound,
)
from gcache.kv.replay_model import SecondChanceBudget
from gcache.server.tier import HotTier
from tests.unit.tier_ops import put, read

SEG = 64 * 1024


def span(start: int, age: int, *, last_write: int = NEVER_WRITTEN, young: bool = False,
         unreachable: int = 0, size: int = SEG) -> Candidate:
    return Candidate(start, age, last_write, young, unreachable, size)


VICTIMS = {
    "a_free_window_goes_before_anything": (
        [span(0, 5), span(1, 0, unreachable=SEG), span(2, FREE)], True, 2),
    "a_span_mostly_made_of_values_that_cannot_hit_goes_before_older_ones": (
        [span(0, 1), span(1, 9, unreachable=SEG // 2)], True, 1),
    "less_than_half_unreachable_waits_its_turn_by_age": (
        [span(0, 1), span(1, 9, unreachable=SEG // 2 - 1)], True, 0),
    "among_spans_mostly_unreachable_the_largest_share_goes": (
        [span(0, 3, unreachable=SEG // 2), span(1, 9, unreachable=SEG - 64)], True, 1),
    "a_young_span_is_never_taken_for_its_unreachable_bytes": (
        [span(0, 1), span(1, 9, young=True, unreachable=SEG, last_write=5)], True, 0),
    "the_oldest_span_goes_when_nothing_is_free_or_unreachable": (
        [span(0, 7), span(1, 3), span(2, 5)], True, 1),
    "a_value_just_acknowledged_outlives_a_claim_while_an_older_span_is_left": (
        [span(0, 1, young=True, last_write=90), span(1, 6)], True, 1),
    "a_copy_never_takes_a_young_span": (
        [span(0, 1, young=True, last_write=90), span(1, 2, young=True, last_write=95)],
        False, None),
    "among_young_spans_the_one_written_least_recently_goes_not_the_one_claimed_first": (
        [span(0, 1, young=True, last_write=95), span(1, 2, young=True, last_write=90)],
        True, 1),
    "of_equals_the_earliest_goes": ([span(0, 4), span(1, 4)], True, 0),
    "nothing_to_take_is_none": ([], True, None),
}


@pytest.mark.parametrize("case", sorted(VICTIMS))
def test_the_victim(case):
    candidates, young_ok, expected = VICTIMS[case]
    chosen = choose_victim(candidates, young_ok=young_ok)
    assert (None if chosen is None else chosen.start) == expected


def owned(start: int, age: int, *, own: bool = True, protected: bool = False,
          young: bool = False, last_write: int = NEVER_WRITTEN) -> Candidate:
    return Candidate(start, age, last_write, young, 0, SEG, protected, own)


QUOTA_VICTIMS = {   # (candidates, young_ok, the claimant is at or over its quota) -> victim
    "a_tenant_at_its_quota_takes_its_own_oldest_before_an_older_span_over_quota": (
        [owned(0, 1, own=False), owned(1, 5), owned(2, 3)], True, True, 2),
    "a_tenant_within_its_quota_takes_the_surplus_of_one_over_quota_first": (
        [owned(0, 5, own=False), owned(1, 1)], True, False, 0),
    "a_tenant_within_its_quota_takes_its_own_when_no_surplus_is_left": (
        [owned(0, 1, own=False, protected=True), owned(1, 5)], True, False, 1),
    "another_tenants_values_within_its_quota_are_never_taken": (
        [owned(0, 1, own=False, protected=True)], True, True, None),
    "a_free_window_still_goes_first": (
        [owned(0, 1), owned(1, FREE, own=False)], True, True, 1),
    "a_tenant_over_its_quota_spares_its_young_values_for_older_surplus": (
        [owned(0, 9, young=True, last_write=90), owned(1, 2, own=False)], False, True, 1),
    "among_spans_over_quota_the_oldest_goes": (
        [owned(0, 7, own=False), owned(1, 3, own=False)], True, False, 1),
    "without_quotas_every_span_is_the_claimants_and_age_decides": (
        [owned(0, 7), owned(1, 3), owned(2, 5)], True, None, 1),
    "a_tenant_without_a_quota_shares_by_age_with_others_surplus": (
        [owned(0, 7), owned(1, 3, own=False), owned(2, 5)], True, None, 1),
    "a_tenant_with_a_quota_spares_another_with_one_but_not_a_sharer_without": (
        [owned(0, 2, own=False, protected=True), owned(1, 4, own=False), owned(2, 9)],
        True, False, 1),
}


@pytest.mark.parametrize("case", sorted(QUOTA_VICTIMS))
def test_the_victim_under_quotas(case):
    candidates, young_ok, over_quota, expected = QUOTA_VICTIMS[case]
    chosen = choose_victim(candidates, young_ok=young_ok, claimant_over_quota=over_quota)
    assert (None if chosen is None else chosen.start) == expected


YOUNG = {   # (last write mark, bytes committed since the start, arena bytes) -> young
    "a_span_a_client_just_committed_into_is_young": (1000, 1000, 8000, True),
    "a_quarter_arena_of_commits_later_it_is_old": (1000, 3000, 8000, False),
    "just_under_a_quarter_arena_later_it_is_still_young": (1000, 2999, 8000, True),
    "a_span_no_client_committed_into_is_never_young": (NEVER_WRITTEN, 0, 8000, False),
}


@pytest.mark.parametrize("case", sorted(YOUNG))
def test_youth(case):
    last_write, written, arena, expected = YOUNG[case]
    assert is_young(last_write, written, arena) is expected


SECOND_CHANCES = {
    "a_value_read_since_it_was_written_is_kept": (True, True, True),
    "a_read_value_below_a_missing_page_of_its_prefix_is_let_go": (True, False, False),
    "a_value_nobody_came_back_for_goes": (False, True, False),
}


@pytest.mark.parametrize("case", sorted(SECOND_CHANCES))
def test_second_chances(case):
    read_, reachable, expected = SECOND_CHANCES[case]
    assert earns_second_chance(read=read_, reachable=reachable) is expected


SWEEPS = {   # segments in the arena -> extra segments one claim may reclaim for copies
    "a_sweep_in_a_small_arena_never_wraps_round_to_a_value_just_written": (8, 1),
    "a_sweep_takes_at_most_a_sixteenth_of_the_arena": (64, 4),
    "one_claims_stall_is_capped_in_a_large_arena": (4096, 16),
}


@pytest.mark.parametrize("case", sorted(SWEEPS))
def test_the_reach_of_a_sweep_of_second_chances(case):
    segments, expected = SWEEPS[case]
    assert rescue_bound(segments) == expected


def test_the_server_and_the_replay_model_pick_the_same_victims():
    """One recorded sequence of puts and reads, each value filling one segment of a real hot
    tier and one unit of the model: after every step both hold exactly the same keys."""
    rng = random.Random(20261207)
    steps: list[tuple[str, int]] = []
    stored = 0
    for _ in range(600):
        if stored and rng.random() < 0.3:
            steps.append(("read", rng.randrange(max(0, stored - 80), stored)))
        else:
            steps.append(("put", stored))
            stored += 1
    segments = 64
    tier = HotTier(name=f"gcache-unit-{uuid.uuid4().hex[:8]}", size_bytes=segments * SEG,
                   segment_size=SEG, prefault=False, lease_ttl_s=60.0)
    model = SecondChanceBudget(segments)
    value = b"v" * (SEG - 512)                     # one record fills a segment
    try:
        for n, (op, i) in enumerate(steps):
            key = f"k{i}".encode()
            if op == "put":
                put(tier, key, value)
                model.add(key, 1)
            elif key in model:
                assert read(tier, key) == value, (n, key)
                model.read(key)
            held = {f"k{j}".encode() for j in range(stored) if tier.exists(f"k{j}".encode())}
            assert held == {f"k{j}".encode() for j in range(stored)
                            if f"k{j}".encode() in model}, n
        assert tier.stats()["second_chances"] > 0 and model.evicted > 0
    finally:
        tier.close(unlink=True)

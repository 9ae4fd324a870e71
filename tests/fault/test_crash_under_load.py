"""Servers killed and restarted under load, and the Raft leader killed twice: every value read
is intact and legal, and no acknowledged value is lost (the rounds evict nothing). The same
scenarios run for as long as one likes under ``make soak``."""

from __future__ import annotations

from tests.fault.scenarios import corruption, crash_under_load, exhaustion, leader_failover


def assert_clean(tally, *, min_faults: int) -> None:
    print(tally)
    assert tally.faults >= min_faults, tally
    assert tally.puts_acked > 50 and tally.hits > 20, tally
    assert tally.wrong_values == 0, tally.notes[:10]
    assert tally.evicted == 0, tally
    assert tally.lost_acked == 0, tally.notes[:10]


def test_hot_tier_servers_killed_under_load_lose_nothing_acknowledged(tmp_path):
    assert_clean(crash_under_load(12.0, cold=False, log_dir=str(tmp_path), seed=1), min_faults=3)


def test_with_a_cold_tier_kills_during_demotion_lose_nothing_acknowledged(tmp_path):
    tally = crash_under_load(14.0, cold=True, log_dir=str(tmp_path), seed=2)
    assert_clean(tally, min_faults=3)


def test_two_leader_kills_under_io_fail_no_operation(tmp_path):
    tally = leader_failover(10.0, log_dir=str(tmp_path), seed=3,
                            token="soak-and-fault-cluster-token-01")
    assert tally.faults == 2, tally.notes
    failed = {reason: n for reason, n in tally.misses.items() if reason != "absent"}
    assert tally.puts_failed == 0 and not failed, tally
    assert tally.wrong_values == 0 and tally.lost_acked == 0, tally.notes[:10]


def test_flipped_bytes_in_every_part_cost_at_most_the_record_they_hit(tmp_path):
    tally = corruption(14, log_dir=str(tmp_path), seed=4)
    print(tally)
    assert tally.faults >= 12, tally
    assert tally.wrong_values == 0, tally.notes[:10]
    assert tally.lost_acked <= tally.faults, tally.notes[:10]


def test_a_well_behaved_client_is_served_among_hostile_and_dying_peers(tmp_path):
    tally = exhaustion(10.0, log_dir=str(tmp_path), seed=5)
    print(tally)
    assert tally.ops > 50 and tally.faults > 20, tally
    assert tally.puts_failed == 0 and tally.lost_acked == 0, tally
    assert tally.wrong_values == 0, tally

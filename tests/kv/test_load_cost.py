"""``LoadCost``: a hit is skipped only when its measured load is slower than recomputing it."""

import pytest

from gcache.errors import ConfigError
from gcache.kv.load_cost import MIN_LOAD_TOKENS, LoadCost


def test_unknown_either_way_means_load():
    assert LoadCost().decide(4096).load                    # nothing known
    measured = LoadCost()
    measured.observe(1024, 1.0)
    decision = measured.decide(4096)
    assert decision.load and decision.recompute_s is None and decision.load_s == pytest.approx(4)
    rate_only = LoadCost(recompute_tokens_per_s=1000).decide(4096)
    assert rate_only.load and rate_only.load_s is None and rate_only.recompute_s == 4.096


def test_a_load_slower_than_the_prefill_is_skipped_and_a_faster_one_is_not():
    cost = LoadCost(recompute_tokens_per_s=10_000)         # 0.1 ms per token to recompute
    cost.observe(2048, 2048 * 0.5e-3)                      # loads at 0.5 ms per token
    slow = cost.decide(8192)
    assert not slow.load and slow.load_s > slow.recompute_s
    for _ in range(30):                                    # the link got faster
        cost.observe(2048, 2048 * 0.01e-3)
    assert cost.decide(8192).load


def test_the_mean_follows_recent_loads_and_ignores_tiny_ones():
    cost = LoadCost()
    cost.observe(1000, 1.0)
    cost.observe(MIN_LOAD_TOKENS - 1, 100.0)               # mostly round trips: ignored
    assert cost.load_s_per_token == pytest.approx(1e-3)
    cost.observe(1000, 2.0)
    assert 1e-3 < cost.load_s_per_token < 2e-3


def test_a_negative_rate_is_a_config_error():
    with pytest.raises(ConfigError, match="gcache_recompute_tokens_per_s"):
        LoadCost(recompute_tokens_per_s=-1)

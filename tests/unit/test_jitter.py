"""Periodic calls to the masters are spread out, and never later than their period (the
masters count a server's missed heartbeats by it)."""

from gcache.master_client import jittered


def test_periods_are_spread_and_never_longer():
    waits = [jittered(1.0) for _ in range(2000)]
    assert all(0.8 <= w <= 1.0 for w in waits)
    assert max(waits) - min(waits) > 0.1                  # not in lock-step
    assert all(0.5 <= jittered(1.0, spread=0.5) <= 1.0 for _ in range(200))

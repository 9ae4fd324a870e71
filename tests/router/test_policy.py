"""The routing policy as tables: spread, buckets, the override, window-safe credit, health, ties."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gcache.errors import ConfigError, InvalidRequest, NoInstance
from gcache.kv import safe_boundary
from gcache.router import Buckets, InstanceState, PolicyConfig, route

K = 1024
# Credits that are exact in binary, so that a row can sit on a rule's boundary to the token.
EXACT = PolicyConfig(host_credit=0.75, gcache_credit=0.5)
T, F = True, False


def inst(name, bucket=0, *, gpu=0, host=None, queued=0, decodes=0, healthy=True):
    return InstanceState(name, bucket, gpu, gpu if host is None else host, queued, decodes,
                         healthy)


@pytest.mark.parametrize("prompt, gcache, instances, expected, reason", [
    pytest.param(120 * K, 0, [inst("a", gpu=100 * K, queued=10 * K), inst("b")],
                 "a", "affinity", id="holder-within-spread-keeps-affinity"),
    pytest.param(120 * K, 0, [inst("a", gpu=100 * K, queued=16 * K), inst("b")],
                 "a", "affinity", id="lead-of-exactly-spread-tokens-still-keeps-it"),
    pytest.param(120 * K, 0, [inst("a", gpu=100 * K, queued=16 * K + 1), inst("b")],
                 "b", "spread", id="lead-past-spread-tokens-spreads"),
    pytest.param(120 * K, 0, [inst("a", gpu=100 * K, decodes=33), inst("b")],
                 "b", "spread", id="running-decodes-count-as-load"),
    pytest.param(120 * K, 0, [inst("a", gpu=100 * K, queued=40 * K),
                              inst("b", gpu=50 * K, queued=10 * K), inst("c")],
                 "b", "spread", id="spread-keeps-affinity-among-the-eligible"),
    pytest.param(120 * K, 0, [inst("a", gpu=10 * K, queued=12 * K), inst("b")],
                 "b", "least_loaded", id="cost-alone-spreads-once-load-exceeds-the-saving"),
])
def test_a_hot_prefix_does_not_collapse_onto_its_holder(prompt, gcache, instances, expected,
                                                         reason):
    chosen = route(prompt, gcache, instances)
    assert (chosen.instance, chosen.reason) == (expected, reason)


@pytest.mark.parametrize("n_instances", [2, 4, 8])
def test_a_burst_on_one_hot_prefix_spreads_over_the_pool(n_instances):
    """Every request shares a 100K prefix that i0 holds at the start; whoever gets a request
    holds the prefix from then on (the routing history) and queues its uncached prefill.
    Nothing drains: the worst case for a holder that keeps winning on cost."""
    config = PolicyConfig()
    prompt, prefix = 110 * K, 100 * K
    held = {f"i{n}": prefix if n == 0 else 0 for n in range(n_instances)}
    queued = dict.fromkeys(held, 0)
    reasons = set()
    for _ in range(20 * n_instances):
        states = [inst(name, gpu=held[name], queued=queued[name]) for name in held]
        chosen = route(prompt, 0, states, config)
        assert queued[chosen.instance] - min(queued.values()) <= config.spread_tokens
        reasons.add(chosen.reason)
        queued[chosen.instance] += prompt - held[chosen.instance]
        held[chosen.instance] = prefix
    assert "spread" in reasons
    assert all(held.values())                      # the hot prefix is on every instance now


@pytest.mark.parametrize("prompt, gcache, instances, expected, bucket, reason", [
    pytest.param(10 * K, 0, None, "p0", 0, "least_loaded", id="short-prompt-short-pool"),
    pytest.param(64 * K - 1, 0, None, "p0", 0, "least_loaded", id="just-under-64K"),
    pytest.param(64 * K, 0, None, "p1", 1, "least_loaded", id="64K-exactly-is-the-next-bucket"),
    pytest.param(500 * K, 0, None, "p2", 2, "least_loaded", id="long-uncached-long-pool"),
    pytest.param(300 * K, 280 * K, None, "p0", 0, "gcache",
                 id="long-prompt-mostly-in-gcache-is-short"),
    pytest.param(100 * K, 0, [inst("p0"), inst("p1", 1, host=90 * K), inst("p2", 2)],
                 "p1", 0, "affinity", id="only-its-holder-fits-so-it-goes-there"),
    pytest.param(100 * K, 0, [inst("p0"), inst("p2", 2)], "p2", 1, "least_loaded",
                 id="empty-pool-goes-to-the-nearest-the-larger-on-a-tie"),
    pytest.param(10 * K, 0, [inst("p1", 1), inst("p2", 2)], "p1", 0, "least_loaded",
                 id="empty-short-pool-goes-to-the-nearest"),
    pytest.param(300 * K, 0, [inst("p0"), inst("p1", 1)], "p1", 2, "least_loaded",
                 id="no-pool-long-enough-takes-the-nearest"),
])
def test_the_bucket_is_chosen_by_uncached_length(prompt, gcache, instances, expected, bucket,
                                                 reason):
    instances = instances or [inst("p0"), inst("p1", 1), inst("p2", 2)]
    chosen = route(prompt, gcache, instances)
    assert (chosen.instance, chosen.bucket, chosen.reason) == (expected, bucket, reason)


# The request: 100K tokens, 60K of them in GCache, so 40K uncached in pool 0 (bucket 0). Pool 0
# offers a saving of 30K (GCache at 0.5); L, in pool 1, saves 30K + g/2 with a GPU hit of g < 60K.
@pytest.mark.parametrize("long_pool, expected, reason", [
    pytest.param([inst("L", 1, gpu=33 * K)], "L", "override",
                 id="saves-more-than-override-tokens-overrides"),
    pytest.param([inst("L", 1, gpu=32 * K)], "s0", "gcache",
                 id="saves-exactly-override-tokens-stays"),
    pytest.param([inst("L", 1, gpu=90 * K, queued=17 * K), inst("L2", 1)], "s0", "gcache",
                 id="holder-hot-in-its-own-pool-stays"),
    pytest.param([inst("L", 1, gpu=90 * K, queued=17 * K)], "L", "override",
                 id="alone-in-its-pool-it-is-its-least-loaded"),
    pytest.param([inst("L", 1, gpu=90 * K, queued=80 * K)], "s0", "gcache",
                 id="waits-longer-than-it-saves-stays"),
    pytest.param([inst("L", 1, gpu=90 * K, healthy=False)], "s0", "gcache",
                 id="unhealthy-holder-never-overrides"),
])
def test_the_bucket_override_rule(long_pool, expected, reason):
    instances = [inst("s0"), inst("s1"), *long_pool]
    chosen = route(100 * K, 60 * K, instances, EXACT)
    assert (chosen.instance, chosen.bucket, chosen.reason) == (expected, 0, reason)


def test_no_override_carries_a_long_prefill_into_a_short_pool():
    # 200K with 50K on a pool-0 instance: 150K left, bucket 1; there it would be a 150K prefill
    instances = [inst("short", 0, gpu=50 * K), inst("mid", 1)]
    chosen = route(200 * K, 0, instances, EXACT)
    assert (chosen.instance, chosen.bucket, chosen.reason) == ("mid", 1, "least_loaded")


PAGE = 8 * K


@pytest.mark.parametrize("pages, tails, boundary, bucket", [
    pytest.param([T] * 8, {8}, 8, 0, id="tail-at-the-end-credits-all-8-pages"),
    pytest.param([T] * 8, {3}, 3, 0, id="tail-only-at-page-3-credits-3"),
    pytest.param([T] * 8, {1}, 1, 1, id="tail-at-page-1-leaves-a-64K-plus-prefill"),
    pytest.param([T] * 8, set(), 0, 1, id="no-tail-credits-nothing"),
    pytest.param([T, T, F, T, T, T, T, T], {8}, 0, 1, id="tail-past-a-missing-page-is-void"),
])
def test_a_hybrid_prefix_is_credited_only_up_to_its_window_safe_boundary(pages, tails,
                                                                          boundary, bucket):
    """A 10-page prompt whose first 8 pages are all stored in GCache: what is credited is the
    window-safe boundary ``KVStore.match`` reports, never the raw run of pages."""
    prompt = 10 * PAGE
    hit = safe_boundary(len(pages), pages, lambda b: b in tails) * PAGE
    assert hit == boundary * PAGE
    chosen = route(prompt, hit, [inst("a"), inst("b", 1)], EXACT)
    assert chosen.cost == prompt - 0.5 * hit
    assert chosen.bucket == bucket


@pytest.mark.parametrize("prompt, gcache, host, too_long", [
    pytest.param(1024 * K - 1, 0, 0, False, id="just-under-1M-fits"),
    pytest.param(1024 * K, 0, 0, True, id="1M-uncached-is-too-long"),
    pytest.param(2048 * K, 1536 * K, 0, False, id="2M-with-1.5M-in-gcache-fits"),
    pytest.param(2048 * K, 0, 1536 * K, False, id="2M-with-1.5M-on-an-instance-fits"),
    pytest.param(2048 * K, 0, 512 * K, True, id="2M-with-0.5M-cached-is-too-long"),
])
def test_a_prompt_longer_than_every_bucket_is_refused(prompt, gcache, host, too_long):
    instances = [inst("a", 2, host=host), inst("b", 2)]
    if too_long:
        with pytest.raises(InvalidRequest, match=r"uncached; the longest bucket takes fewer"):
            route(prompt, gcache, instances)
    else:
        assert route(prompt, gcache, instances).instance == "a"


@pytest.mark.parametrize("instances, expected", [
    pytest.param([inst("a", gpu=30 * K, healthy=False), inst("b", queued=50 * K)], "b",
                 id="a-holder-that-is-down-is-passed-over"),
    pytest.param([inst("a", healthy=False), inst("b", 2, queued=900 * K)], "b",
                 id="another-pool-rather-than-a-dead-instance"),
    pytest.param([inst("a", healthy=False), inst("b", healthy=False)], None,
                 id="none-healthy-is-unavailable"),
    pytest.param([], None, id="no-instances-is-unavailable"),
])
def test_unhealthy_instances_are_never_chosen(instances, expected):
    if expected is None:
        with pytest.raises(NoInstance, match="no healthy instance"):
            route(40 * K, 0, instances)
    else:
        assert route(40 * K, 0, instances).instance == expected


def test_a_prompt_longer_than_every_bucket_is_refused_even_with_no_instance_up():
    with pytest.raises(InvalidRequest, match="longest bucket"):
        route(2000 * K, 0, [inst("a", healthy=False)])


@pytest.mark.parametrize("instances, expected", [
    pytest.param([inst("b"), inst("a"), inst("c")], "a", id="equal-costs-go-to-the-smaller-name"),
    pytest.param([inst("b", gpu=8 * K, queued=8 * K), inst("a"), inst("c", queued=K)], "a",
                 id="a-cost-tie-between-hit-and-load"),
    pytest.param([inst("b", gpu=8 * K, queued=20 * K), inst("a", gpu=8 * K, queued=20 * K),
                  inst("c")], "c", id="spread-ties-too"),
])
def test_ties_are_broken_by_name_whatever_the_order(instances, expected):
    for order in itertools.permutations(instances):
        assert route(20 * K, 0, list(order)).instance == expected


@pytest.mark.parametrize("make, error", [
    pytest.param(lambda: PolicyConfig(host_credit=1.5), ConfigError, id="credit-above-1"),
    pytest.param(lambda: PolicyConfig(spread_tokens=-1), ConfigError, id="negative-spread"),
    pytest.param(lambda: Buckets(()), ConfigError, id="no-buckets"),
    pytest.param(lambda: Buckets((10, 10)), ConfigError, id="bounds-not-increasing"),
    pytest.param(lambda: inst("a", gpu=10, host=5), InvalidRequest, id="host-hit-below-gpu"),
    pytest.param(lambda: inst("a", queued=-1), InvalidRequest, id="negative-queue"),
    pytest.param(lambda: route(10, 0, [inst("a", 3)]), ConfigError, id="bucket-without-bound"),
    pytest.param(lambda: route(10, 0, [inst("a"), inst("a")]), InvalidRequest,
                 id="duplicate-names"),
    pytest.param(lambda: route(-1, 0, [inst("a")]), InvalidRequest, id="negative-prompt"),
])
def test_bad_config_and_input_are_refused_with_the_rule(make, error):
    with pytest.raises(error):
        make()


states = st.builds(
    lambda bucket, gpu, extra, queued, decodes, healthy: (bucket, gpu, gpu + extra, queued,
                                                          decodes, healthy),
    st.integers(0, 2), st.integers(0, 600 * K), st.integers(0, 600 * K),
    st.integers(0, 400 * K), st.integers(0, 64), st.booleans())


@settings(max_examples=300, deadline=None)
@given(prompt=st.integers(0, 1200 * K), gcache=st.integers(0, 1200 * K),
       rows=st.lists(states, max_size=8))
def test_route_always_returns_a_healthy_instance_of_some_pool(prompt, gcache, rows):
    instances = [InstanceState(f"i{n}", *row) for n, row in enumerate(rows)]
    healthy = {s.name for s in instances if s.healthy}
    best = max([min(gcache, prompt)] + [min(s.host_hit_tokens, prompt)
                                        for s in instances if s.healthy])
    try:
        chosen = route(prompt, gcache, instances)
    except NoInstance:
        assert not healthy and prompt - best < Buckets().bounds[-1]
        return
    except InvalidRequest:       # the request's own fault comes first, healthy or not
        assert prompt - best >= Buckets().bounds[-1]
        return
    assert chosen.instance in healthy
    assert chosen.bucket == Buckets().of(prompt - best)
    assert route(prompt, gcache, instances[::-1]) == chosen      # order does not matter


# The request: 10K tokens, nothing cached, bucket 0. The short pool's least loaded carries
# ``short`` tokens; the long pool's instance ``long``.
@pytest.mark.parametrize("short, long, expected, reason", [
    pytest.param(20 * K, 0, "L", "spill", id="busy-short-pool-borrows-an-idle-long-instance"),
    pytest.param(21 * K, 4 * K, "L", "spill", id="a-quarter-spread-of-load-is-still-idle"),
    pytest.param(40 * K, 4 * K + 1, "s", "least_loaded", id="any-more-is-not-idle"),
    pytest.param(16 * K, 0, "s", "least_loaded", id="a-lead-of-spread-tokens-stays-home"),
    pytest.param(0, 0, "s", "least_loaded", id="an-idle-short-pool-stays-home"),
])
def test_the_spill_rule(short, long, expected, reason):
    chosen = route(10 * K, 0, [inst("s", 0, queued=short), inst("L", 1, queued=long)], EXACT)
    assert (chosen.instance, chosen.bucket, chosen.reason) == (expected, 0, reason)


def test_a_spill_never_gives_up_a_cheaper_holder():
    # the short instance's GPU hit saves more than its load costs: it stays the cheapest
    instances = [inst("s", 0, gpu=30 * K, queued=20 * K), inst("L", 1)]
    chosen = route(40 * K, 0, instances, EXACT)
    assert (chosen.instance, chosen.reason) == ("s", "affinity")

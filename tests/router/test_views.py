"""Per-instance prefix views as tables: chain hits, tiers, staleness, restarts, bounds."""

import pytest

from gcache.errors import ConfigError, InvalidRequest
from gcache.router import InstanceState, PrefixView, route

A, B, C, D, E = b"a", b"b", b"c", b"d", b"e"
PAGE = 4096


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def view(capacity_pages=100, stale_after_s=10.0):
    clock = Clock()
    return PrefixView(capacity_pages, stale_after_s=stale_after_s, clock=clock), clock


@pytest.mark.parametrize("query, expected", [
    pytest.param([A, B, C], 3, id="whole-prefix"),
    pytest.param([A, B, C, D], 3, id="longer-prompt-counts-the-held-run"),
    pytest.param([A, D, C], 1, id="a-missing-page-ends-the-run"),
    pytest.param([D, A, B], 0, id="a-missing-first-page-is-no-hit"),
    pytest.param([], 0, id="no-pages"),
])
def test_hits_count_the_leading_run_of_held_pages(query, expected):
    v, _ = view()
    v.stored([A, B, C])
    assert v.hit_pages(query) == expected


@pytest.mark.parametrize("gpu, host, query, expected_gpu, expected_host", [
    pytest.param([A, B], [A, B, C, D], [A, B, C, D], 2, 4, id="offloaded-beyond-the-gpu"),
    pytest.param([A, B], [C], [A, B, C], 2, 3, id="host-answers-count-gpu-pages"),
    pytest.param([], [A, B], [A, B], 0, 2, id="host-only"),
    pytest.param([B], [A], [A, B], 0, 2, id="gpu-run-needs-its-head-on-the-gpu"),
])
def test_tiers(gpu, host, query, expected_gpu, expected_host):
    v, _ = view()
    v.stored(gpu, tier="gpu")
    v.stored(host, tier="host")
    assert (v.hit_pages(query, tier="gpu"), v.hit_pages(query, tier="host")) == (
        expected_gpu, expected_host)


@pytest.mark.parametrize("events, expected", [
    pytest.param([(0.0, "gpu", [A, B, C])], 3, id="fresh"),
    pytest.param([(-10.0, "gpu", [A, B, C])], 3, id="exactly-stale-after-s-old-still-counts"),
    pytest.param([(-10.5, "gpu", [A, B, C])], 0, id="older-expires"),
    pytest.param([(-30.0, "gpu", [A, B, C]), (-2.0, "gpu", [A])], 1,
                 id="a-restore-refreshes-only-its-pages"),
    pytest.param([(-30.0, "host", [A, B, C]), (-2.0, "gpu", [A, B])], 2,
                 id="stale-on-host-fresh-on-gpu"),
])
def test_stale_views_expire(events, expected):
    v, clock = view(stale_after_s=10.0)
    for at_s, tier, pages in events:
        clock.now_s = 100.0 + at_s
        v.stored(pages, tier=tier)
    clock.now_s = 100.0
    assert v.hit_pages([A, B, C], tier="host") == expected


def test_pages_stale_on_every_tier_are_dropped():
    v, clock = view(stale_after_s=10.0)
    v.stored([A, B])
    clock.now_s = 8.0
    v.stored([C])
    clock.now_s = 15.0
    assert len(v) == 1                              # a and b went; c is 7 s old
    assert repr(v) == "PrefixView(pages=1, capacity_pages=100, stale_after_s=10.0)"


@pytest.mark.parametrize("event", ["cleared", "restart-then-new-pages"])
def test_an_engine_restart_clears_its_view(event):
    v, _ = view()
    v.stored([A, B, C], tier="gpu")
    v.stored([A, B, C, D], tier="host")
    v.cleared()
    assert (v.hit_pages([A, B, C, D], tier="gpu"), v.hit_pages([A, B, C, D], tier="host")) == (0, 0)
    assert len(v) == 0
    if event == "restart-then-new-pages":          # the restarted engine's own events feed it
        v.stored([A])
        assert v.hit_pages([A, B]) == 1


def test_after_a_restart_the_request_leaves_the_wiped_instance():
    """The proxy calls ``cleared`` when it sees an engine restart: the next request for the
    prefix that engine held goes to the other holder, though that one is busier."""
    pages = [A, B, C, D]
    views = {"a": view()[0], "b": view()[0]}
    queued = {"a": 0, "b": 2 * PAGE}
    for v in views.values():
        v.stored(pages)

    def states():
        return [InstanceState(name, 0, v.hit_pages(pages) * PAGE,
                              v.hit_pages(pages, tier="host") * PAGE, queued[name], 0)
                for name, v in views.items()]

    assert route(5 * PAGE, 0, states()).instance == "a"
    views["a"].cleared()
    chosen = route(5 * PAGE, 0, states())
    assert (chosen.instance, chosen.reason) == ("b", "affinity")


@pytest.mark.parametrize("tier, gpu_hits, host_hits", [
    pytest.param(None, 0, 0, id="every-tier"),
    pytest.param("gpu", 0, 3, id="evicted-from-gpu-still-in-host"),
    pytest.param("host", 3, 3, id="dropped-from-host-still-on-gpu"),
])
def test_removed_pages_no_longer_count(tier, gpu_hits, host_hits):
    v, _ = view()
    v.stored([A, B, C], tier="gpu")
    v.stored([A, B, C], tier="host")
    v.removed([A], tier=tier)
    v.removed([E])                                 # unknown pages are ignored
    hits = (v.hit_pages([A, B, C], tier="gpu"), v.hit_pages([A, B, C], tier="host"))
    assert hits == (gpu_hits, host_hits)


@pytest.mark.parametrize("stores, query, expected, held", [
    pytest.param([[A, B, C], [D, E]], [A, B, C], 2, 4, id="the-deepest-oldest-page-goes-first"),
    pytest.param([[A, B, C], [D, E]], [D, E], 2, 4, id="the-newest-prefix-stays-whole"),
    pytest.param([[A, B, C, D, E, b"f"]], [A, B, C, D], 4, 4, id="one-long-prefix-keeps-its-head"),
    pytest.param([[D], [A, B, C], [D], [E]], [D], 1, 4, id="storing-a-page-again-renews-it"),
])
def test_a_view_is_bounded_and_evicts_least_recently_stored(stores, query, expected, held):
    v, _ = view(capacity_pages=4)
    for pages in stores:
        v.stored(pages)
    assert (v.hit_pages(query), len(v)) == (expected, held)


def test_int_keys_from_engine_events_work_too():
    v, _ = view()
    v.stored([11, 12, 13])
    assert v.hit_pages([11, 12, 99]) == 2


@pytest.mark.parametrize("make, error", [
    pytest.param(lambda: PrefixView(0, stale_after_s=1.0), ConfigError, id="zero-capacity"),
    pytest.param(lambda: PrefixView(4, stale_after_s=0.0), ConfigError, id="zero-staleness"),
    pytest.param(lambda: view()[0].stored([A], tier="disk"), InvalidRequest, id="unknown-tier"),
    pytest.param(lambda: view()[0].hit_pages([A], tier="l3"), InvalidRequest, id="query-tier"),
])
def test_bad_config_and_tiers_are_refused(make, error):
    with pytest.raises(error):
        make()

"""The offline-optimal bound against brute force on small hand-made traces, against every policy
of the replay model, and the model's unreachable bytes."""

import random

import pytest

from gcache.kv import ModelLayout, safe_boundary
from gcache.kv.optimal import optimal_bound, residencies
from gcache.kv.policy import policy_from_name
from gcache.kv.replay import OPTIMAL, optimal_bounds, prepare, replay_model, with_optimal
from gcache.kv.replay_model import Reachability, SecondChanceBudget, StoreModel
from gcache.kv.trace import BLOCK_SIZE, TraceRequest

PAGE, TAIL = 1, 3          # a window tail costs three pages, as in mimo-v2.5-pro


def prefixes(blocks):
    """A request given as block ids, as the nodes the bound takes: each names its prefix."""
    return [tuple(blocks[:i + 1]) for i in range(len(blocks))]


def brute_force_optimum(paths, *, page, tail, budget):
    """The most hit pages any store gets, by trying every store content after every save.

    A save may keep any subset of what was held and what its own prompt offers (every page and
    every tail on its path) within the budget: every eviction and tail placement there is.
    """
    nodes = sorted({n for path in paths for n in path})
    bit = {("p", n): 1 << i for i, n in enumerate(nodes)}
    bit.update({("t", n): 1 << (len(nodes) + i) for i, n in enumerate(nodes)})
    size = [0] * (1 << 2 * len(nodes))
    for mask in range(1, len(size)):
        low = mask & -mask
        size[mask] = size[mask ^ low] + (page if low < 1 << len(nodes) else tail)
    best = {0: 0}                                      # held objects -> most hit pages so far
    for path in paths:
        offered = sum(bit[(k, n)] for n in path for k in "pt")
        after: dict[int, int] = {}
        for held, got in best.items():
            hit = safe_boundary(len(path), [bool(held & bit[("p", n)]) for n in path],
                                lambda b: bool(held & bit[("t", path[b - 1])]))
            room, sub = held | offered, held | offered
            while True:
                if size[sub] <= budget and after.get(sub, -1) < got + hit:
                    after[sub] = got + hit
                if sub == 0:
                    break
                sub = (sub - 1) & room
        best = after
    return max(best.values())


def bound(paths, *, page=PAGE, tail=TAIL, budget):
    return optimal_bound(residencies(paths), page_bytes=page, tail_bytes=lambda b: tail,
                         budget_bytes=budget)


# (requests as block ids, budget in pages, the optimum worked out by hand)
HAND_MADE = [
    # A system prompt s, then two conversations each resuming once. In 5 pages one resume at
    # depth 2 (s, its first page, the tail after it) and one hit on s alone (s and its tail)
    # fit, at different lookups; both resumes need 9 pages at once.
    ([["s", "a1"], ["s", "b1"], ["s", "a1", "a2"], ["s", "b1", "b2"]], 5, 3),
    # In 9 pages every hit fits: s for the second request, then both resumes.
    ([["s", "a1"], ["s", "b1"], ["s", "a1", "a2"], ["s", "b1", "b2"]], 9, 5),
    # A tail alone does not hit: pages 1..b must be held too.
    ([["s", "a1"], ["s", "a1"]], 3, 0),
    # One page and its tail: the shared prompt hits at 1, not at 2.
    ([["s", "a1"], ["s", "b1"]], 4, 1),
    # Two pages and the tail after them fit exactly.
    ([["a", "b", "c"], ["a", "b", "x"]], 5, 2),
    # Nothing fits: every hit needs a page and a tail.
    ([["a", "b"], ["a", "b"]], 3, 0),
    # Every hit of an unlimited store fits in 6 pages: the optimum is every shared page.
    ([["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"]], 6, 5),
    # One page short of that: the third request resumes at 2 instead of 3.
    ([["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"]], 5, 4),
]


@pytest.mark.parametrize("blocks, budget, optimum", HAND_MADE)
def test_the_bound_is_the_optimum_on_hand_made_traces(blocks, budget, optimum):
    paths = [prefixes(b) for b in blocks]
    assert brute_force_optimum(paths, page=PAGE, tail=TAIL, budget=budget) == optimum
    result = bound(paths, budget=budget)
    assert result.achieved_pages == result.bound_pages == optimum and result.exact


def random_trace(rng, requests, depth, branching):
    """Conversations over a small tree of blocks: each request takes a random path."""
    out = []
    for _ in range(requests):
        n = rng.randint(1, depth)
        out.append([rng.randrange(branching) if i else 0 for i in range(n)])
    return [prefixes(b) for b in out]


def test_the_bound_brackets_the_brute_force_optimum_on_random_small_traces():
    rng = random.Random(19)
    cases = exact = tight = 0
    while cases < 60:
        paths = random_trace(rng, rng.randint(2, 6), depth=3, branching=2)
        if len({n for p in paths for n in p}) > 6:      # 2^12 store contents at most
            continue
        page, tail = rng.choice([(1, 3), (1, 1), (2, 1), (1, 0), (0, 1)])
        budget = rng.randint(0, 8)
        optimum = brute_force_optimum(paths, page=page, tail=tail, budget=budget)
        result = bound(paths, page=page, tail=tail, budget=budget)
        assert result.achieved_pages <= optimum <= result.bound_pages, (paths, budget)
        cases += 1
        exact += result.exact
        tight += result.bound_pages == optimum
    assert exact >= 45 and tight >= 55               # the bound is the optimum almost always


def test_budget_zero_and_a_trace_without_reuse_give_nothing():
    paths = [prefixes(["a", "b"]), prefixes(["a", "b"])]
    assert bound(paths, budget=0).bound_pages == 0
    assert bound([prefixes(["a"]), prefixes(["b"])], budget=10).bound_pages == 0


def test_paths_must_name_prefixes():
    with pytest.raises(ValueError, match="must name prefixes"):
        residencies([["a", "b"], ["c", "b"], ["a", "b"]])


@pytest.fixture(scope="module")
def mimo_pro():
    return ModelLayout.from_config("mimo-v2.5-pro", page_size=BLOCK_SIZE)


def trace_of(rng, requests):
    """Conversation-like Mooncake requests: a shared first block, then a few branches."""
    out = []
    for i in range(requests):
        blocks = [0] + [rng.randrange(3) * 10 + k for k in range(rng.randint(0, 4))]
        out.append(TraceRequest(i, 0, len(blocks) * BLOCK_SIZE, tuple(blocks)))
    return out


# mimo-v2.5-pro: W = 128 < P = 512; gemma-3-1b at P = 64: W = 512, a tail of eight pages, where
# full-layer storage holds a window for less than a tail costs.
@pytest.mark.parametrize("model, page_size", [("mimo-v2.5-pro", BLOCK_SIZE), ("gemma-3-1b", 64)])
@pytest.mark.parametrize("seed", range(3))
def test_no_policy_beats_the_bound(model, page_size, seed):
    trace = prepare(trace_of(random.Random(seed), 40),
                    ModelLayout.from_config(model, page_size=page_size))
    budgets = [0.02, 0.05, 0.1, 0.2, 0.4, 1.0]
    rows = with_optimal(replay_model(trace, budgets=budgets), trace,
                        optimal_bounds(trace, budgets), source="model")
    optimal = {r.budget_fraction: r.hit_rate for r in rows if r.policy == OPTIMAL}
    for r in rows:
        assert r.hit_rate <= optimal[r.budget_fraction], r
        assert 0 <= r.of_optimal <= 1 if optimal[r.budget_fraction] else r.of_optimal is None
    assert optimal[1.0] == max(r.hit_rate for r in rows if r.policy == "full-layer")


def test_the_model_counts_pages_behind_an_evicted_one_as_unreachable(mimo_pro):
    full_page = mimo_pro.all_layers_page_bytes()
    model = StoreModel(mimo_pro, policy_from_name("full-layer"), 3 * full_page)
    a = [bytes([1, i]) for i in range(3)]                       # pages a0 a1 a2
    b = [bytes([2, 0])]
    model.request(a)                                            # holds a0 a1 a2
    model.request(b)                                            # evicts a0: a1, a2 orphaned
    model.request(b)                                            # looks up over a1 a2 b0
    assert model.held_bytes_seen == 6 * full_page
    assert model.unreachable_bytes_seen == 2 * full_page
    model.request(a)                                            # writes a0, evicting a1
    model.request(b)                                            # looks up over a2 b0 a0
    assert model.unreachable_bytes_seen == 5 * full_page
    assert model.unreachable_share == pytest.approx(5 / 12)


def test_a_unit_whose_prefix_is_broken_is_evicted_before_older_ones():
    """A window tail whose page is not held cannot hit: the budget lets it go before the older
    page that can, and a read unit below a missing page gets no second chance."""
    reach = Reachability(page_bytes=1)
    for path in ([b"w"], [b"x"], [b"a", b"b"], [b"y"], [b"z"], [b"v"]):
        reach.learn(path)
    units = SecondChanceBudget(2, reach.change, reach.first_broken)
    assert units.add(b"pw", 1) and units.add(b"tc", 1) and units.add(b"px", 1)
    assert b"pw" in units and b"tc" not in units and units.evicted == 1
    units = SecondChanceBudget(3, reach.change, reach.first_broken)
    for unit in (b"pa", b"pb", b"py"):
        units.add(unit, 1)
    units.read(b"pb")
    units.add(b"pz", 1)                           # the oldest, a, goes; b is broken below it
    units.add(b"pv", 1)
    assert [u in units for u in (b"pa", b"pb", b"py", b"pz", b"pv")] == \
        [False, False, True, True, True]


def test_reachable_bytes_follow_every_store_and_eviction():
    rng = random.Random(7)
    paths = [[bytes(p[:i + 1]) for i in range(len(p))]
             for p in ([rng.randrange(3) for _ in range(rng.randint(1, 4))] for _ in range(30))]
    reach, held = Reachability(page_bytes=1), {}
    for path in paths:
        reach.learn(path)
    for _ in range(400):
        node = rng.choice(rng.choice(paths))
        unit = rng.choice([b"p", b"t"]) + node
        if unit in held:
            reach.change(unit, -held.pop(unit))
        else:
            held[unit] = 1 if unit[:1] == b"p" else 3
            reach.change(unit, held[unit])
        whole = {n for n in {u[1:] for u in held}
                 if all(b"p" + n[:i + 1] in held for i in range(len(n)))}
        assert reach.reachable_bytes == sum(size for u, size in held.items()
                                            if u[1:] in whole), held
        assert set(reach.broken_units()) == {u for u in held if u[1:] not in whole}

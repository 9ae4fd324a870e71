"""The offline optimum of a trace at a byte budget: the replay's ``optimal`` row.

What is bounded: the replay model's store with every choice left free — any eviction at any
time, any tail placement, any rewrite — and only the rules no policy escapes: a request looks
its prompt up before it saves; a save writes only objects of its own prompt (full-attention
pages, window tails at its page boundaries); at every lookup the bytes held are at most the
budget; a request hits at boundary b only when pages 1..b and the tail at b are held (the
window-safe rule). Every policy of ``gcache.kv.policy``, under any eviction, is such a store.

Residency intervals. Let ``p`` be the last request before t whose prompt holds page i of t's
path. Only a save of a request holding page i writes that page or the tail after it, so if t
hits at b, page i ≤ b and the tail at b were written at p's save or earlier and are held at every
lookup ``p+1..t``. An object's intervals are the gaps between consecutive requests holding its
page, hence disjoint: at each lookup the intervals covering it charge distinct held objects, at
most the budget. A page deeper in a path is held by fewer requests, so the intervals of one
request are nested (deeper, longer), and the tail at b lasts as long as page b. The offline
optimum is therefore exactly the integer program: choose ``h_t`` in ``0..m_t`` per request
(``m_t``: pages t shares with any earlier request), maximise ``Σ h_t`` with the intervals of the
chosen hits fitting the budget at every lookup. Any feasible choice is realised by a store that
writes each object when its interval opens and drops it when it closes.

The bound, an upper bound on every policy and tight where it can be checked:
1. Every hit a store of unlimited size gets (``h_t = m_t``): when those intervals fit the budget
   at every lookup, this is the optimum itself (``exact``), reached by the schedule above. It is
   so for the conversation trace from 0.41% of its working set up (``gcache replay``).
2. Otherwise a hit whose own objects exceed the budget (``f·h + tail > B``) is dropped, and the
   budget rows are relaxed with Lagrange multipliers: for any ``λ_τ ≥ 0``,
   ``L(λ) = B·Σλ_τ + Σ_t max_h (h − Σ_τ λ_τ·load_t(h, τ))`` is at least the optimum (for a
   feasible choice each term ``λ_τ·(B − load_τ)`` it adds is ≥ 0), and its minimum is the linear
   program's value. ``λ`` comes from projected, deflected subgradient steps (Polyak's step
   towards the best schedule found); the bound is the smallest ``L`` seen, rounded down to whole
   pages (hits are whole pages; a float tolerance of 1e-9 relative is added first). Packing the
   intervals greedily in exact integer bytes, in the order the multipliers price them, gives a
   schedule a store can follow, so the optimum lies in ``[achieved, bound]``. On the first 2,000
   requests of the conversation trace the bound is within 0.0004 of the linear program's value
   (solved exactly, once, with HiGHS) at budgets of 0.1% to 0.8%, and about 7 s per budget on
   the whole trace.

Full-layer storage keeps a page of every layer as one object of ``A`` bytes: it holds page v's
full-attention KV and the SWA KV of the page's tokens, hence the tail at v when ``W ≤ P``.
Charging a tail ``min(tail bytes, A − f)`` (``f``: a full-attention page) keeps the bound above
full-layer storage for any window, and changes nothing for the shipped layouts at the replay's
page of 512 tokens (``W ≤ P``).

Why a bracket and a Lagrangian: the integer program is a knapsack at every lookup at once,
NP-hard in general; its linear relaxation is too large for a solver in every replay (five
million nonzeros for 2,000 requests), while one Lagrangian step is a few linear passes over the
hit options (vectorised; about as many entries as the trace has shared pages).

The real cluster is a coarser store of the same objects (per-layer objects that hit only all
together, segments, a budget per server), so the bound holds for it too, up to the record
headers its arena is enlarged by.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from gcache.errors import InvalidRequest

SUBGRADIENT_STEPS = 1500       # at most; each costs a few passes over the hit options
STALL_STEPS = 50               # steps without a better bound before the step size halves
PACK_EVERY = 250               # subgradient steps between packings guided by the prices
FLOAT_SLACK = 1e-9             # relative tolerance added to L(λ) before rounding down
DEFLECT = 0.5              # share of a step along the new subgradient; the rest along the last
UNBOUNDED = 1 << 62            # slack of a stretch with no lookups


@dataclass(frozen=True, slots=True)
class Residencies:
    """A trace's hit options, flattened: one entry per page a request shares with an earlier one.

    Entries of request t are ``starts[t]:starts[t+1]``, by depth; ``since[k]`` is the last
    earlier request holding that page (its interval covers lookups ``since+1..t``).
    """

    requests: int
    starts: np.ndarray         # int64, requests + 1
    request: np.ndarray        # int64 per entry: t
    depth: np.ndarray          # int64 per entry: the page's boundary, 1-based
    since: np.ndarray          # int64 per entry: p, non-increasing with depth within t

    @property
    def max_hit_pages(self) -> int:
        """Hit pages of a store that never evicts: every shared page."""
        return len(self.depth)


@dataclass(frozen=True, slots=True)
class OptimalBound:
    """The offline optimum of one budget, in pages: ``achieved_pages ≤ optimum ≤ bound_pages``."""

    bound_pages: int           # no store reaches more hit pages at this budget
    achieved_pages: int        # hit pages of a schedule that fits (the optimum is at least this)
    exact: bool                # achieved == bound: the optimum itself
    peak_bytes: int            # most bytes held at a lookup by the schedule of every hit


def residencies(paths: Sequence[Sequence[Hashable]]) -> Residencies:
    """Hit options of requests given as paths of node ids, one per full page, where a node names
    its whole prefix (as page hashes do). Raises ``InvalidRequest`` when they do not."""
    last: dict[Hashable, int] = {}
    request: list[int] = []
    depth: list[int] = []
    since: list[int] = []
    starts = [0]
    for t, path in enumerate(paths):
        for i, node in enumerate(path):
            p = last.get(node)
            if p is None:
                break
            request.append(t)
            depth.append(i + 1)
            since.append(p)
        for node in path:
            last[node] = t
        starts.append(len(depth))
    res = Residencies(len(paths), np.array(starts, np.int64), np.array(request, np.int64),
                      np.array(depth, np.int64), np.array(since, np.int64))
    same = res.request[1:] == res.request[:-1]
    if np.any(same & (res.since[1:] > res.since[:-1])):
        raise InvalidRequest("paths must name prefixes: a deeper page was seen more recently "
                             "than its parent")
    return res


def optimal_bound(res: Residencies, *, page_bytes: int, tail_bytes: Callable[[int], int],
                  budget_bytes: int) -> OptimalBound:
    """The offline optimum at ``budget_bytes``, or bounds on it (module docstring).

    ``page_bytes``: one full-attention page over every paged layer (0 without paged layers);
    ``tail_bytes(b)``: the charge of the window tail at boundary b pages (0 without SWA layers).
    """
    sizes = [page_bytes] + [tail_bytes(b) for b in range(1, int(res.depth.max(initial=0)) + 1)]
    unit = math.gcd(*sizes) or 1           # every object is a whole number of units
    f = page_bytes // unit
    s = np.array(sizes, np.int64)[res.depth] // unit
    budget = budget_bytes // unit
    peak = _peak(res, f, s)
    if peak <= budget:
        return OptimalBound(res.max_hit_pages, res.max_hit_pages, True, peak * unit)
    # A hit whose own objects exceed the budget never happens (f·h + s_h rises with h).
    fits = f * res.depth + s <= budget
    res, s = _within(res, fits), s[fits]
    if _peak(res, f, s) <= budget:         # budget 0 included: no hit is left
        return OptimalBound(res.max_hit_pages, res.max_hit_pages, True, peak * unit)
    first, seg = _segments(res)
    every = res.depth[res.starts[1:][np.diff(res.starts) > 0] - 1]
    schedule = _Schedule(res, f, s, budget)
    schedule.fill(res.request[first], every)
    achieved = schedule.hit_pages
    best, theta, stall = math.inf, 2.0, 0
    lam = np.zeros(res.requests)
    grad = np.zeros(res.requests)
    for step in range(1, SUBGRADIENT_STEPS + 1):
        priced = _priced(res, first, seg, f / budget, s / budget, lam)
        if priced.bound < best - 1e-12:
            best, stall = priced.bound, 0
        elif (stall := stall + 1) >= STALL_STEPS:
            theta, stall = theta / 2, 0
        if step % PACK_EVERY == 0:
            achieved = max(achieved, _guided(res, f, s, budget, first, priced))
        if _pages(best) <= achieved or theta < 1e-4:
            break
        raw = _projected(1.0 - priced.load, lam)
        if not raw.any():                  # a subgradient of 0: λ minimises L
            break
        # Deflected steps (a share of the last direction kept) zigzag less between budget rows.
        grad = _projected(DEFLECT * raw + (1 - DEFLECT) * grad, lam)
        if not grad.any():
            grad = raw
        lam = np.maximum(lam - theta * (priced.bound - achieved) / float(grad @ grad) * grad,
                         0.0)
    bound_pages = max(_pages(best), achieved)
    return OptimalBound(bound_pages, achieved, bound_pages == achieved, peak * unit)


def _peak(res: Residencies, f: int, s: np.ndarray) -> int:
    """Most units held at a lookup by the schedule of every hit."""
    _, seg = _segments(res)
    every = res.depth[res.starts[1:][np.diff(res.starts) > 0] - 1]
    return int(np.rint(_load(res, seg, every, f, s)).max(initial=0))


def _within(res: Residencies, keep: np.ndarray) -> Residencies:
    """``res`` with only the entries ``keep`` marks (a prefix of each request's)."""
    starts = np.concatenate(([0], np.cumsum(np.bincount(res.request[keep],
                                                        minlength=res.requests))))
    return Residencies(res.requests, starts, res.request[keep], res.depth[keep],
                       res.since[keep])


def _pages(bound: float) -> int:
    return math.floor(bound * (1 + FLOAT_SLACK))


def _projected(grad: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """``grad`` without the components that would push a λ at 0 below it."""
    return np.where((lam <= 0) & (grad > 0), 0.0, grad)


def _segments(res: Residencies) -> tuple[np.ndarray, np.ndarray]:
    """(first entry of each request with entries, that request's segment index per entry)."""
    counts = np.diff(res.starts)
    return res.starts[:-1][counts > 0], np.repeat(np.arange(int((counts > 0).sum())),
                                                  counts[counts > 0])


def _load(res: Residencies, seg: np.ndarray, hits: np.ndarray, f: float,
          s: np.ndarray) -> np.ndarray:
    """Units held at each lookup (float) by the intervals of ``hits`` (a depth per request with
    entries): ``f`` per page at depth ≤ hit, and the tail at the hit's depth."""
    hit = hits[seg]
    weight = np.where(res.depth <= hit, f, 0) + np.where(res.depth == hit, s, 0)
    diff = np.bincount(res.since + 1, weight, res.requests + 1) \
        - np.bincount(res.request + 1, weight, res.requests + 1)
    out: np.ndarray = np.cumsum(diff)[:res.requests]
    return out


@dataclass(frozen=True, slots=True)
class _Priced:
    """The Lagrangian at one λ, the budget normalised to 1."""

    bound: float               # L(λ)
    top: np.ndarray            # per request with entries: its best priced value (≥ 0)
    chosen: np.ndarray         # per request with entries: the hit attaining it (0: none)
    load: np.ndarray           # per lookup: the chosen hits' load (the subgradient is 1 − load)


def _priced(res: Residencies, first: np.ndarray, seg: np.ndarray, f: float, s: np.ndarray,
            lam: np.ndarray) -> _Priced:
    cum = np.concatenate(([0.0], np.cumsum(lam)))
    span = cum[res.request + 1] - cum[res.since + 1]     # Σ λ over one interval
    run = np.cumsum(span)
    pages = run - (run[first] - span[first])[seg]        # Σ over the request's depths ≤ this
    value = res.depth - f * pages - s * span
    top = np.maximum(np.maximum.reduceat(value, first), 0.0)
    chosen = np.maximum.reduceat(np.where((value >= top[seg]) & (top[seg] > 0), res.depth, 0),
                                 first)
    return _Priced(float(lam.sum() + top.sum()), top, chosen, _load(res, seg, chosen, f, s))


def _guided(res: Residencies, f: int, s: np.ndarray, budget: int, first: np.ndarray,
            priced: _Priced) -> int:
    """Hit pages of a schedule packed in the prices' order: the priced hits, most valuable
    first, then every request again, in time order, as deep as it fits."""
    schedule = _Schedule(res, f, s, budget)
    order = np.argsort(-priced.top, kind="stable")
    schedule.fill(res.request[first][order], priced.chosen[order])
    schedule.fill(res.request[first], res.depth[res.starts[1:][np.diff(res.starts) > 0] - 1])
    return schedule.hit_pages


class _Schedule:
    """Hits taken and the units their intervals hold at each lookup, in exact integers: a
    schedule a store can follow (write at an interval's opening, drop at its close)."""

    def __init__(self, res: Residencies, f: int, s: np.ndarray, budget: int) -> None:
        self.res, self.f, self.s, self.budget = res, f, s, budget
        self.load = np.zeros(res.requests, np.int64)
        self.hits = np.zeros(res.requests, np.int64)

    @property
    def hit_pages(self) -> int:
        return int(self.hits.sum())

    def fill(self, requests: np.ndarray, caps: np.ndarray) -> None:
        """Each request in turn takes the deepest hit up to its cap that fits (never less than
        it had)."""
        for t, cap in zip(requests.tolist(), caps.tolist()):
            if cap > self.hits[t]:
                had = int(self.hits[t])
                self._add(t, had, -1)
                self._add(t, max(had, self._deepest_fit(t, cap)), 1)

    def _deepest_fit(self, t: int, cap: int) -> int:
        k0 = int(self.res.starts[t])
        p, f = self.res.since[k0:k0 + cap], self.f
        low = int(p[-1]) + 1                                  # earliest lookup any option holds
        slack = self.budget - self.load[low:t + 1]
        # Lookups p[j]+1 .. p[j-1] (.. t for j = 0) hold pages j..h-1 of hit h, and its tail.
        edges = np.concatenate((p[::-1], [t])) - low + 1       # stretch starts in slack, rising
        least = np.full(cap, UNBOUNDED, np.int64)
        nonempty = edges[1:] > edges[:-1]
        if nonempty.any():
            least[::-1][nonempty] = np.minimum.reduceat(slack, edges[:-1][nonempty])
        room = np.minimum.accumulate(least + f * np.arange(cap))
        fits = np.flatnonzero(f * np.arange(1, cap + 1) + self.s[k0:k0 + cap] <= room)
        return int(fits[-1]) + 1 if len(fits) else 0

    def _add(self, t: int, hit: int, sign: int) -> None:
        if hit == 0:
            return
        k0 = int(self.res.starts[t])
        p = self.res.since[k0:k0 + hit]
        low = int(p[-1]) + 1
        add = np.zeros(t + 2 - low, np.int64)
        np.add.at(add, p + 1 - low, self.f)
        add[p[-1] + 1 - low] += self.s[k0 + hit - 1]
        self.load[low:t + 1] += sign * np.cumsum(add)[:-1]
        self.hits[t] = hit if sign > 0 else 0

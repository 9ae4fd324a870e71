"""The routing policy: which engine instance a request goes to. A pure function of its inputs.

``route`` sees one request (its prompt length and GCache's hit for it) and a snapshot of every
instance (its view's GPU and host hits for this request, its load, its pool, its health), and
names one instance. It does no IO and keeps no state, so the proxy and ``bench/routing.py`` run
the same decisions and a table test pins each rule. All quantities are in tokens.

Cost. An instance's cost is the prefill it would compute plus the work already queued there::

    cost = prompt - saving + load
    load = queued_prefill_tokens + decode_tokens × running_decodes

``saving`` credits each prefix token at the best tier that holds it there: the instance's GPU
(credit 1), its host memory (``host_credit``: the pages must be copied up first) and GCache
(``gcache_credit``: fetched over the network, and reachable from every instance). Each tier
holds a leading run of the prompt (chain semantics), so with the default credits a GPU hit of
g, host hit of h and GCache hit of c save ``g + 0.8·(h−g) + 0.6·(c−h)`` (terms below zero
dropped). GCache's hit is the caller's ``KVStore.match``, which already stops at the window-safe
boundary: for a hybrid sliding-window model, pages past the last stored window tail cannot be
restored, so a prefix is credited only up to that boundary, never up to the raw page run (the
complaint in research/router.md §5: engine KV events over-report such prefixes).

Buckets. The request's bucket is ``Buckets.of(prompt − best hit)``, where the best hit is the
longest prefix any healthy instance (host hit, which includes its GPU) or GCache holds, uncredited,
since a bucket is about how much prefill is left to compute; none (longer than every bucket)
raises InvalidRequest. An instance *fits* the request when the prefill it would itself compute,
``prompt − max(its host hit, GCache hit)``, falls in its own pool's bucket or a shorter one, or
in any bucket at all for the longest pool with a healthy instance (nowhere else could take a
longer one): a short pool is never handed a long prefill, which is the point of the pools. Pools
are visited from the request's bucket (an empty one: the nearest non-empty pool, the larger on a
tie, since a short request in a long pool harms no one else), then upwards; the home pool is the
first with a fitting instance that passes the spread rule. That finds one unless the prompt
minus its hit on the non-holders is beyond every bucket; then it goes to the cheapest instance
that fits (or whose own hit brings it under the longest bucket), hot or not, since no other
instance could take it at all.

Spread. A hot prefix must not collapse onto the instance that holds it. Within the home pool
only instances whose load is at most the pool's least load + ``spread_tokens`` are eligible; the
cheapest eligible one wins. When the cheapest fitting one was not eligible, the reason is "spread".
Cost alone already spreads once the holder's lead exceeds its saving; the bound caps the lead
for long hits, and the instance picked beside it then holds the prefix too (hot-prefix
replication, as Mooncake's Conductor does on purpose).

Override. An instance j of another pool wins over the home pool's choice c when all hold:
j fits; j's load ≤ its pool's least load + ``spread_tokens``; saving(j) − the best saving among
the home pool's eligible instances > ``override_tokens``; and cost(j) < cost(c). The reason is
"override". The fit rule keeps an override from carrying a long prefill into a short pool, so
in practice it moves a short remainder of a long cached prompt to the long pool that holds it.

Spill. An instance j of a longer pool that fits, is all but idle (load ≤ ``spread_tokens``/4),
carries more than ``spread_tokens`` less load than the home pool's choice c and is cheaper than
c takes the request instead; the reason is "spill". Pools are sized for the work the trace was
expected to bring, which a trace never brings exactly: a short pool past that borrows an idle
long instance, where no long chunk shares the short request's steps (on the long variant of the
replay suite's multi-tenant trace this takes the max/mean load from 1.34 to 1.28 and the
short-bucket TTFT p99 from 3.6 s to 3.4 s, ``bench/routing.py``).

Otherwise the reason says what decided: "affinity" (the chosen instance's own GPU or host hit
saves more than GCache alone would), "gcache" (only GCache's hit saves anything: all instances
were equal but for load) or "least_loaded" (nothing was cached). Unhealthy instances are never
chosen; with none healthy ``route`` raises ``NoInstance``. Ties go to the smaller name, so a
decision is reproducible. ``Route.bucket`` is the request's bucket; the chosen instance's pool
differs from it after an override, after the fit rule moved it up, or when its pool was empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gcache.errors import ConfigError, InvalidRequest, NoInstance
from gcache.router.buckets import Buckets


@dataclass(frozen=True, slots=True)
class InstanceState:
    name: str
    bucket: int                  # the length bucket whose pool it serves
    gpu_hit_tokens: int          # this request's prefix tokens resident in its GPU cache (its view)
    host_hit_tokens: int         # ... in its GPU or host memory (>= gpu_hit_tokens)
    queued_prefill_tokens: int   # uncached prefill tokens queued or running there
    running_decodes: int         # sequences decoding there
    healthy: bool = True

    def __post_init__(self) -> None:
        for what, value in (("gpu_hit_tokens", self.gpu_hit_tokens),
                            ("host_hit_tokens", self.host_hit_tokens),
                            ("queued_prefill_tokens", self.queued_prefill_tokens),
                            ("running_decodes", self.running_decodes)):
            if value < 0:
                raise InvalidRequest(f"instance {self.name}: {what} is {value}; must be >= 0")
        if self.host_hit_tokens < self.gpu_hit_tokens:
            raise InvalidRequest(
                f"instance {self.name}: host_hit_tokens {self.host_hit_tokens} < gpu_hit_tokens "
                f"{self.gpu_hit_tokens}; the host hit counts the GPU's pages too")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    buckets: Buckets = Buckets()   # noqa: RUF009 - frozen: one shared default is safe
    host_credit: float = 0.8     # a host-memory hit saves this share of its prefill (transfer)
    gcache_credit: float = 0.6   # a GCache (L3) hit, reachable from every instance
    # One running decode ≈ 512 prefill tokens: at the trace's mean context (~12K tokens) and
    # remaining output (~170 of 343) it adds ~0.17 ms to each of ~170 steps (research §6.2's
    # decode curve at half of a 2M-token KV cache), ~29 ms: 580 prefill tokens at 20K tokens/s.
    decode_tokens: float = 512.0
    # One 16K prefill chunk (MiMo's): ~0.8 s at 20K tokens/s, under a tenth of the simulator's
    # 10 s load window, so a holder's lead stays inside the max/mean load target of 1.2.
    spread_tokens: int = 16_384
    # One chunk again: a request sent to a longer pool shares lockstep steps with that pool's
    # 16K chunks, so a saving smaller than a chunk does not repay the move.
    override_tokens: int = 16_384

    def __post_init__(self) -> None:
        for key, credit in (("host_credit", self.host_credit),
                            ("gcache_credit", self.gcache_credit)):
            if not 0.0 <= credit <= 1.0:
                raise ConfigError(f"router.{key}", credit,
                                  "must be in [0, 1]: a share of a GPU hit's saving")
        for key, tokens in (("decode_tokens", self.decode_tokens),
                            ("spread_tokens", self.spread_tokens),
                            ("override_tokens", self.override_tokens)):
            if tokens < 0:
                raise ConfigError(f"router.{key}", tokens, "must be >= 0 (tokens)")


@dataclass(frozen=True, slots=True)
class Route:
    instance: str
    bucket: int                  # the request's bucket, by its uncached length
    cost: float                  # the chosen instance's estimated cost (tokens)
    reason: str                  # "affinity" | "spread" | "least_loaded" | "gcache" | "override"
                                 # | "spill"


@dataclass(frozen=True, slots=True)
class _Candidate:
    name: str
    pool: int
    saving: float                # credited prefill tokens it saves
    load: float                  # queued prefill + decode equivalent
    cost: float
    fits: bool                   # its own uncached prefill belongs to its pool or a shorter
                                 # one (in the longest live pool: to any bucket)
    within_buckets: bool         # its own uncached prefill is shorter than the longest bucket


def route(prompt_tokens: int, gcache_hit_tokens: int, instances: Sequence[InstanceState],
          config: PolicyConfig = PolicyConfig()) -> Route:
    """The instance for a request of ``prompt_tokens`` tokens whose window-safe GCache hit is
    ``gcache_hit_tokens`` (any hit longer than the prompt counts as the whole prompt). Raises
    InvalidRequest for negative lengths, duplicate names, or an uncached length beyond every
    bucket; ConfigError for an instance whose bucket has no bound; NoInstance when no
    instance is healthy."""
    _check(prompt_tokens, gcache_hit_tokens, instances, config.buckets)
    gcache_hit = min(gcache_hit_tokens, prompt_tokens)
    healthy = [state for state in instances if state.healthy]
    best_hit = max([gcache_hit] + [min(s.host_hit_tokens, prompt_tokens) for s in healthy])
    uncached = prompt_tokens - best_hit
    bucket = config.buckets.of(uncached)
    if bucket is None:           # the request's own fault, whatever the instances' health
        raise InvalidRequest(
            f"prompt of {prompt_tokens} tokens leaves {uncached} uncached; the longest bucket "
            f"takes fewer than {config.buckets.bounds[-1]}")
    if not healthy:
        raise NoInstance(f"no healthy instance among {len(instances)}")
    top = max(state.bucket for state in healthy)
    pools: dict[int, list[_Candidate]] = {}
    for state in healthy:
        pools.setdefault(state.bucket, []).append(
            _assess(state, prompt_tokens, gcache_hit, top, config))
    home, chosen, spread = _choose_home(_pool_order(bucket, pools), pools, config.spread_tokens)
    override = _override(chosen, home, pools, config)
    if override is not None:
        return Route(override.name, bucket, override.cost, "override")
    spill = _spill(chosen, home, pools, config.spread_tokens)
    if spill is not None:
        return Route(spill.name, bucket, spill.cost, "spill")
    floor = config.gcache_credit * gcache_hit
    reason = ("spread" if spread else "affinity" if chosen.saving > floor
              else "gcache" if floor > 0 else "least_loaded")
    return Route(chosen.name, bucket, chosen.cost, reason)


def _check(prompt_tokens: int, gcache_hit_tokens: int, instances: Sequence[InstanceState],
           buckets: Buckets) -> None:
    if prompt_tokens < 0 or gcache_hit_tokens < 0:
        raise InvalidRequest(f"prompt_tokens {prompt_tokens}, gcache_hit_tokens "
                             f"{gcache_hit_tokens}; both must be >= 0")
    names = [state.name for state in instances]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise InvalidRequest(f"instance names {twice} appear twice; names break ties")
    for state in instances:
        if not 0 <= state.bucket < len(buckets):
            raise ConfigError(f"router.instances.{state.name}.bucket", state.bucket,
                              f"must name one of the {len(buckets)} buckets, 0..{len(buckets) - 1}")


def _assess(state: InstanceState, prompt_tokens: int, gcache_hit: int, top: int,
            config: PolicyConfig) -> _Candidate:
    """``top``: the longest pool with a healthy instance, which takes any prefill that fits a
    bucket at all, since no pool is left to send a longer one to."""
    gpu = min(state.gpu_hit_tokens, prompt_tokens)
    host = min(state.host_hit_tokens, prompt_tokens)
    saving = _credited(((1.0, gpu), (config.host_credit, host), (config.gcache_credit, gcache_hit)))
    load = state.queued_prefill_tokens + config.decode_tokens * state.running_decodes
    own = config.buckets.of(prompt_tokens - max(host, gcache_hit))
    within = own is not None
    fits = own is not None and (own <= state.bucket or state.bucket == top)
    return _Candidate(state.name, state.bucket, saving, load, prompt_tokens - saving + load,
                      fits, within)


def _credited(tiers: Sequence[tuple[float, int]]) -> float:
    """Tokens saved when each token of the prefix is credited at the best (credit, hit) tier that
    holds it; a tier with hit h holds tokens [0, h)."""
    saved, covered = 0.0, 0
    for credit, hit in sorted(tiers, reverse=True):
        if hit > covered:
            saved += credit * (hit - covered)
            covered = hit
    return saved


def _pool_order(bucket: int, pools: dict[int, list[_Candidate]]) -> list[int]:
    """The nearest non-empty pool to ``bucket`` (the larger on a tie), then the larger ones."""
    nearest = min(pools, key=lambda pool: (abs(pool - bucket), -pool))
    return sorted(pool for pool in pools if pool >= nearest)


def _choose_home(order: list[int], pools: dict[int, list[_Candidate]],
                 spread_tokens: int) -> tuple[int, _Candidate, bool]:
    """(home pool, its choice, whether the spread rule passed over a cheaper instance)."""
    for pool in order:
        fitting = [c for c in pools[pool] if c.fits]
        eligible = _eligible(fitting, pools[pool], spread_tokens)
        if eligible:
            chosen = min(eligible, key=_by_cost)
            return pool, chosen, chosen is not min(fitting, key=_by_cost)
    # Every instance it fits is a hot spot. Piling onto one beats a prefill its pool is too
    # short for; and when none fits, the instance whose own hit brings the prefill under the
    # longest bucket (there is one, or the request would have been refused).
    fitting = [c for pool in order for c in pools[pool] if c.fits]
    short_enough = [c for members in pools.values() for c in members if c.within_buckets]
    chosen = min(fitting or short_enough, key=_by_cost)
    return chosen.pool, chosen, False


def _override(chosen: _Candidate, home: int, pools: dict[int, list[_Candidate]],
              config: PolicyConfig) -> _Candidate | None:
    home_eligible = _eligible(pools[home], pools[home], config.spread_tokens)
    best_home_saving = max(c.saving for c in home_eligible)
    wins = [c for pool, members in pools.items() if pool != home
            for c in _eligible([m for m in members if m.fits], members, config.spread_tokens)
            if c.saving - best_home_saving > config.override_tokens and c.cost < chosen.cost]
    return min(wins, key=_by_cost) if wins else None


def _spill(chosen: _Candidate, home: int, pools: dict[int, list[_Candidate]],
           spread_tokens: int) -> _Candidate | None:
    """An instance of a longer pool that is all but idle (at most a quarter of
    ``spread_tokens`` of load: no long chunk to share its steps with) and cheaper than the home
    pool's choice, whose load is more than ``spread_tokens`` above it. Pools are sized for the
    work a trace was expected to bring; when the short pool is busier than that, an idle long
    instance serves a short request as a short one would, and evens the load out."""
    idle = [c for pool, members in pools.items() if pool > home for c in members
            if c.fits and c.load <= spread_tokens // 4 and chosen.load - c.load > spread_tokens
            and c.cost < chosen.cost]
    return min(idle, key=_by_cost) if idle else None


def _eligible(candidates: list[_Candidate], pool: list[_Candidate],
              spread_tokens: int) -> list[_Candidate]:
    """The candidates whose load is within ``spread_tokens`` of the pool's least loaded."""
    bound = min(c.load for c in pool) + spread_tokens
    return [c for c in candidates if c.load <= bound]


def _by_cost(c: _Candidate) -> tuple[float, str]:
    return c.cost, c.name

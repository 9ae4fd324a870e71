"""Capacity planning from a trace: the smallest budget, and the policy, that reach a hit rate.

The replay model (``gcache.kv.replay_model``) gives a policy's token hit rate at a byte budget;
for a target hit rate this module searches, per policy, the smallest budget (a fraction of the
trace's full-layer working set) whose replay reaches it, bisecting in log space down to
``RESOLUTION`` relative width and keeping only a budget whose replay was measured to meet the
target (hit rate is not strictly monotone in the budget under eviction, so a bisection's answer
is never assumed). The cheapest policy wins, the default on a tie. The capacity is split per
host: what fits the RAM the operator gives the hot tier, the rest on the cold tier with headroom
for its segment files' dead space (docs/operations.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gcache.errors import InvalidRequest
from gcache.kv.policy import DEFAULT_POLICY
from gcache.kv.replay import DEFAULT_POLICIES, PreparedTrace, ReplayRow, replay_model

LOWEST_FRACTION = 1e-3     # budgets below 0.1% of the working set are not searched
RESOLUTION = 0.02          # the search stops when the bracket is this narrow (relative)
DISK_HEADROOM = 0.2        # cold-tier bytes over the values they hold (dead space in segments)


@dataclass(frozen=True, slots=True)
class Plan:
    policy: str
    budget_fraction: float         # of the full-layer working set
    hit_rate: float                # the replay's at that budget (>= the target)
    target: float
    hosts: int
    capacity_bytes: int            # the whole cluster's, at the model's size
    memory_per_host_bytes: int     # the hot tier (``memory``)
    disk_per_host_bytes: int       # the cold tier (``disk_capacity``), headroom included
    probes: tuple[ReplayRow, ...]  # every replay the search ran


def plan(trace: PreparedTrace, *, target: float, hosts: int, host_memory_bytes: int,
         policies: Sequence[str] = DEFAULT_POLICIES) -> Plan:
    """The cheapest (budget, policy) that reaches ``target`` on ``trace``. Raises
    InvalidRequest for a target no policy reaches with the whole working set, or bad inputs."""
    if not 0 < target < 1:
        raise InvalidRequest(f"target hit rate {target} must be in (0, 1)")
    if hosts < 1 or host_memory_bytes < 0:
        raise InvalidRequest(f"hosts={hosts} must be at least 1 and host memory "
                             f"{host_memory_bytes} not negative")
    probes: list[ReplayRow] = []
    found: dict[str, ReplayRow] = {}
    for policy in policies:
        row = _smallest_budget(trace, policy, target, probes)
        if row is not None:
            found[policy] = row
    if not found:
        best = max((r for r in probes if r.budget_fraction == 1.0), key=lambda r: r.hit_rate)
        raise InvalidRequest(f"no policy reaches a hit rate of {target} on this trace: the best "
                             f"is {best.policy} with {best.hit_rate:.4f} at the whole working "
                             "set")
    chosen = min(found.values(),
                 key=lambda r: (r.budget_fraction, r.policy != DEFAULT_POLICY, r.policy))
    capacity = math.ceil(chosen.budget_fraction * trace.working_set_bytes)
    per_host = -(-capacity // hosts)
    memory = min(per_host, host_memory_bytes)
    disk = math.ceil((per_host - memory) * (1 + DISK_HEADROOM))
    return Plan(chosen.policy, chosen.budget_fraction, chosen.hit_rate, target, hosts, capacity,
                memory, disk, tuple(probes))


def _smallest_budget(trace: PreparedTrace, policy: str, target: float,
                     probes: list[ReplayRow]) -> ReplayRow | None:
    """The replay row of the smallest budget found that meets ``target``; None when even the
    whole working set does not."""
    def replay(fraction: float) -> ReplayRow:
        row = replay_model(trace, [policy], [fraction])[0]
        probes.append(row)
        return row

    best = replay(1.0)
    if best.hit_rate < target:
        return None
    low = replay(LOWEST_FRACTION)
    if low.hit_rate >= target:
        return low
    lo, hi = math.log(LOWEST_FRACTION), 0.0            # lo misses, hi meets
    while hi - lo > math.log1p(RESOLUTION):
        mid = replay(math.exp((lo + hi) / 2))
        if mid.hit_rate >= target:
            hi, best = (lo + hi) / 2, mid
        else:
            lo = (lo + hi) / 2
    return best

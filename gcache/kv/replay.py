"""Trace replay: token hit rate per store policy and budget, against the in-process model.

A request is replayed as an engine with GCache as its L3 would serve it: look its prompt up
(window-safe hits only), count the hit tokens, then save the prompt's full pages and the tails
the policy picks. The budget is a fraction of the *full-layer working set*: every distinct page
of the replayed requests at full-layer size, so the baseline holds everything at 1.0. Rows carry
the hit rate (hit tokens over input tokens), the bytes each policy wrote and their ratio to what
full-layer storage wrote at the same budget.

Beside the policies, a row ``optimal`` per budget: the most any eviction and tail placement could
hit with the whole future known (``gcache.kv.optimal``: exact where every hit fits, an upper
bound otherwise), and each policy's ``of_optimal``, its hit rate over that row's. Model rows also
carry ``unreachable_share``: bytes held that could not hit because a page of their prefix was
gone, over bytes held, summed over every lookup of the replay.

The real-cluster replay (``gcache replay --cluster``) lives in ``gcache.cli.replay``; it starts
servers, which this layer must not do.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace

from gcache.errors import MissingDependency
from gcache.kv.layout import ModelLayout
from gcache.kv.optimal import OptimalBound, optimal_bound, residencies
from gcache.kv.page_keys import namespace, page_hashes
from gcache.kv.policy import DEFAULT_POLICY, policy_from_name
from gcache.kv.replay_model import StoreModel
from gcache.kv.trace import TraceRequest, iter_tokens

DEFAULT_BUDGETS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
DEFAULT_POLICIES = ("full-layer", "tail", "checkpoint-4", "checkpoint-16", "adaptive")
OPTIMAL = "optimal"            # the policy name of the offline-optimal rows
CLUSTER_SAMPLE_EVERY = 50      # requests between two readings of what a cluster's servers hold
# How each source's unreachable share was measured (the model's rows for the cluster's subset
# of the trace are "model-subset")
UNREACHABLE_MEASURED = {
    "cluster": f"(what the servers' sweeps found, read every {CLUSTER_SAMPLE_EVERY} requests; "
               "a server counts only parents it owns)",
}
MODEL_UNREACHABLE = "(over all lookups)"


@dataclass(frozen=True, slots=True)
class ReplayRow:
    policy: str
    budget_fraction: float
    hit_rate: float            # window-safe hit tokens / input tokens
    stored_bytes: int          # bytes the policy wrote over the replay (at model scale)
    storage_ratio: float       # stored_bytes / full-layer's stored_bytes at this budget
    is_default: bool
    source: str                # "model" or "cluster"
    requests: int
    of_optimal: float | None = None         # hit_rate / the optimal row's (None: no such row)
    unreachable_share: float | None = None  # held bytes that could not hit / held bytes


@dataclass(frozen=True, slots=True)
class PreparedTrace:
    """A trace's requests with their page hashes, computed once for every policy and budget."""

    layout: ModelLayout
    requests: tuple[TraceRequest, ...]
    hashes: tuple[list[bytes], ...]
    input_tokens: int
    working_set_bytes: int     # distinct pages × full-layer page bytes

    def budget_bytes(self, fraction: float) -> int:
        return int(fraction * self.working_set_bytes)


def prepare(requests: Sequence[TraceRequest], layout: ModelLayout) -> PreparedTrace:
    root = namespace(layout.fingerprint())
    hashes = tuple(page_hashes(tokens, layout.page_size, root)
                   for _, tokens in iter_tokens(list(requests), layout.page_size))
    distinct = len({h for hs in hashes for h in hs})
    return PreparedTrace(layout, tuple(requests), hashes,
                         sum(r.input_length for r in requests),
                         distinct * layout.all_layers_page_bytes())


def replay_model(trace: PreparedTrace, policies: Iterable[str] = DEFAULT_POLICIES,
                 budgets: Iterable[float] = DEFAULT_BUDGETS) -> list[ReplayRow]:
    """One row per policy and budget, from the in-process model."""
    rows = []
    for budget in budgets:
        results, unreachable = {}, {}
        for name in policies:
            model = StoreModel(trace.layout, policy_from_name(name), trace.budget_bytes(budget))
            hit_pages = sum(model.request(hashes).hit_pages for hashes in trace.hashes)
            results[name] = (hit_pages * trace.layout.page_size / trace.input_tokens,
                             model.stored_bytes)
            unreachable[name] = model.unreachable_share
        rows += rows_for_budget(budget, results, source="model", requests=len(trace.requests),
                                unreachable=unreachable)
    return rows


def rows_for_budget(budget: float, results: dict[str, tuple[float, int]], *, source: str,
                    requests: int, unreachable: dict[str, float] | None = None
                    ) -> list[ReplayRow]:
    """Rows of one budget from ``{policy: (hit_rate, stored_bytes)}`` and, where measured,
    ``{policy: unreachable share}``."""
    baseline = results.get("full-layer", (0.0, 0))[1]
    shares = unreachable or {}
    return [ReplayRow(policy=name, budget_fraction=budget, hit_rate=round(hit, 6),
                      stored_bytes=stored,
                      storage_ratio=round(stored / baseline, 6) if baseline else 0.0,
                      is_default=name == DEFAULT_POLICY, source=source, requests=requests,
                      unreachable_share=round(shares[name], 6) if name in shares else None)
            for name, (hit, stored) in results.items()]


def optimal_bounds(trace: PreparedTrace, budgets: Iterable[float]) -> dict[float, OptimalBound]:
    """The offline optimum of ``trace`` (or bounds on it) at each budget, in pages.

    A tail is charged at most what full-layer storage adds to a page for the SWA layers, so
    the bound holds for every policy, full-layer storage included (``gcache.kv.optimal``).
    """
    layout = trace.layout
    page = layout.full_page_bytes()
    swa_page = layout.all_layers_page_bytes() - page
    res = residencies(trace.hashes)
    return {b: optimal_bound(res, page_bytes=page,
                             tail_bytes=lambda k: min(layout.tail_bytes(k), swa_page),
                             budget_bytes=trace.budget_bytes(b)) for b in budgets}


def with_optimal(rows: Sequence[ReplayRow], trace: PreparedTrace,
                 bounds: dict[float, OptimalBound], *, source: str) -> list[ReplayRow]:
    """``rows`` with ``of_optimal`` set on those of ``source``, and one ``optimal`` row per
    budget of ``bounds`` added after that source's rows."""
    rate = {b: round(bound.bound_pages * trace.layout.page_size / trace.input_tokens, 6)
            for b, bound in bounds.items()}     # rounded as the policies' rates are
    out = [replace(r, of_optimal=round(r.hit_rate / rate[r.budget_fraction], 6)
                   if rate[r.budget_fraction] else None)
           if r.source == source and r.budget_fraction in rate else r for r in rows]
    last = max((i for i, r in enumerate(out) if r.source == source), default=len(out) - 1)
    optimal = [ReplayRow(policy=OPTIMAL, budget_fraction=b, hit_rate=rate[b],
                         stored_bytes=0, storage_ratio=0.0, is_default=False, source=source,
                         requests=len(trace.requests), of_optimal=1.0 if rate[b] else None)
               for b in bounds]
    return out[:last + 1] + optimal + out[last + 1:]


def format_table(rows: Sequence[ReplayRow]) -> str:
    """Hit rate per policy (rows) and budget (columns), one block per source; where the rows
    carry them, their fraction of the optimal row and their unreachable share."""
    lines = []
    for source in dict.fromkeys(r.source for r in rows):
        chosen = [r for r in rows if r.source == source]
        budgets = sorted({r.budget_fraction for r in chosen})
        policies = list(dict.fromkeys(r.policy for r in chosen))
        cell = {(r.policy, r.budget_fraction): r for r in chosen}
        lines.append(f"{source} ({chosen[0].requests} requests): token hit rate by budget "
                     "(fraction of the full-layer working set)")
        header = f"{'policy':<16}" + "".join(f"{b:>9.1%}" if b < 0.01 else f"{b:>9.0%}"
                                             for b in budgets)
        lines.append(header + f"{'bytes vs full-layer':>22}")
        for p in policies:
            mark = " *" if p == DEFAULT_POLICY else ""
            ratio = cell.get((p, budgets[-1]))
            lines.append(f"{p + mark:<16}" + _cells(cell, p, budgets, "hit_rate", "{:>9.4f}")
                         + ("" if ratio is None else f"{'-':>22}" if p == OPTIMAL
                            else f"{ratio.storage_ratio:>22.3f}"))
        for field, title, fmt in (
                ("of_optimal", "hit rate / optimal", "{:>9.3f}"),
                ("unreachable_share", "unreachable: share of held bytes behind a missing "
                 "page of their prefix " + UNREACHABLE_MEASURED.get(source, MODEL_UNREACHABLE),
                 "{:>9.1%}")):
            shown = [p for p in policies if p != OPTIMAL and any(
                getattr(r, field) is not None for r in chosen if r.policy == p)]
            if shown:
                lines.append(title)
                lines += [f"{p:<16}" + _cells(cell, p, budgets, field, fmt) for p in shown]
        lines.append("")
    lines.append("* default policy; bytes vs full-layer at the largest budget")
    if any(r.policy == OPTIMAL for r in rows):
        lines.append("optimal: no eviction or tail placement hits more at that budget, the whole "
                     "future known (gcache.kv.optimal)")
    return "\n".join(lines)


def _cells(cell: dict[tuple[str, float], ReplayRow], policy: str, budgets: Sequence[float],
           field: str, fmt: str) -> str:
    values = [getattr(cell[(policy, b)], field) if (policy, b) in cell else None
              for b in budgets]
    return "".join(f"{'-':>9}" if v is None else fmt.format(v) for v in values)


def write_json(rows: Sequence[ReplayRow], path: str, **meta: object) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1)
        f.write("\n")


def plot_curves(rows: Sequence[ReplayRow], path: str, *, title: str) -> None:
    """Hit rate versus budget per policy as a PNG (matplotlib, imported only here)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependency("--plot needs matplotlib: pip install 'gcache[plot]'") from exc
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for source, style in (("model", "-o"), ("cluster", "x")):
        for policy in dict.fromkeys(r.policy for r in rows if r.source == source):
            points = sorted((r.budget_fraction, r.hit_rate) for r in rows
                            if r.source == source and r.policy == policy)
            label = policy + (" (default)" if policy == DEFAULT_POLICY else "")
            line = "k--" if policy == OPTIMAL else style
            ax.plot(*zip(*points), line, label=label if source == "model" else
                    f"{label}, real cluster", markersize=4 if source == "model" else 9)
    ax.set_xscale("log")
    ax.set_xlabel("budget (fraction of the full-layer working set)")
    ax.set_ylabel("token hit rate (window-safe)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

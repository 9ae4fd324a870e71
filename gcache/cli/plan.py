"""``gcache plan``: memory and NVMe per host, and the policy, that reach a hit-rate target.

Replays a trace (the replay's format, or an engine's request log converted to it) through the
in-process model (``gcache.kv.plan``) and prints the answer; ``--plot`` draws every policy's
curve and the offline optimum over a grid of budgets and the chosen one, ``--json`` writes the
plan and every replay its search ran.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from gcache.cli.replay import DEFAULT_TRACE
from gcache.config import format_size, parse_size
from gcache.errors import InvalidRequest
from gcache.kv import ModelLayout
from gcache.kv.plan import DISK_HEADROOM, plan
from gcache.kv.replay import (
    DEFAULT_BUDGETS,
    DEFAULT_POLICIES,
    optimal_bounds,
    plot_curves,
    prepare,
    replay_model,
    with_optimal,
)
from gcache.kv.trace import BLOCK_SIZE, read_trace

PLOT_BUDGETS = (0.002, 0.005, 0.01, *DEFAULT_BUDGETS)   # the curves' points, and the answer's


def run(args: argparse.Namespace) -> int:
    layout = ModelLayout.from_config(args.model, page_size=BLOCK_SIZE)
    trace = prepare(read_trace(args.trace, limit=args.limit), layout)
    try:
        found = plan(trace, target=args.target, hosts=args.hosts,
                     host_memory_bytes=parse_size(args.host_memory),
                     policies=args.policies.split(","))
    except InvalidRequest as exc:
        print(f"gcache plan: {exc}", file=sys.stderr)
        return 2
    print(f"gcache plan: {len(trace.requests)} requests of {args.trace}, model {layout.model}, "
          f"full-layer working set {format_size(trace.working_set_bytes)}")
    print(f"gcache plan: policy {found.policy} reaches a token hit rate of {found.hit_rate:.4f} "
          f"(target {found.target}) at {found.budget_fraction:.2%} of the working set: "
          f"{format_size(found.capacity_bytes)} for the cluster")
    print(f"gcache plan: per host of {found.hosts}: memory = "
          f"{format_size(found.memory_per_host_bytes)} (hot tier), disk_capacity = "
          f"{format_size(found.disk_per_host_bytes)} (cold tier, {DISK_HEADROOM:.0%} over what "
          "it holds)" if found.disk_per_host_bytes else
          f"gcache plan: per host of {found.hosts}: memory = "
          f"{format_size(found.memory_per_host_bytes)} (hot tier); no cold tier needed")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({**asdict(found), "probes": [asdict(r) for r in found.probes]}, fh,
                      indent=1)
        print(f"gcache plan: wrote {args.json}")
    if args.plot:
        grid = sorted({*PLOT_BUDGETS, found.budget_fraction})
        rows = with_optimal(replay_model(trace, args.policies.split(","), grid), trace,
                            optimal_bounds(trace, grid), source="model")
        plot_curves(rows, args.plot, title=f"{layout.model}: hit rate against budget "
                    f"(target {found.target}: {found.policy} at {found.budget_fraction:.2%})")
        print(f"gcache plan: wrote {args.plot}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("plan", help="memory and NVMe per host, and the policy, that reach a "
                                      "hit-rate target on a trace")
    cmd.add_argument("--target", type=float, required=True, help="token hit rate, e.g. 0.35")
    cmd.add_argument("--hosts", type=int, required=True, help="GCache servers (one per host)")
    cmd.add_argument("--host-memory", default="64GiB",
                     help="RAM per host for the hot tier; the rest goes to NVMe")
    cmd.add_argument("--trace", default=DEFAULT_TRACE, help="JSONL trace (Mooncake format)")
    cmd.add_argument("--model", default="mimo-v2.5-pro",
                     help="config.json path or a shipped config name")
    cmd.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    cmd.add_argument("--limit", type=int, help="plan on the first N requests only")
    cmd.add_argument("--json", help="write the plan and every replay it ran here")
    cmd.add_argument("--plot", help="draw the curves the search measured as a PNG here")
    cmd.set_defaults(run=run)

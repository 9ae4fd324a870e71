"""``gcache replay``: a Mooncake-format trace against the in-process model and a real cluster.

The model run covers the whole trace (or ``--limit``). ``--cluster`` replays the first
``--cluster-requests`` requests through ``KVStore`` on real ``gcache-server`` processes, one fresh
cluster per policy and budget, with every value scaled down by ``--scale`` (the layout's bytes
per token divided, ratios kept) so that the budgets fit in this machine's memory; it replays the
same requests in the model too, so the two columns compare like with like.

Every source gets an ``optimal`` row (``gcache.kv.optimal``) for the same requests and budgets,
and its rows their fraction of it; where the optimum is not computed exactly, the line after the
table gives the hit rate an offline schedule reaches, so the optimum lies between the two.

The cluster's budget is its arena: ``budget × working set / scale`` of value bytes split over
the servers, in segments small enough that first-in-first-out reclaims at a fine grain. The
arena also holds each object's record header and key, which the model does not count; the arena
is enlarged by exactly that for a page object (``gcache.record_layout.record_size``, the
layout the server fills), so both hold the same value bytes and the comparison measures the
model, not our header size.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from gcache.kv import KVStore, ModelLayout
from gcache.kv.optimal import OptimalBound
from gcache.kv.replay import (
    CLUSTER_SAMPLE_EVERY,
    DEFAULT_BUDGETS,
    DEFAULT_POLICIES,
    OPTIMAL,
    PreparedTrace,
    ReplayRow,
    format_table,
    optimal_bounds,
    plot_curves,
    prepare,
    replay_model,
    rows_for_budget,
    with_optimal,
    write_json,
)
from gcache.kv.suite import NAMES, trace_requests
from gcache.kv.trace import BLOCK_SIZE, iter_tokens

if TYPE_CHECKING:
    from gcache.sdk import Client

DEFAULT_TRACE = "data/traces/conversation_trace.jsonl"
MIN_SEGMENT_BYTES = 64 << 10


class ZeroKV:
    """A ``KVSource`` of the right sizes, and a ``KVSink`` that keeps nothing: a replay
    measures hits, not contents."""

    def __init__(self, layout: ModelLayout) -> None:
        self.layout = layout
        most = max(layout.full.bytes_per_token, layout.swa.bytes_per_token)
        self._zeros = memoryview(bytes(most * max(layout.page_size, layout.window)))

    def read(self, layer: int, start: int, stop: int) -> memoryview:
        return self._zeros[:(stop - start) * self.layout.layer_bytes_per_token(layer)]

    def write_target(self, layer: int, start: int, stop: int) -> memoryview:
        return memoryview(bytearray((stop - start) * self.layout.layer_bytes_per_token(layer)))


def arena_for_budget(trace: PreparedTrace, scale: int, budget: float,
                     servers: int) -> tuple[int, int]:
    """(arena bytes, segment bytes) per server so that ``servers`` arenas hold ``budget`` of
    ``trace``'s full-layer working set, at 1/``scale``, in value bytes."""
    from gcache.kv.page_keys import page_key
    from gcache.record_layout import record_size

    layout = trace.layout.scaled(scale)
    page_object = layout.full.bytes_per_token * layout.page_size
    per_object = record_size(len(page_key(bytes(16), layout.num_layers - 1)), page_object)
    values = trace.budget_bytes(budget) // scale // servers
    per_server = max(2 * MIN_SEGMENT_BYTES, values * per_object // page_object)
    segment = max(MIN_SEGMENT_BYTES, 1 << int(math.log2(max(1, per_server // 256))))
    return max(2, per_server // segment) * segment, segment


SWEEP_S = 0.5           # the servers' unreachable sweep during a replay (10 s by default)


class ServersHeld:
    """What the servers hold, read every ``CLUSTER_SAMPLE_EVERY`` requests: the bytes in memory and
    those their last sweep found behind a missing parent (STAT's ``tier``)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.bytes = self.unreachable_bytes = 0

    def sample(self) -> None:
        for stats in self.client.server_stats().values():
            if stats is not None:
                self.bytes += stats["tier"]["bytes"]
                self.unreachable_bytes += stats["tier"]["unreachable_bytes"]

    @property
    def unreachable_share(self) -> float:
        return self.unreachable_bytes / self.bytes if self.bytes else 0.0


def replay_cluster(trace: PreparedTrace, scale: int, policies: list[str], budgets: list[float],
                   *, servers: int, log: Callable[[str], object] = print) -> list[ReplayRow]:
    """Rows measured on real servers for the requests of ``trace``."""
    from gcache.cli.local_cluster import LocalCluster
    from gcache.sdk import Client

    layout = trace.layout.scaled(scale)
    token_lists = [tokens[:len(h) * layout.page_size]
                   for (_, tokens), h in zip(iter_tokens(list(trace.requests)), trace.hashes)]
    rows = []
    for budget in budgets:
        memory, segment = arena_for_budget(trace, scale, budget, servers)
        results: dict[str, tuple[float, int]] = {}
        unreachable: dict[str, float] = {}
        for name in policies:
            started = time.monotonic()
            with LocalCluster(servers, memory=str(memory),
                              server_args=("--segment-size", str(segment),
                                           "--unreachable-sweep", str(SWEEP_S))) as cluster, \
                    Client(cluster.addresses, timeout_s=2.0) as client, \
                    KVStore(client, layout, policy=name, pressure_poll_s=0.0) as store:
                source, hits, stored = ZeroKV(layout), 0, 0
                held = ServersHeld(client)
                for n, tokens in enumerate(token_lists):
                    probe = store.probe(tokens)
                    hits += probe.hit_tokens
                    if probe.hit_tokens:        # an engine loads what it hits: a read
                        store.load(tokens, probe.hit_tokens, source).wait(timeout_s=30.0)
                    stored += store.save(tokens, source, probe=probe).bytes_written
                    if n % CLUSTER_SAMPLE_EVERY == CLUSTER_SAMPLE_EVERY - 1:
                        held.sample()
            results[name] = (hits / trace.input_tokens, stored * scale)
            unreachable[name] = held.unreachable_share
            log(f"  cluster {name:<14} budget {budget:>5.0%}: hit rate "
                f"{results[name][0]:.4f}, unreachable {unreachable[name]:.1%} "
                f"({time.monotonic() - started:.1f} s, "
                f"{servers} × {memory / 2**20:.1f} MiB arenas)")
        rows += rows_for_budget(budget, results, source="cluster",
                                requests=len(trace.requests), unreachable=unreachable)
    return rows


def timed_bounds(trace: PreparedTrace,
                 budgets: list[float]) -> tuple[dict[float, OptimalBound], float]:
    """``optimal_bounds`` and the seconds they took."""
    started = time.monotonic()
    bounds = optimal_bounds(trace, budgets)
    return bounds, time.monotonic() - started


def optimal_meta(trace: PreparedTrace, bounds: dict[float, OptimalBound],
                 seconds: float) -> dict[str, object]:
    """The optimal rows' bounds per budget, for the JSON's meta."""
    tokens = trace.layout.page_size / trace.input_tokens
    return {"seconds": round(seconds, 1), "budgets": [
        {"budget_fraction": b, "hit_rate": round(o.bound_pages * tokens, 6),
         "achieved_hit_rate": round(o.achieved_pages * tokens, 6), "exact": o.exact,
         "bound_pages": o.bound_pages, "achieved_pages": o.achieved_pages,
         "every_hit_fraction": round(o.peak_bytes / trace.working_set_bytes, 6)}
        for b, o in bounds.items()]}


def describe(trace: PreparedTrace, bounds: dict[float, OptimalBound]) -> str:
    """One line on the optimal rows: where they are exact, the bracket where they are not."""
    tokens = trace.layout.page_size / trace.input_tokens
    exact = [f"{b:.1%}" for b, o in bounds.items() if o.exact]
    parts = [f"exact at {', '.join(exact)}"] if exact else []
    parts += [f"at {b:.1%} between {o.achieved_pages * tokens:.4f} (an offline schedule) and "
              f"{o.bound_pages * tokens:.4f}, {o.bound_pages - o.achieved_pages} pages apart"
              for b, o in bounds.items() if not o.exact]
    peak = max((o.peak_bytes for o in bounds.values()), default=0)
    parts.append(f"every hit fits in {peak / trace.working_set_bytes:.3%} of the working set")
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    layout = ModelLayout.from_config(args.model, page_size=BLOCK_SIZE)
    budgets = [float(b) for b in args.budgets.split(",")]
    policies = args.policies.split(",")
    bad = [b for b in budgets if not 0 < b <= 1]
    if bad:
        print(f"gcache replay: --budgets {bad} must be fractions in (0, 1]", file=sys.stderr)
        return 2
    if args.suite:
        from gcache.cli.replay_suite import run_suite

        return run_suite(args, layout, policies, budgets)
    started = time.monotonic()
    requests = trace_requests(args.trace, limit=args.limit)
    full = prepare(requests, layout)
    print(f"gcache replay: {len(requests)} requests, {full.input_tokens} input tokens, "
          f"model {layout.model} ({len(layout.full_layers)} full + {len(layout.swa_layers)} "
          f"sliding layers, W={layout.window}, page {layout.page_size}), full-layer working "
          f"set {full.working_set_bytes / 2**40:.2f} TiB")
    bounds, seconds = timed_bounds(full, budgets)
    rows = with_optimal(replay_model(full, policies, budgets), full, bounds, source="model")
    optima = {"model": (full, bounds, seconds)}
    if args.cluster:
        subset = prepare(requests[:args.cluster_requests], layout)
        cluster_budgets = [float(b) for b in args.cluster_budgets.split(",")]
        print(f"gcache replay: real cluster, first {len(subset.requests)} requests, values "
              f"scaled 1/{args.scale}")
        model_rows = replay_model(subset, policies, cluster_budgets)
        cluster_rows = replay_cluster(subset, args.scale, policies, cluster_budgets,
                                      servers=args.servers)
        worst = max(abs(c.hit_rate - m.hit_rate) for c, m in zip(cluster_rows, model_rows))
        subset_bounds, seconds = timed_bounds(subset, cluster_budgets)
        rows += with_optimal([replace(r, source="model-subset") for r in model_rows], subset,
                             subset_bounds, source="model-subset")
        rows += [r for r in with_optimal(cluster_rows, subset, subset_bounds, source="cluster")
                 if r.policy != OPTIMAL]       # the model-subset's optimal row serves both
        optima["model-subset"] = (subset, subset_bounds, seconds)
        print(f"gcache replay: largest model/cluster difference {worst * 100:.2f} points")
    print(format_table(rows))
    for source, (trace, found, seconds) in optima.items():
        print(f"gcache replay: {source} optimal ({seconds:.1f} s): {describe(trace, found)}")
    meta = {"trace": args.trace, "model": layout.model, "requests": len(requests),
            "page_size": layout.page_size, "window": layout.window,
            "working_set_bytes": full.working_set_bytes, "scale": args.scale,
            "optimal": {source: optimal_meta(*optimum) for source, optimum in optima.items()},
            "date": time.strftime("%Y-%m-%d"), "seconds": round(time.monotonic() - started, 1)}
    if args.out:
        write_json(rows, args.out, **meta)
        print(f"gcache replay: wrote {args.out}")
    if args.plot:
        plot_curves([r for r in rows if r.source in ("model", "cluster")], args.plot,
                    title=f"{layout.model}, {len(requests)} requests of "
                          f"{os.path.basename(args.trace)}")
        print(f"gcache replay: wrote {args.plot}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("replay", help="replay a Mooncake-format trace: hit rate per policy")
    cmd.add_argument("--trace", default=DEFAULT_TRACE,
                     help=f"JSONL trace (Mooncake format), or a suite trace: {', '.join(NAMES)}")
    cmd.add_argument("--suite", nargs="?", const=",".join(NAMES), metavar="NAMES",
                     help="replay every trace of the suite (or those named, comma-separated) "
                          "and print default against optimal per budget per trace")
    cmd.add_argument("--model", default="mimo-v2.5-pro",
                     help="config.json path or a shipped config name")
    cmd.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)),
                     help="fractions of the full-layer working set")
    cmd.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    cmd.add_argument("--limit", type=int, help="replay only the first N requests")
    cmd.add_argument("--cluster", action="store_true", help="also replay on a real local cluster")
    cmd.add_argument("--cluster-requests", type=int, default=1000)
    cmd.add_argument("--cluster-budgets", default="0.02,0.05,0.1")
    cmd.add_argument("--scale", type=int, default=512, help="value size divisor for --cluster")
    cmd.add_argument("--servers", type=int, default=2)
    cmd.add_argument("--out", help="write rows as JSON here")
    cmd.add_argument("--plot", help="draw hit rate versus budget as a PNG here")
    cmd.set_defaults(run=run)

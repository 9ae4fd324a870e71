"""Routing simulator (issue 20): which engine instance each request of a trace goes to, and
what that does to cache hits, time to first token and load balance.

A seeded discrete-event simulation in virtual time (reruns are byte-identical) replays a
Mooncake-format trace (``data/traces/conversation_trace.jsonl``: ``timestamp`` ms,
``input_length``, ``output_length``, ``hash_ids`` of 512-token blocks) in two variants:
``plain``, and ``long``, where every input is 8 times longer and each block becomes 8
sub-blocks, so that all three length buckets (0-64K, 64K-256K, 256K-1M tokens) fill; caches are
8 times bigger there too, so both variants meet the same cache pressure. Arrivals are sped up so
that the offered load, the no-cache prefill work plus the decode work over the ranks' capacity,
is ``--load`` in both.

Engine model (research/router.md §6.2). ``--instances`` instances of ``--ranks`` DP-attention
ranks step in lockstep: a step lasts as long as its slowest rank, idle ranks wait. Per rank and
step every running decode advances one token, and up to ``CHUNK_TOKENS`` prefill tokens are
taken first come first served from the rank's queue (an instance puts a request on the rank with
the fewest queued tokens). Computing ``c`` tokens at context offset ``L`` costs
``a·c + b·c·(L + c/2)`` seconds, decoding ``n`` sequences over ``kv`` tokens
``n·decode_seq_s + kv·decode_kv_s``, and every step ``step_s`` more. Each instance has a GPU
cache and a bigger host cache, both LRU over blocks and written through (so the host holds what
the GPU holds); one GCache tier is shared by all and written by every instance as its chunks
complete. A block hits only if every block before it hits (in any tier), and the last token is
always computed. Host and GCache hits are loaded over the instance's host and network link, one
load at a time per link (bytes per token from the MiMo-V2.5 layout: full-attention pages, plus
one sliding-window tail), and the request joins a rank's queue when its loads land. Not
modelled: preemption, KV admission limits, pinning, caches split per rank, router staleness.

Policies, each with and without buckets. Baselines see the true cache contents (router.md
§6.3's "precise" view) and router-local load, always fresh. ``round_robin``; ``least_loaded``:
fewest queued prefill tokens; ``sglang_cache_aware``: SGLang's imbalance gate on in-flight
requests (abs 64, rel 1.5), else the deepest match over 30% of the prompt, else the fewest in
flight; ``dynamo_cost``: ``max(P + n - overlap, 0) + D`` in blocks, credit 1 for the GPU, 0.75
for the host; ``ours``: ``gcache.router.policy.route`` over every instance, fed its true GPU
and host hits, queued prefill tokens and running decodes, and GCache's own hit.

Buckets. Every policy buckets a request by its uncached length (its prompt less the longest hit
on any instance or in GCache); ``ours`` does so itself and may leave its pool, baselines stay in
the pool (the nearest filled one when its own is empty). Pools get instances in proportion to
their bucket's prefill work in the trace (estimated with an infinite cache's hits), at least one
for each bucket with requests.

Reported per run: token hit rate (every tier; GPU alone too), TTFT p50 and p99 overall and for
requests under 64K tokens, max/mean load (instance work, i.e. busy time less each step's fixed
cost, per 10 s window: the sum over windows of the busiest instance's work over the sum of the
mean's), throughput (input and output tokens over first arrival to last completion). Prints a
Markdown table and whether issue 20's targets hold, computed and never asserted. ``--out``
writes the rows as JSON, ``--results`` the report to ``bench/results/routing-latest.json``,
``--plot`` a PNG of short-request TTFT p99 against hit rate.
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import hashlib
import heapq
import json
import math
import operator
import os
import random
import sys
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

from gcache.errors import ConfigError, InvalidRequest
from gcache.kv.layout import ModelLayout
from gcache.kv.suite import trace_requests

BLOCK_TOKENS = 512                      # tokens per trace hash id
BOUNDS = (65_536, 262_144, 1_048_576)   # upper ends of the three buckets, tokens
STRETCH = 8                             # the long variant's length factor
CHUNK_TOKENS = 16_384                   # prefill tokens per rank and step (MiMo's chunk)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "data", "traces", "conversation_trace.jsonl")
POLICIES = ("round_robin", "least_loaded", "sglang_cache_aware", "dynamo_cost", "ours")
CACHE_AWARE = ("sglang_cache_aware", "dynamo_cost")
SGLANG_THRESHOLD = 0.3                  # SGLang --cache-threshold
SGLANG_ABS, SGLANG_REL = 64, 1.5        # SGLang --balance-abs/rel-threshold
DYNAMO_HOST_CREDIT = 0.75               # Dynamo --router-host-cache-hit-weight


@dataclass(frozen=True, slots=True)
class SimConfig:
    instances: int = 8                  # engine instances
    ranks: int = 4                      # DP-attention ranks per instance, in lockstep
    rank_tokens_per_s: float = 20_000   # prefill throughput of one rank at context 0
    slowdown_128k: float = 0.5          # throughput at 128K context / at 0 (hybrid SWA model)
    step_s: float = 0.008               # fixed cost of every step (weights, launch)
    decode_seq_s: float = 5e-5          # per running decode per step
    decode_kv_s: float = 2.5e-9         # per KV token of running decodes per step
    gpu_tokens: int = 1 << 20           # GPU prefix cache per instance (plain; x8 for long)
    host_tokens: int = 4 << 20          # host cache per instance (plain; x8 for long)
    gcache_tokens: int = 32 << 20       # the shared GCache tier (plain; x8 for long)
    host_gbps: float = 50.0             # host -> GPU link per instance, GB/s
    gcache_gbps: float = 12.5           # GCache -> GPU link per instance, GB/s
    load: float = 0.85                  # offered load: no-cache work / capacity
    seed: int = 0                       # tie-breaks between equal candidates

    def __post_init__(self) -> None:
        for key in ("instances", "ranks", "gpu_tokens", "host_tokens", "gcache_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(key, getattr(self, key), "must be at least 1")
        if not 0 < self.slowdown_128k <= 1:
            raise ConfigError("slowdown_128k", self.slowdown_128k, "must be in (0, 1]")
        if self.load <= 0:
            raise ConfigError("load", self.load, "must be positive")

    @property
    def a(self) -> float:               # seconds per prefill token at context 0
        return 1.0 / self.rank_tokens_per_s

    @property
    def b(self) -> float:               # seconds per token per token of context
        return self.a * (1.0 / self.slowdown_128k - 1.0) / 131_072

    def prefill_s(self, start: int, tokens: int) -> float:
        return tokens * (self.a + self.b * (start + tokens / 2))


@dataclass(frozen=True, slots=True)
class Job:
    """One trace request after the variant's transform."""

    arrival_ms: int
    tokens: int
    output: int                         # output tokens, at least 1 (the first comes of prefill)
    blocks: tuple[int, ...]             # ids of its full blocks, prefix order
    cap: int                            # blocks that may hit: the last token is always computed


def read_jobs(path: str, limit: int | None, stretch: int) -> list[Job]:
    """The trace's requests (read as the replay reads them, ``gcache.kv.trace``), ``limit`` at
    most, lengths and blocks stretched. Raises ``ConfigError`` naming a malformed line."""
    jobs = []
    for request in trace_requests(path, limit=limit):
        tokens = request.input_length * stretch
        blocks = tuple(h * stretch + j for h in request.hash_ids for j in range(stretch))
        blocks = blocks[:tokens // BLOCK_TOKENS]
        jobs.append(Job(request.timestamp_ms, tokens, max(1, request.output_length), blocks,
                        min(len(blocks), (tokens - 1) // BLOCK_TOKENS)))
    return jobs


def bucket_of(tokens: int) -> int:
    """Bucket ``k`` holds ``BOUNDS[k-1] <= tokens < BOUNDS[k]``, as ``gcache.router.buckets``."""
    return bisect.bisect_right(BOUNDS, tokens)


def partition(jobs: list[Job], hits: list[int], cfg: SimConfig) -> list[int]:
    """Bucket of each instance. A request's bucket is its uncached length's, estimated here with
    ``hits`` (an infinite cache's); every bucket with requests gets one instance, and each next
    instance goes to the pool with the most prefill work per instance, so pools are as evenly
    loaded as whole instances allow. Raises ``ConfigError`` for fewer instances than buckets
    with requests."""
    work = [0.0] * len(BOUNDS)
    for job, hit in zip(jobs, hits):
        work[bucket_of(job.tokens - hit)] += cfg.prefill_s(hit, job.tokens - hit) + \
            decode_s(job, cfg)
    counts = [1 if w > 0 else 0 for w in work]
    if sum(counts) > cfg.instances:
        raise ConfigError("instances", cfg.instances, f"needs one per filled bucket ({counts})")
    while sum(counts) < cfg.instances:
        counts[max((k for k in range(len(work)) if counts[k]),
                   key=lambda k: work[k] / counts[k])] += 1
    return [k for k, n in enumerate(counts) for _ in range(n)]


def decode_s(job: Job, cfg: SimConfig) -> float:
    """Rank seconds of a job's decode steps after its first token (its share of each step)."""
    return (job.output - 1) * (cfg.decode_seq_s + cfg.decode_kv_s * (job.tokens + job.output / 2))


def speedup_for(jobs: list[Job], cfg: SimConfig) -> float:
    """Arrival speed-up that makes no-cache prefill plus decode work ``cfg.load`` of capacity."""
    demand_s = sum(cfg.prefill_s(0, j.tokens) + decode_s(j, cfg) for j in jobs)
    span_s = (max(j.arrival_ms for j in jobs) - min(j.arrival_ms for j in jobs)) / 1000
    return cfg.load * span_s * cfg.instances * cfg.ranks / demand_s if span_s > 0 else 1.0


def bound_hits(jobs: list[Job]) -> list[int]:
    """Each request's hit tokens in one infinite cache: the ceiling for every policy
    (router.md §6.6)."""
    seen: set[int] = set()
    hits = []
    for job in jobs:
        n = 0
        while n < job.cap and job.blocks[n] in seen:
            n += 1
        hits.append(n * BLOCK_TOKENS)
        seen.update(job.blocks)
    return hits


class Lru:
    """Blocks, least recently used first. Chains are touched deepest block first, so a chain's
    head outlives its tail, as a radix cache evicts leaves first."""

    __slots__ = ("capacity", "items")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.items: OrderedDict[int, None] = OrderedDict()

    def touch(self, blocks) -> None:
        items = self.items
        for block in blocks:
            if block in items:
                items.move_to_end(block)
            else:
                items[block] = None
        while len(items) > self.capacity:
            items.popitem(last=False)


def extent(blocks: tuple[int, ...], i: int, cap: int, tier: OrderedDict,
           other: OrderedDict | None = None) -> int:
    """End of the run of blocks from ``i`` that ``tier`` (or ``other``) holds, ``cap`` at most."""
    if other is None:
        while i < cap and blocks[i] in tier:
            i += 1
    else:
        while i < cap and (blocks[i] in tier or blocks[i] in other):
            i += 1
    return i



class Request:
    __slots__ = ("arrival_s", "done", "end_s", "job", "left", "out_left", "rank", "stored",
                 "ttft_s")

    def __init__(self, job: Job, arrival_s: float) -> None:
        self.job, self.arrival_s = job, arrival_s
        self.done = self.left = self.stored = self.rank = 0   # tokens, tokens, blocks, index
        self.out_left = job.output - 1
        self.ttft_s = self.end_s = -1.0


class Instance:
    __slots__ = ("bucket", "busy", "decodes", "gpu", "host", "host_free_s", "inflight",
                 "inflight_tokens", "kv", "name", "net_free_s", "pending", "plan", "queued",
                 "queues", "segment", "version", "windows", "work_s")

    def __init__(self, index: int, bucket: int, ranks: int, gpu: int, host: int) -> None:
        self.name, self.bucket = f"i{index}", bucket
        self.gpu, self.host = Lru(gpu), Lru(host)
        self.queues: list[deque[Request]] = [deque() for _ in range(ranks)]
        self.queued = [0] * ranks           # prefill tokens waiting, per rank
        self.decodes: list[list[Request]] = [[] for _ in range(ranks)]
        self.kv = [0] * ranks               # KV tokens of the running decodes, per rank
        self.pending = 0                    # prefill tokens routed here, not yet computed
        self.inflight = self.inflight_tokens = 0
        self.host_free_s = self.net_free_s = 0.0
        self.busy, self.version = False, 0
        self.segment: tuple[float, float, int] | None = None   # decode-only (start, dt, steps)
        self.plan: list[tuple[Request, int]] = []
        self.work_s = 0.0
        self.windows: dict[int, float] = {}


ARRIVE, READY, STEP = 0, 1, 2
WINDOW_S = 10.0                             # of virtual time, for the windowed load ratio


class Simulation:
    """One policy, with or without buckets, on one variant's requests; ``run`` gives its row."""

    def __init__(self, jobs: list[Job], cfg: SimConfig, policy: str, buckets: bool,
                 variant: str, scale: int, speedup: float, pools: list[int]) -> None:
        self.jobs, self.cfg, self.speedup = jobs, cfg, speedup
        self.policy, self.buckets, self.variant = policy, buckets, variant
        labels = pools if buckets else [0] * cfg.instances
        self.instances = [Instance(i, labels[i], cfg.ranks,
                                   cfg.gpu_tokens * scale // BLOCK_TOKENS,
                                   cfg.host_tokens * scale // BLOCK_TOKENS)
                          for i in range(cfg.instances)]
        self.pools = {k: [i for i, b in enumerate(labels) if b == k] for k in set(labels)}
        self.gcache = Lru(cfg.gcache_tokens * scale // BLOCK_TOKENS)
        layout = ModelLayout.from_config("mimo-v2.5")
        self.bytes_per_token = layout.full_page_bytes() / layout.page_size
        self.tail_bytes = layout.tail_bytes(-(-layout.window // layout.page_size))
        self.rng = random.Random(cfg.seed)
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.tier_tokens = [0, 0, 0]        # hit tokens served from GPU, host, GCache
        self.finished: list[Request] = []
        self.rejected = 0
        self.reasons: dict[str, int] = {}
        self.pick = Picker(self)

    def push(self, t: float, kind: int, what: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, what))

    def run(self) -> dict:
        first = min(job.arrival_ms for job in self.jobs)
        for job in self.jobs:
            self.push((job.arrival_ms - first) / 1000 / self.speedup, ARRIVE, job)
        while self.events:
            now, _, kind, what = heapq.heappop(self.events)
            if kind == ARRIVE:
                self.arrive(Request(what, now), now)
            elif kind == READY:
                self.enqueue(what[1], what[0], now)
            elif what[1] == what[0].version:            # else a decode run was cut short
                self.end_step(what[0], now)
        return self.row()

    # ---- routing: the policy picks, the instance looks its caches up, loads start ----------

    def arrive(self, req: Request, now: float) -> None:
        index = self.pick(req.job)
        if index is None:
            self.rejected += 1
            return
        inst, job, cfg = self.instances[index], req.job, self.cfg
        g, h = self.local_hits(inst, job)
        x = extent(job.blocks, h, job.cap, self.gcache.items, inst.host.items)
        for k, n in enumerate((g, h - g, x - h)):
            self.tier_tokens[k] += n * BLOCK_TOKENS
        hit = job.blocks[:x][::-1]                  # on the GPU (and host) from now on
        inst.gpu.touch(hit)
        inst.host.touch(hit)
        self.gcache.touch(job.blocks[h:x][::-1])
        req.done, req.stored = x * BLOCK_TOKENS, x
        req.left = job.tokens - req.done
        inst.pending += req.left
        inst.inflight += 1
        inst.inflight_tokens += job.tokens
        ready = now
        if h > g:                                   # the window tail comes with the last page
            size = (h - g) * BLOCK_TOKENS * self.bytes_per_token + (self.tail_bytes * (x == h))
            inst.host_free_s = max(now, inst.host_free_s) + size / (cfg.host_gbps * 1e9)
            ready = inst.host_free_s
        if x > h:
            size = (x - h) * BLOCK_TOKENS * self.bytes_per_token + self.tail_bytes
            inst.net_free_s = max(now, inst.net_free_s) + size / (cfg.gcache_gbps * 1e9)
            ready = max(ready, inst.net_free_s)
        if ready > now:
            self.push(ready, READY, (req, inst))
        else:
            self.enqueue(inst, req, now)

    def local_hits(self, inst: Instance, job: Job) -> tuple[int, int]:
        """Leading blocks of ``job`` on ``inst``'s GPU, and on its GPU or host."""
        g = extent(job.blocks, 0, job.cap, inst.gpu.items)
        return g, extent(job.blocks, g, job.cap, inst.host.items, inst.gpu.items)

    def enqueue(self, inst: Instance, req: Request, now: float) -> None:
        r = min(range(len(inst.queued)), key=inst.queued.__getitem__)
        req.rank = r
        inst.queues[r].append(req)
        inst.queued[r] += req.left
        if not inst.busy:
            self.start_step(inst, now)
        elif inst.segment is not None:              # end a decode-only run after this step
            start, step, steps = inst.segment
            done = min(steps, int((now - start) / step) + 1)
            if done < steps:
                inst.version += 1
                inst.segment = (start, step, done)
                self.push(start + done * step, STEP, (inst, inst.version))

    # ---- engine: lockstep steps; runs of decode-only steps are taken in one event -----------

    def start_step(self, inst: Instance, now: float) -> None:
        cfg = self.cfg
        a, b = cfg.a, cfg.b
        plan: list[tuple[Request, int]] = []
        step = work = 0.0
        for r, queue in enumerate(inst.queues):
            cost, budget = 0.0, CHUNK_TOKENS
            for req in queue:
                c = min(budget, req.left)
                cost += c * (a + b * (req.done + c / 2))
                plan.append((req, c))
                budget -= c
                if not budget:
                    break
            n = len(inst.decodes[r])
            rank_work = cost + (n * cfg.decode_seq_s + inst.kv[r] * cfg.decode_kv_s if n else 0)
            work = max(work, rank_work)
            if cost or n:
                step = max(step, cfg.step_s + rank_work)
        inst.plan = plan
        inst.version += 1
        if not step:
            inst.busy, inst.segment = False, None
            return
        inst.busy = True
        if plan:
            inst.segment = None
            self.add_work(inst, now, now + step, work)
            self.push(now + step, STEP, (inst, inst.version))
        else:
            steps = min(req.out_left for running in inst.decodes for req in running)
            inst.segment = (now, step, steps)
            self.push(now + step * steps, STEP, (inst, inst.version))

    def end_step(self, inst: Instance, now: float) -> None:
        steps = 1
        if inst.segment is not None:
            start, step, steps = inst.segment
            self.add_work(inst, start, now, (step - self.cfg.step_s) * steps)
        for r, running in enumerate(inst.decodes):
            if not running:
                continue
            inst.kv[r] += len(running) * steps
            for req in running:
                req.out_left -= steps
            if any(req.out_left <= 0 for req in running):
                for req in running:
                    if req.out_left <= 0:
                        self.complete(inst, req, now)
                inst.decodes[r] = [req for req in running if req.out_left > 0]
        for req, c in inst.plan:
            self.prefilled(inst, req, c, now)
        self.start_step(inst, now)

    def prefilled(self, inst: Instance, req: Request, c: int, now: float) -> None:
        job = req.job
        req.done += c
        req.left -= c
        inst.pending -= c
        inst.queued[req.rank] -= c
        full = min(req.done // BLOCK_TOKENS, len(job.blocks))
        if full > req.stored:                       # computed blocks become hits for others
            new = job.blocks[req.stored:full][::-1]
            inst.gpu.touch(new)
            inst.host.touch(new)
            self.gcache.touch(new)
            req.stored = full
        if req.left:
            return
        inst.queues[req.rank].popleft()
        req.ttft_s = now - req.arrival_s
        chain = job.blocks[::-1]                    # the whole chain, head most recent
        inst.gpu.touch(chain)
        inst.host.touch(chain)
        if req.out_left > 0:
            inst.decodes[req.rank].append(req)
            inst.kv[req.rank] += job.tokens + 1
        else:
            self.complete(inst, req, now)

    def complete(self, inst: Instance, req: Request, now: float) -> None:
        if req.job.output > 1:
            inst.kv[req.rank] -= req.job.tokens + req.job.output
        inst.inflight -= 1
        inst.inflight_tokens -= req.job.tokens
        req.end_s = now
        self.finished.append(req)

    def add_work(self, inst: Instance, start: float, end: float, work_s: float) -> None:
        """Work seconds (busy time less each step's fixed cost), spread over the windows."""
        inst.work_s += work_s
        first, last = int(start // WINDOW_S), int(end // WINDOW_S)
        for w in range(first, last + 1):
            share = 1.0 if first == last else \
                (min(end, (w + 1) * WINDOW_S) - max(start, w * WINDOW_S)) / (end - start)
            inst.windows[w] = inst.windows.get(w, 0.0) + work_s * share

    # ---- metrics ----------------------------------------------------------------------------

    def row(self) -> dict:
        done = self.finished
        tokens = sum(r.job.tokens for r in done) or 1
        ttft = sorted(r.ttft_s for r in done)
        short = sorted(r.ttft_s for r in done if r.job.tokens < BOUNDS[0])
        work = [inst.work_s for inst in self.instances]
        windows = {w for inst in self.instances for w in inst.windows}
        peak = sum(max(inst.windows.get(w, 0.0) for inst in self.instances) for w in windows)
        span_s = max((r.end_s for r in done), default=1.0) - min(r.arrival_s for r in done)
        row = {
            "policy": self.policy, "buckets": self.buckets, "variant": self.variant,
            "requests": len(done), "short_requests": len(short), "rejected": self.rejected,
            "hit_rate": sum(self.tier_tokens) / tokens,
            "gpu_hit_rate": self.tier_tokens[0] / tokens,
            "host_hit_rate": self.tier_tokens[1] / tokens,
            "gcache_hit_rate": self.tier_tokens[2] / tokens,
            "ttft_p50_s": quantile(ttft, 0.5), "ttft_p99_s": quantile(ttft, 0.99),
            "ttft_p50_short_s": quantile(short, 0.5),
            "ttft_p99_short_s": quantile(short, 0.99),
            "max_mean_load": peak / (sum(work) / len(work)) if sum(work) else 1.0,
            "max_mean_load_run": max(work) / (sum(work) / len(work)) if sum(work) else 1.0,
            "throughput_tok_s": sum(r.job.tokens + r.job.output for r in done) / span_s,
        }
        row = {k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()}
        if self.reasons:
            row["reasons"] = dict(sorted(self.reasons.items()))
        return row


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted values; NaN when there are none."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


class Picker:
    """The run's policy: the index of the instance a job goes to, None when it is refused.
    Baselines choose within the job's pool (``pool_of``; every instance without buckets)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.turn = dict.fromkeys(sim.pools, 0)
        self.ours = Ours(sim) if sim.policy == "ours" else None
        self.choose = None if self.ours else {
            "round_robin": self.round_robin, "least_loaded": self.least_loaded,
            "sglang_cache_aware": self.sglang, "dynamo_cost": self.dynamo}[sim.policy]

    def __call__(self, job: Job) -> int | None:
        if self.ours is not None:
            return self.ours(job)
        key = self.pool_of(job) if self.sim.buckets else 0
        return self.choose(job, key, self.sim.pools[key])

    def pool_of(self, job: Job) -> int:
        """The pool of the job's uncached length (less its longest hit on any instance or in
        GCache); an empty bucket's job goes to the nearest pool, the larger on a tie."""
        sim = self.sim
        best = extent(job.blocks, 0, job.cap, sim.gcache.items)
        for inst in sim.instances:
            best = max(best, sim.local_hits(inst, job)[1])
        bucket = bucket_of(job.tokens - best * BLOCK_TOKENS)
        return min(sim.pools, key=lambda k: (abs(k - bucket), -k))

    def least(self, pool: list[int], key) -> int:
        rng = self.sim.rng
        return min(pool, key=lambda i: (key(self.sim.instances[i]), rng.random()))

    def round_robin(self, job: Job, key: int, pool: list[int]) -> int:
        self.turn[key] += 1
        return pool[(self.turn[key] - 1) % len(pool)]

    def least_loaded(self, job: Job, key: int, pool: list[int]) -> int:
        return self.least(pool, lambda inst: (inst.pending, inst.inflight))

    def sglang(self, job: Job, key: int, pool: list[int]) -> int:
        insts = self.sim.instances
        loads = [insts[i].inflight for i in pool]
        if max(loads) - min(loads) > SGLANG_ABS and max(loads) > SGLANG_REL * min(loads):
            return self.least(pool, lambda inst: inst.inflight)
        depth = {i: self.sim.local_hits(insts[i], job)[1] for i in pool}
        best = max(depth.values())
        if best * BLOCK_TOKENS / job.tokens > SGLANG_THRESHOLD:
            return self.least([i for i in pool if depth[i] == best], lambda inst: inst.inflight)
        return self.least(pool, lambda inst: inst.inflight)

    def dynamo(self, job: Job, key: int, pool: list[int]) -> int:
        blocks = -(-job.tokens // BLOCK_TOKENS)

        def cost(inst: Instance) -> float:
            g, h = self.sim.local_hits(inst, job)
            overlap = g + DYNAMO_HOST_CREDIT * (h - g)
            return max(inst.pending / BLOCK_TOKENS + blocks - overlap, 0) \
                + inst.inflight_tokens / BLOCK_TOKENS

        return self.least(pool, cost)


class Ours:
    """``gcache.router.policy.route`` over every instance, as the router would call it: true
    GPU and host hits (host counts GPU or host, from the first token), queued prefill tokens
    and running decodes per instance, and the GCache tier's own hit. Without buckets, one
    bucket spanning every length and every instance in it."""

    def __init__(self, sim: Simulation) -> None:
        from gcache.router.buckets import Buckets
        from gcache.router.policy import InstanceState, PolicyConfig, route

        self.sim, self.state, self.route = sim, InstanceState, route
        self.config = PolicyConfig(buckets=Buckets(bounds=BOUNDS if sim.buckets
                                                   else BOUNDS[-1:]))
        self.index = {inst.name: i for i, inst in enumerate(sim.instances)}

    def __call__(self, job: Job) -> int | None:
        sim = self.sim
        states = []
        for inst in sim.instances:
            g, h = sim.local_hits(inst, job)
            states.append(self.state(inst.name, inst.bucket, g * BLOCK_TOKENS, h * BLOCK_TOKENS,
                                     inst.pending, sum(map(len, inst.decodes))))
        stored = extent(job.blocks, 0, job.cap, sim.gcache.items) * BLOCK_TOKENS
        try:
            choice = self.route(job.tokens, stored, states, self.config)
        except InvalidRequest:
            return None
        reason = str(choice.reason)
        sim.reasons[reason] = sim.reasons.get(reason, 0) + 1
        return self.index[getattr(choice.instance, "name", choice.instance)]


def ours_source() -> dict:
    """Which ``route`` "ours" runs: its file and the SHA-256 of its text (a result belongs to
    one version of the policy), or why it cannot run here."""
    try:
        from gcache.router import buckets, policy
    except ImportError as exc:
        return {"missing": str(exc)}
    out = {}
    for module in (policy, buckets):
        path = getattr(module, "__file__", None) or "?"
        try:
            with open(path, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()[:16]
        except OSError:
            digest = "?"
        out[module.__name__] = {"file": os.path.relpath(path, ROOT), "sha256": digest}
    return out


# ---- the runs -------------------------------------------------------------------------------

_VARIANTS: dict[str, dict] = {}             # per variant: jobs, speed-up, pools (fork-shared)


def prepare(trace: str, limit: int | None, variant: str, cfg: SimConfig) -> dict:
    stretch = STRETCH if variant == "long" else 1
    jobs = read_jobs(trace, limit, stretch)
    fits = [j for j in jobs if j.tokens < BOUNDS[-1]]
    if not fits:
        raise ConfigError("trace", trace, f"has no request shorter than {BOUNDS[-1]} tokens")
    hits = bound_hits(fits)
    pools = partition(fits, hits, cfg)

    def share(lengths: list[int]) -> list[float]:
        return [round(sum(1 for n in lengths if bucket_of(n) == k) / len(lengths), 4)
                for k in range(len(BOUNDS))]

    speedup = speedup_for(fits, cfg)
    return {"jobs": fits, "scale": stretch, "speedup": speedup, "pools": pools,
            "meta": {"requests": len(fits), "longer_than_every_bucket": len(jobs) - len(fits),
                     "stretch": stretch, "arrival_speedup": round(speedup, 4),
                     "instances_per_bucket": [pools.count(k) for k in range(len(BOUNDS))],
                     "request_share_per_bucket": share([j.tokens for j in fits]),
                     "uncached_share_per_bucket": share([j.tokens - h
                                                         for j, h in zip(fits, hits)]),
                     "infinite_cache_hit_rate":
                         round(sum(hits) / sum(j.tokens for j in fits), 4)}}


def simulate(task: tuple[str, str, bool, SimConfig]) -> dict:
    variant, policy, buckets, cfg = task
    v = _VARIANTS[variant]
    return Simulation(v["jobs"], cfg, policy, buckets, variant, v["scale"], v["speedup"],
                      v["pools"]).run()


def run_all(args: argparse.Namespace, cfg: SimConfig) -> tuple[list[dict], dict]:
    for variant in args.variants:
        _VARIANTS[variant] = prepare(args.trace, args.limit, variant, cfg)
    tasks = [(v, p, b, cfg) for v in args.variants for p in args.policies for b in (False, True)]
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            rows = pool.map(simulate, tasks, chunksize=1)
    else:
        rows = [simulate(task) for task in tasks]
    return rows, {v: _VARIANTS[v]["meta"] for v in args.variants}


# ---- report ---------------------------------------------------------------------------------

def targets(rows: list[dict]) -> list[dict]:
    """Issue 20's targets, each with whether it holds and the figures it compares."""
    def find(variant: str, policy: str, buckets: bool) -> dict | None:
        return next((r for r in rows if (r["variant"], r["policy"], r["buckets"])
                     == (variant, policy, buckets)), None)

    out = []

    def check(text: str, ours: float, best: dict, key: str, ok, scale: float = 1.0) -> None:
        ref = best[key] * scale
        out.append({"target": text, "holds": bool(ok(ours, ref)),
                    "figures": f"ours {ours:.4g} vs {ref:.4g} ({best['policy']}, buckets "
                               f"{'on' if best['buckets'] else 'off'})"})

    ours = find("long", "ours", True)
    long_rows = [r for r in rows if r["variant"] == "long"]
    off = [r for r in long_rows if not r["buckets"]]
    if ours and off:
        best = min(off, key=lambda r: r["ttft_p99_short_s"])
        check("long: short-bucket TTFT p99 <= 0.5x the best policy without buckets",
              ours["ttft_p99_short_s"], best, "ttft_p99_short_s", operator.le, 0.5)
        aware = [r for r in long_rows if r["policy"] in CACHE_AWARE]
        if aware:
            best = max(aware, key=lambda r: r["hit_rate"])
            check("long: token hit rate >= 0.95x the best cache-aware baseline",
                  ours["hit_rate"], best, "hit_rate", operator.ge, 0.95)
        out.append({"target": "long: max/mean load <= 1.2",
                    "holds": ours["max_mean_load"] <= 1.2,
                    "figures": f"ours {ours['max_mean_load']:.4g}"})
    base = [r for r in rows if r["variant"] == "plain" and r["policy"] != "ours"]
    for buckets in (True, False):           # the target is ours with buckets; off: for reference
        ours = find("plain", "ours", buckets)
        if not (ours and base):
            continue
        for key, text, pick, ok in (
                ("ttft_p99_short_s", "short-bucket TTFT p99", min, operator.le),
                ("hit_rate", "token hit rate", max, operator.ge),
                ("max_mean_load", "max/mean load", min, operator.le)):
            best = pick(base, key=lambda r, k=key: r[k])
            check(f"plain{'' if buckets else ' (ours without buckets)'}: {text} no worse than "
                  "the best baseline", ours[key], best, key, ok)
    return out


COLUMNS = (("policy", "policy", "{}"), ("buckets", "buckets", "{}"),
           ("variant", "variant", "{}"), ("hit_rate", "hit rate", "{:.3f}"),
           ("gpu_hit_rate", "GPU hit rate", "{:.3f}"),
           ("ttft_p50_s", "TTFT p50 s", "{:.2f}"), ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
           ("ttft_p99_short_s", "short p99 s", "{:.2f}"),
           ("max_mean_load", "max/mean load", "{:.2f}"),
           ("throughput_tok_s", "throughput tok/s", "{:,.0f}"))


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|---|---|---|" + "---:|" * (len(COLUMNS) - 3)]
    for row in rows:
        cells = [fmt.format("on" if v is True else "off" if v is False else v)
                 for v, fmt in ((row[key], fmt) for key, _, fmt in COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Short-bucket TTFT p99 against token hit rate, one panel per variant: filled markers are
    runs with buckets, hollow ones without."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in ("plain", "long") if any(r["variant"] == v for r in rows)]
    fig, axes = plt.subplots(1, len(variants), figsize=(6.5 * len(variants), 4.8), squeeze=False)
    colors = dict(zip(POLICIES, ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:red")))
    markers = dict(zip(POLICIES, "osD^*"))
    for ax, variant in zip(axes[0], variants):
        for r in (r for r in rows if r["variant"] == variant):
            color = colors[r["policy"]]
            ax.scatter(r["hit_rate"], r["ttft_p99_short_s"], s=120 if r["policy"] == "ours"
                       else 70, marker=markers[r["policy"]], edgecolors=color, linewidths=1.5,
                       facecolors=color if r["buckets"] else "none",
                       label=f"{r['policy']}{' + buckets' if r['buckets'] else ''}")
        ax.set_yscale("log")
        ax.set_xlabel("token hit rate (GPU + host + GCache)")
        ax.set_ylabel("TTFT p99 of requests under 64K tokens (s, log)")
        ax.set_title(f"{variant} trace")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=TRACE,
                        help="Mooncake-format JSONL trace (default: the shipped conversation "
                             "trace), or a trace of the replay suite by name (agentic, "
                             "multitenant, toolcalls, conversation)")
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    parser.add_argument("--variants", nargs="+", choices=("plain", "long"),
                        default=["plain", "long"])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    defaults = SimConfig()
    parser.add_argument("--instances", type=int, default=defaults.instances)
    parser.add_argument("--ranks", type=int, default=defaults.ranks)
    parser.add_argument("--load", type=float, default=defaults.load,
                        help="offered load: no-cache work over capacity (sets the speed-up)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--out", help="write the rows as a JSON list here")
    parser.add_argument("--plot", help="write the PNG here")
    parser.add_argument("--results", action="store_true",
                        help="also write bench/results/routing-latest.json")
    args = parser.parse_args(argv)
    try:
        cfg = SimConfig(instances=args.instances, ranks=args.ranks, load=args.load,
                        seed=args.seed)
        source = ours_source() if "ours" in args.policies else {}
        if "missing" in source:
            print(f"ours: skipped, gcache.router is not importable ({source['missing']})")
            args.policies = [p for p in args.policies if p != "ours"]
        start = time.perf_counter()
        rows, meta = run_all(args, cfg)
    except ConfigError as exc:
        parser.error(str(exc))
    wall_s = time.perf_counter() - start
    for variant, m in meta.items():
        print(f"{variant}: {m['requests']} requests ({m['longer_than_every_bucket']} longer than "
              f"every bucket left out), arrival speed-up {m['arrival_speedup']}x, request share "
              f"per bucket {m['request_share_per_bucket']}, instances per bucket "
              f"{m['instances_per_bucket']}, infinite-cache hit rate "
              f"{m['infinite_cache_hit_rate']}")
    for name, where in source.items():
        print(f"ours: {name} from {where['file']} (sha256 {where['sha256']})")
    print()
    print(table(rows))
    print()
    checks = targets(rows)
    for t in checks:
        print(f"- {'holds' if t['holds'] else 'MISSES'}: {t['target']}: {t['figures']}")
    print(f"\n{len(rows)} runs in {wall_s:.0f} s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
            fh.write("\n")
    if args.plot:
        plot(rows, args.plot)
    if args.results:
        command = "python bench/routing.py " + " ".join(argv if argv is not None
                                                         else sys.argv[1:])
        write_results("routing", {"date": dt.date.today().isoformat(), "command": command,
                                  "config": asdict(cfg), "chunk_tokens": CHUNK_TOKENS,
                                  "bounds": BOUNDS, "variants": meta, "ours": source,
                                  "rows": rows,
                                  "targets": checks, "runtime_s": round(wall_s)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

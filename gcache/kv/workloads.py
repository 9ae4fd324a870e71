"""Seeded generators of Mooncake-format traces, each a workload shape the replay suite needs.

The shipped conversation trace is one shape; a policy tuned on it alone is tuned to it. These
generators make others, from a seed, with no data shipped: the same seed gives the same
requests, byte for byte (``random.Random``, whose sequence Python keeps stable across
versions). Every request is a ``TraceRequest`` as ``read_trace`` would give it: a timestamp
(ms), an input length, hash ids of 512-token blocks (an id names a block *and* its prefix, as
Mooncake's remapped ids do), and an output length.

- ``agentic``: agents of a few kinds, each kind with a long system prompt of its own; a session
  is a task appended to it, then a tool loop: each step appends a little (the model's call and
  the tool's answer) and comes back after the tool's latency, so the session's whole prefix is
  resumed after a gap while other sessions run. A step is retried now and then (the same prefix,
  a different continuation: a branch), and some steps fan out to parallel sub-agents that share
  the session's prefix.
- ``multitenant``: several models (disjoint id spaces: no page is shared across models) serving
  tenants of uneven rates, each tenant with prompt families (few-shot templates, documents that
  many questions are asked about, short chats), plus one-shot long requests (summaries of
  unique documents) that nobody comes back to; tenant popularity shifts between phases, so the
  working set moves while the trace runs.
- ``toolcalls``: the stateless shape of tool-and-agent traffic as Mooncake's published
  tool-and-agent trace shows it in its first lines (a few system prompts of 5 to 12 blocks
  reused by most calls, each with a one-shot suffix of one to four blocks and an output of a
  few tokens, beside chat requests with a one-block shared head and a long unique body).

Block ids are drawn from one counter per trace (per model for ``multitenant``, offset into a
range of its own), so equal ids mean equal content and prefix, and a request whose prompt grows
gets a new id for its previously partial last block (its content changed).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from gcache.errors import ConfigError
from gcache.kv.trace import BLOCK_SIZE, TraceRequest

MODEL_ID_STRIDE = 1 << 40          # id range of each model of ``multitenant``


@dataclass(slots=True)
class _Prompt:
    """A prompt under construction: its full blocks' ids and its length in tokens."""

    ids: list[int] = field(default_factory=list)
    tokens: int = 0
    tail_id: int = -1              # the id of its partial last block, -1 when none

    def grown(self, tokens: int, fresh: Callable[[], int]) -> _Prompt:
        """This prompt with ``tokens`` more: its full blocks kept, the partial one renamed
        (its content changed), new ids for the rest."""
        total = self.tokens + tokens
        out = _Prompt(list(self.ids), total)
        for _ in range(total // BLOCK_SIZE - len(self.ids)):
            out.ids.append(fresh())
        if total % BLOCK_SIZE:
            out.tail_id = fresh()
        return out

    def hash_ids(self) -> tuple[int, ...]:
        return tuple(self.ids) + ((self.tail_id,) if self.tail_id >= 0 else ())


class _Trace:
    """Requests as they are generated, sorted by arrival at the end."""

    def __init__(self, rng: random.Random, id_base: int = 0) -> None:
        self.rng = rng
        self._next_id = id_base
        self.out: list[tuple[float, int, int, tuple[int, ...]]] = []

    def fresh(self) -> int:
        self._next_id += 1
        return self._next_id

    def emit(self, at_s: float, prompt: _Prompt, output: int) -> None:
        if prompt.tokens:
            self.out.append((at_s, prompt.tokens, output, prompt.hash_ids()))

    def requests(self) -> list[TraceRequest]:
        ordered = sorted(self.out, key=lambda r: r[0])
        return [TraceRequest(i, int(at * 1000), n, ids, out)
                for i, (at, n, out, ids) in enumerate(ordered)]


def _zipf(rng: random.Random, n: int, s: float) -> int:
    """An index in [0, n) drawn with weight 1/(i+1)^s."""
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    return rng.choices(range(n), weights)[0]


def _tokens(rng: random.Random, low: int, high: int) -> int:
    """A length log-uniform in [low, high] tokens."""
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def agentic(requests: int = 8000, *, seed: int = 1) -> list[TraceRequest]:
    """About ``requests`` requests of agent sessions (module docstring)."""
    _check(requests)
    t = _Trace(random.Random(seed))
    rng = t.rng
    kinds = [_Prompt().grown(rng.randrange(6, 25) * BLOCK_SIZE + rng.randrange(BLOCK_SIZE),
                             t.fresh) for _ in range(6)]
    start = 0.0
    while len(t.out) < requests:
        start += rng.expovariate(1.0 / 2.0)                 # a session every 2 s
        prompt = kinds[_zipf(rng, len(kinds), 1.0)].grown(_tokens(rng, 200, 4000), t.fresh)
        _session(t, prompt, start, steps=1 + int(rng.expovariate(1.0 / 10.0)), depth=0)
    return t.requests()[:requests]


def _session(t: _Trace, prompt: _Prompt, at_s: float, *, steps: int, depth: int) -> None:
    """One agent's tool loop from ``prompt``: a request per step, the next after a gap."""
    rng = t.rng
    for _ in range(steps):
        t.emit(at_s, prompt, _tokens(rng, 20, 600))
        if rng.random() < 0.12:                         # a retry: the same prefix, branched
            retry = prompt.grown(_tokens(rng, 50, 800), t.fresh)
            t.emit(at_s + rng.uniform(0.5, 5.0), retry, _tokens(rng, 20, 600))
        if depth == 0 and rng.random() < 0.06:          # sub-agents on the session's prefix
            for _ in range(rng.randrange(2, 5)):
                _session(t, prompt.grown(_tokens(rng, 100, 1500), t.fresh),
                         at_s + rng.uniform(0.1, 2.0), steps=rng.randrange(1, 6),
                         depth=depth + 1)
        at_s += 2.0 + rng.expovariate(1.0 / 20.0)       # the tool runs, others go on
        prompt = prompt.grown(_tokens(rng, 60, 2500), t.fresh)
        if prompt.tokens > 200_000:
            break


def multitenant(requests: int = 10000, *, seed: int = 2, models: int = 3) -> list[TraceRequest]:
    """About ``requests`` requests of tenants on ``models`` models (module docstring)."""
    _check(requests)
    if models < 1:
        raise ConfigError("models", models, "must be at least 1")
    rng = random.Random(seed)
    # one stream of draws for the whole mix, an id range per model
    traces = [_Trace(rng, id_base=m * MODEL_ID_STRIDE) for m in range(models)]
    tenants = []
    for n in range(24):
        tr = traces[n % models]
        families = [("template", _Prompt().grown(_tokens(rng, 1500, 9000), tr.fresh))
                    for _ in range(rng.randrange(1, 4))]
        families += [("document", _Prompt().grown(_tokens(rng, 4000, 40000), tr.fresh))
                     for _ in range(rng.randrange(5, 30))]
        tenants.append((tr, families))
    phases, per_phase = 4, requests / 4
    now = 0.0
    for _ in range(phases):
        order = list(range(len(tenants)))
        rng.shuffle(order)                              # who is popular changes per phase
        made = 0
        while made < per_phase:
            now += rng.expovariate(4.0)
            tr, families = tenants[order[_zipf(rng, len(order), 1.1)]]
            made += _tenant_request(tr, families, now)
    out = sorted((r for tr in traces for r in tr.out), key=lambda r: r[0])[:requests]
    return [TraceRequest(i, int(at * 1000), n, ids, o) for i, (at, n, o, ids) in enumerate(out)]


def _tenant_request(tr: _Trace, families: list[tuple[str, _Prompt]], now: float) -> int:
    """One request of a tenant (or a short chat of a few); returns how many were emitted."""
    rng = tr.rng
    kind = rng.random()
    if kind < 0.05:                                     # a unique long document, read once
        tr.emit(now, _Prompt().grown(_tokens(rng, 8000, 60000), tr.fresh), _tokens(rng, 100, 800))
        return 1
    if kind < 0.25:                                     # a short chat of a few turns
        prompt = families[0][1].grown(_tokens(rng, 100, 1500), tr.fresh)
        turns = rng.randrange(1, 6)
        for turn in range(turns):
            tr.emit(now + turn * rng.uniform(5, 60), prompt, _tokens(rng, 50, 500))
            prompt = prompt.grown(_tokens(rng, 300, 1500), tr.fresh)
        return turns
    _, base = families[_zipf(rng, len(families), 1.0)]
    tr.emit(now, base.grown(_tokens(rng, 30, 1200), tr.fresh), _tokens(rng, 5, 400))
    return 1


def toolcalls(requests: int = 12000, *, seed: int = 3) -> list[TraceRequest]:
    """About ``requests`` stateless tool calls and chats (module docstring)."""
    _check(requests)
    t = _Trace(random.Random(seed))
    rng = t.rng
    head = _Prompt().grown(BLOCK_SIZE, t.fresh)                 # the chats' shared first block
    prompts = [_Prompt().grown(rng.randrange(5, 13) * BLOCK_SIZE, t.fresh) for _ in range(200)]
    chats: list[_Prompt] = []                                   # chats a user may come back to
    now = 0.0
    for _ in range(requests):
        now += rng.expovariate(6.0)
        if rng.random() < 0.55:
            call = prompts[_zipf(rng, len(prompts), 1.0)]
            t.emit(now, call.grown(_tokens(rng, 60, 2000), t.fresh), rng.randrange(3, 60))
            continue
        if chats and rng.random() < 0.4:                        # a later turn of a recent chat
            k = len(chats) - 1 - min(len(chats) - 1, int(rng.expovariate(1.0 / 40.0)))
            chat = chats.pop(k).grown(_tokens(rng, 100, 3000), t.fresh)
        else:
            chat = head.grown(_tokens(rng, 400, 30000), t.fresh)
        t.emit(now, chat, _tokens(rng, 50, 700))
        chats = chats[-400:] + [chat]
    return t.requests()


def _check(requests: int) -> None:
    if requests < 1:
        raise ConfigError("requests", requests, "must be at least 1")


GENERATORS: dict[str, Callable[..., list[TraceRequest]]] = {
    "agentic": agentic, "multitenant": multitenant, "toolcalls": toolcalls}

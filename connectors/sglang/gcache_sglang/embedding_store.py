"""``GCacheEmbeddingStore``: GCache as SGLang's multimodal embedding store.

SGLang's encoder keeps image, video and audio embeddings in a host pool and, with
``--enable-mm-global-cache``, shares them through an ``EmbeddingStore`` backend made by
``EmbeddingStoreFactory.create_backend(name)`` (``sglang/srt/mem_cache/embedding_store.py``;
the caller is ``sglang/srt/disaggregation/encoder/server.py``). This package registers itself
there as ``gcache`` through SGLang's general plugin entry point (``sglang.srt.plugins``, loaded
in each SGLang process), so the factory finds it by that name. SGLang 0.5.23's command line
still lists only ``mooncake`` for ``--mm-global-cache-backend``: pass the server args in Python
(``mm_global_cache_backend="gcache"``) until it accepts registered names.

The factory passes no settings: they come from ``GCACHE_SGLANG_EMBEDDINGS``, a JSON object of
``gcache_*`` settings (``gcache_master`` or ``gcache_servers``, ``gcache_namespace``...). Values
are stored through ``gcache.mm.EncoderCache`` under SGLang's item hash and the served model's
path (SGLang's hash is of the processed media, not of the encoder: two models must not share),
content addressed. Single-buffer calls read and write the pool's memory in place (addresses as
SGLang hands them); multi-buffer calls (an item spread over pool pages) gather into and scatter
from one staging copy, since a reader's pages need not be cut where the writer's were.

Every call is answered: a dead server, a timeout or an error is a miss (or a failed put) for
SGLang, logged, never an exception in its IO thread.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
from typing import Any

from sglang.srt.mem_cache.embedding_store import EmbeddingStore, EmbeddingStoreFactory

from gcache.kv import KV_ONLY, LOADER_ONLY, ConfigError, client_from_settings, gcache_settings
from gcache.mm import EncoderCache

log = logging.getLogger(__name__)

BACKEND = "gcache"
SETTINGS_ENV = "GCACHE_SGLANG_EMBEDDINGS"
UNUSED = tuple(s for s in LOADER_ONLY + KV_ONLY if s != "namespace")


def register() -> None:
    """SGLang's plugin hook: makes ``gcache`` a name ``EmbeddingStoreFactory`` knows."""
    EmbeddingStoreFactory.register_backend(BACKEND, __name__, "GCacheEmbeddingStore")


class GCacheEmbeddingStore(EmbeddingStore):
    def __init__(self, storage_config: Any = None) -> None:
        raw = os.environ.get(SETTINGS_ENV, "{}")
        try:
            extra = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(SETTINGS_ENV, raw, f"must be a JSON object: {exc}") from None
        if not isinstance(extra, dict):
            raise ConfigError(SETTINGS_ENV, raw, "must be a JSON object of gcache_* settings")
        settings = gcache_settings(extra, unused=UNUSED)
        self.client = client_from_settings(settings)
        self.cache = EncoderCache(self.client, encoder=f"sgl/{_served_model()}",
                                  namespace=settings.get("namespace", ""))
        self.counters = {"gets": 0, "hits": 0, "puts": 0, "put_failures": 0, "errors": 0}

    def get_key(self, mm_hash: str) -> str:
        return self.cache.key(mm_hash)

    def batch_is_exist(self, hashes: list[str]) -> list[bool]:
        try:
            return self.cache.exists_many([self.get_key(h) for h in hashes])
        except Exception:
            return self._failed("batch_is_exist", len(hashes))

    def batch_get(self, hashes: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        try:
            got = self.cache.get_into_many([self.get_key(h) for h in hashes],
                                           [_memory(p, n) for p, n in zip(ptrs, sizes)])
        except Exception:
            return self._failed("batch_get", len(hashes))
        self.counters["gets"] += len(got)
        self.counters["hits"] += sum(got)
        return got

    def batch_put(self, hashes: list[str], ptrs: list[int], sizes: list[int]) -> list[bool]:
        return self._put(hashes, [_memory(p, n) for p, n in zip(ptrs, sizes)])

    def batch_get_into_multi_buffers(self, hashes: list[str], ptrs: list[list[int]],
                                     sizes: list[list[int]]) -> list[bool]:
        staged = [bytearray(sum(parts)) for parts in sizes]
        try:
            got = self.cache.get_into_many([self.get_key(h) for h in hashes], staged)
        except Exception:
            return self._failed("batch_get_into_multi_buffers", len(hashes))
        for ok, stage, item_ptrs, item_sizes in zip(got, staged, ptrs, sizes):
            if ok:
                offset = 0
                for ptr, size in zip(item_ptrs, item_sizes):
                    ctypes.memmove(ptr, (ctypes.c_char * size).from_buffer(stage, offset), size)
                    offset += size
        self.counters["gets"] += len(got)
        self.counters["hits"] += sum(got)
        return got

    def batch_put_from_multi_buffers(self, hashes: list[str], ptrs: list[list[int]],
                                     sizes: list[list[int]]) -> list[bool]:
        staged = [b"".join(ctypes.string_at(p, n) for p, n in zip(item_ptrs, item_sizes))
                  for item_ptrs, item_sizes in zip(ptrs, sizes)]
        return self._put(hashes, staged)

    def register_buffer(self, tensor: Any) -> None:
        """The pool, for NIXL where this host has an RDMA NIC (else nothing to do)."""
        self.client.register_buffer(tensor)

    def _put(self, hashes: list[str], values: list[Any]) -> list[bool]:
        keys = [self.get_key(h) for h in hashes]
        try:
            held = self.cache.exists_many(keys)          # content addressed: never twice
            missing = [i for i, ok in enumerate(held) if not ok]
            stored = self.cache.put_many([keys[i] for i in missing],
                                         [values[i] for i in missing])
        except Exception:
            return self._failed("batch_put", len(hashes))
        for i, ok in zip(missing, stored):
            held[i] = ok
        self.counters["puts"] += len(missing)
        self.counters["put_failures"] += stored.count(False)
        return held

    def _failed(self, call: str, n: int) -> list[bool]:
        log.exception("gcache embedding store: %s failed; answering a miss", call)
        self.counters["errors"] += 1
        return [False] * n


def _memory(ptr: int, size: int) -> memoryview:
    """``size`` bytes of SGLang's pool at ``ptr`` (host memory it keeps alive meanwhile)."""
    return memoryview((ctypes.c_ubyte * size).from_address(ptr)).cast("B")


def _served_model() -> str:
    """The model SGLang serves, as its encoder's identity; "model" (and a warning: set a
    gcache_namespace per model) when this process was not started by SGLang's server."""
    try:
        from sglang.srt.runtime_context import get_server_args
        return str(get_server_args().model_path)
    except Exception:
        log.warning("gcache embedding store: no SGLang server args in this process; keys "
                    "name no model (set gcache_namespace per model)")
        return "model"

"""``GCacheHiCacheStorage``: GCache as the L3 tier under SGLang's HiCache host pool.

Load it with ``--hicache-storage-backend dynamic`` and the extra config
``{"backend_name": "gcache", "module_path": "gcache_sglang.storage", "class_name":
"GCacheHiCacheStorage", "interface_v1": 1, "gcache_master": "HOST:PORT", ...}`` (the
``gcache_*`` keys are read by ``gcache.kv.gcache_settings``).

What it translates, and nothing more (ARCHITECTURE §2): SGLang's page hashes and host-pool
slots into ``gcache.kv.EnginePages`` calls.
- Zero copy (``interface_v1``): ``batch_get_v1``/``batch_set_v1`` read and write the host pool's
  own page buffers (``get_page_buffer_meta``: K and V per page for ``page_first*``, K and V per
  layer for ``layer_first``, one latent per page for MLA).
- The generic path (``get``/``set``/``batch_*`` with flat page tensors) stores one object per
  page. The two paths name different objects: their byte orders differ.
- Hybrid models (``*_v2``): each sidecar pool (the SWA pool keeps only the window's pages) is
  stored under the same page hashes as the KV; ``batch_exists_v2`` reports only prefixes whose
  window pages all exist (``gcache.kv.restorable_prefixes``), never a pseudo-hit.
- Namespaces: the model, the pool's byte format (class, layout, dtype, geometry, layers) and,
  for every pool that is sharded over tensor-parallel ranks, the rank. MLA pools hold the same
  bytes on every rank: they share objects and only the writer rank writes them.
- Placement: with ``hicache_storage_pass_prefix_keys: true`` SGLang tells the zero-copy and
  hybrid calls each call's position in its sequence, and every page of a sequence is placed by
  the sequence's first page (one small set of servers per prefix tree); without it pages spread
  key by key. The generic path's ``batch_set``/``batch_get`` are never told, so that path always
  places key by key, its existence checks included: every call of one path finds a page where
  the others put it. The engine's launch config decides, so writers and readers agree.
- ``exists(key)`` answers for either path's objects, so it holds after ``set`` whatever
  ``interface_v1`` says. ``gcache_policy`` is refused: SGLang decides what it stores.
- Time: ``probe`` (an existence check) and ``fetch`` (a read, straight into the host pool
  where zero copy) in ``gcache.kv.load_phases("sglang")``, under ``PHASE_ID``: HiCache's calls
  name no request. SGLang's own host-to-device copy is not ours to time.
- Failure: every call is answered; a miss, a timeout, a dead server or an internal error is a
  miss (or a failed write) for SGLang, logged, never an exception in its IO threads.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gcache.kv import (
    GROUP_HEAD_TOKENS,
    LOADER_ONLY,
    EnginePages,
    client_from_settings,
    count_setting,
    gcache_settings,
    head_groups,
    head_pages,
    leading,
    load_phases,
    page_regions,
    restorable_prefixes,
)
from gcache_sglang._compat import (
    KV,
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    MLATokenToKVPoolHost,
    PoolHitPolicy,
    PoolTransfer,
    PoolTransferResult,
    StorageMetrics,
    engine_passes_prefix_keys,
)

log = logging.getLogger(__name__)

PHASE_ID = "hicache"          # HiCache's storage calls carry no request id
FLAT = "flat"                 # the generic path's objects: one flat page of the KV pool
FORMAT_FIELDS = ("layout", "dtype", "page_size", "layer_num", "head_num", "head_dim",
                 "kv_cache_dim", "kv_lora_rank", "qk_rope_head_dim", "start_layer",
                 "end_layer", "size_per_token", "storage_format_tag")


def _answer_on_error(default: Callable[..., Any]):
    """Run an SGLang entry point; on an unexpected error log it and answer ``default(...)``."""
    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except Exception:
                log.exception("gcache %s failed; answering a miss", method.__name__)
                self._count("errors", 1)
                return default(*args, **kwargs)
        return call
    return wrap


def _name(pool: Any) -> str:
    """A pool's name as a plain string (SGLang passes ``PoolName`` members or strings)."""
    return str(getattr(pool, "value", pool))


def _no_pages(transfers, *_a, **_k) -> dict:
    return {_name(t.name): [False] * len(t.keys or ()) for t in transfers}


class GCacheHiCacheStorage(HiCacheStorage):
    """SGLang ``HiCacheStorage`` over a GCache cluster (module docstring). Thread-safe."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None):
        extra = dict(storage_config.extra_config or {})
        settings = gcache_settings(extra, unused=("policy", "async_load_tokens", "pinned_mb",
                                                  "switch_interval_us", "recompute_tokens_per_s",
                                                  "engine_url", "engine_bucket", *LOADER_ONLY))
        self.config = storage_config
        self.zero_copy = bool(extra.get("interface_v1"))
        self.grouped = engine_passes_prefix_keys(extra)
        self.group_head_tokens = count_setting(settings, "group_head_tokens", GROUP_HEAD_TOKENS)
        self.client = client_from_settings(settings)
        model = (storage_config.model_name or "model").replace("/", "-").strip("-")[-120:]
        namespace = {"engine": "sglang", "model": storage_config.model_name,
                     "pp": f"{storage_config.pp_rank}/{storage_config.pp_size}",
                     "attn_cp": f"{storage_config.attn_cp_rank}/{storage_config.attn_cp_size}",
                     "dcp": f"{storage_config.dcp_rank}/{storage_config.dcp_size}",
                     "logical_page_size": storage_config.logical_page_size,
                     "tenant": settings.get("namespace", "")}
        self.pages = EnginePages(self.client, f"sgl/{model}", namespace)
        self._parts: dict[str, int] = {}              # pool name -> buffers per page
        self._replicated: set[str] = set()            # pools with equal bytes on every TP rank
        self._stats_lock = threading.Lock()
        self.phases = load_phases("sglang")
        self.counters = {"pages_read": 0, "pages_written": 0, "pages_skipped": 0,
                         "read_misses": 0, "write_failures": 0, "errors": 0}
        self._metrics: dict[str, list] = {"prefetch_pgs": [], "backup_pgs": [],
                                          "prefetch_bandwidth": [], "backup_bandwidth": []}
        log.info("gcache HiCache backend: %s, tp %d/%d, zero copy %s", self.client,
                 storage_config.tp_rank, storage_config.tp_size, self.zero_copy)
        if self.grouped and not self.zero_copy:
            log.info("gcache: prefix keys place only zero-copy and hybrid pages; the generic "
                     "path (interface_v1 off) places its pages key by key")

    # ---- registration ----------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self._add_pool(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._add_pool(_name(host_pool_name), host_pool)

    def _add_pool(self, name: str, pool) -> None:
        fields = {f: str(getattr(pool, f)) for f in FORMAT_FIELDS
                  if getattr(pool, f, None) is not None}
        fields["class"] = type(pool).__name__
        replicated = self.config.is_mla_model and isinstance(pool, MLATokenToKVPoolHost)
        if not replicated:
            fields["tp"] = f"{self.config.tp_rank}/{self.config.tp_size}"
            fields["split_heads"] = f"{self.config.should_split_heads}/{self.config.tp_lcm_size}"
        self.pages.add_pool(name, **fields)
        if name == KV:
            self.pages.add_pool(FLAT, **fields, path="generic")
        if replicated:
            self._replicated.add(name)
        self._parts[name] = len(pool.get_page_buffer_meta(_arange(pool.page_size))[0])

    def _writes(self, pool: str) -> bool:
        return pool not in self._replicated or self.config.is_storage_writer

    # ---- placement and buffers --------------------------------------------------------------

    def _group(self, keys: list[str],
               extra_info: HiCacheStorageExtraInfo | None) -> list[str] | None:
        """Each page's placement group (``gcache.kv.page_keys.head_groups``: the sequence's
        first page key for the pages of its head, the first page past the head for the rest),
        when SGLang tells us where the call starts.

        With prefix keys on, SGLang 0.5.23 passes ``None`` instead of ``[]`` for a call that
        starts at the root in one place (the storage hit query), so ``None`` means the root.
        """
        if not self.grouped or not self.zero_copy:     # the generic path places key by key
            return None
        prefix = list(getattr(extra_info, "prefix_keys", None) or [])
        head = head_pages(self.mem_pool_host.page_size, self.group_head_tokens)
        return head_groups(prefix + list(keys), head)[len(prefix):]

    def _buffers(self, pool: str, keys: list[str], host_indices) -> list[list[memoryview]]:
        host_pool = self.registered_pools[pool] if pool != KV else self.mem_pool_host
        expected = len(keys) * host_pool.page_size
        if host_indices is None or host_indices.numel() != expected:
            got = None if host_indices is None else host_indices.numel()
            raise ValueError(f"pool {pool}: {len(keys)} pages need {expected} host indices; "
                             f"got {got}")
        pointers, sizes = host_pool.get_page_buffer_meta(host_indices)
        return page_regions(pointers, sizes, len(keys))

    # ---- zero copy (v1) ---------------------------------------------------------------------

    @_answer_on_error(lambda keys, *a, **k: [False] * len(keys))
    def batch_get_v1(self, keys: list[str], host_indices, extra_info=None) -> list[bool]:
        return self._read(KV, keys, host_indices, self._group(keys, extra_info))

    @_answer_on_error(lambda keys, *a, **k: [False] * len(keys))
    def batch_set_v1(self, keys: list[str], host_indices, extra_info=None) -> list[bool]:
        return self._write(KV, keys, host_indices, self._group(keys, extra_info))

    def _read(self, pool: str, keys: list[str], host_indices, group: str | None) -> list[bool]:
        if not keys:
            return []
        return self._read_pages(pool, keys, self._buffers(pool, keys, host_indices), group)

    def _write(self, pool: str, keys: list[str], host_indices, group: str | None) -> list[bool]:
        if not keys:
            return []
        if not self._writes(pool):
            self._count("pages_skipped", len(keys))
            return [True] * len(keys)
        return self._write_pages(pool, keys, self._buffers(pool, keys, host_indices), group)

    def _read_pages(self, pool: str, keys: list[str], parts, group: str | None) -> list[bool]:
        """Read pages into their buffers; counted, and timed for SGLang's metrics."""
        start = time.perf_counter()
        done = self.pages.read(pool, keys, parts, group=group)
        self.phases.add(PHASE_ID, "fetch", time.perf_counter() - start)
        self.phases.placed(PHASE_ID, sum(view.nbytes for ok, page in zip(done, parts) if ok
                                         for view in page))
        self._count("pages_read", sum(done))
        self._count("read_misses", len(keys) - sum(done))
        self._record("prefetch", pool, leading(done), time.perf_counter() - start)
        return done

    def _write_pages(self, pool: str, keys: list[str], parts, group: str | None) -> list[bool]:
        start = time.perf_counter()
        done = self.pages.write(pool, keys, parts, group=group)
        self._count("pages_written", sum(done))
        self._count("write_failures", len(keys) - sum(done))
        self._record("backup", pool, sum(done), time.perf_counter() - start)
        return done

    # ---- existence ----------------------------------------------------------------------------

    @_answer_on_error(lambda *a, **k: 0)
    def batch_exists(self, keys: list[str], extra_info=None) -> int:
        return self._kv_pages(keys, self._group(keys, extra_info))

    def _kv_pages(self, keys: list[str], group: str | None) -> int:
        """Leading pages whose KV exists, in the objects (and placement) of the path in use."""
        began = time.perf_counter()
        try:
            if not self.zero_copy:
                return self.pages.leading_present(FLAT, keys, 1)      # placed key by key
            return self.pages.leading_present(KV, keys, self._parts_of(KV), group=group)
        finally:
            self.phases.add(PHASE_ID, "probe", time.perf_counter() - began)

    @_answer_on_error(lambda *a, **k: PoolTransferResult(0, {}, []))
    def batch_exists_v2(self, keys: list[str], pool_transfers: list[PoolTransfer] | None = None,
                        extra_info=None) -> PoolTransferResult:
        group = self._group(keys, extra_info)
        kv_pages = self._kv_pages(keys, group)
        hits: dict[str, int] = {KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            if not restorable:
                break
            name = _name(transfer.name)
            present = self.pages.present(name, keys[:kv_pages], self._parts_of(name), group=group)
            if transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(transfer.keys or ()))
                allowed = set(restorable_prefixes(kv_pages, present, window))
            elif transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
                allowed = set(range(1, leading(present) + 1))
            else:
                raise ValueError(f"hit policy {transfer.hit_policy} of pool {name} is not "
                                 "supported by gcache")
            if allowed:
                hits[name] = max(allowed)
            restorable &= allowed
        ordered = sorted(restorable)
        return PoolTransferResult(ordered[-1] if ordered else 0, hits, ordered)

    def _parts_of(self, pool: str) -> int:
        if pool == FLAT:
            return 1
        if pool not in self._parts:
            raise ValueError(f"pool {pool!r} was never registered; have {sorted(self._parts)}")
        return self._parts[pool]

    # ---- hybrid pools (v2) ------------------------------------------------------------------

    @_answer_on_error(_no_pages)
    def batch_get_v2(self, transfers: list[PoolTransfer], extra_info=None) -> dict:
        return {_name(t.name): self._read(_name(t.name), list(t.keys or ()), t.host_indices,
                                          self._group(list(t.keys or ()), extra_info))
                for t in transfers}

    @_answer_on_error(_no_pages)
    def batch_set_v2(self, transfers: list[PoolTransfer], extra_info=None) -> dict:
        return {_name(t.name): self._write(_name(t.name), list(t.keys or ()), t.host_indices,
                                           self._group(list(t.keys or ()), extra_info))
                for t in transfers}

    # ---- the generic path: one flat page tensor per key --------------------------------------

    @_answer_on_error(lambda *a, **k: None)
    def get(self, key: str, target_location=None, target_sizes=None):
        if target_location is None:
            raise ValueError("get needs a target_location tensor (a flat page)")
        return self.batch_get([key], [target_location])[0]

    @_answer_on_error(lambda keys, *a, **k: [None] * len(keys))
    def batch_get(self, keys: list[str], target_locations=None, target_sizes=None):
        if target_locations is None or len(target_locations) != len(keys):
            raise ValueError("batch_get needs one target tensor per key")
        done = self._read_pages(FLAT, list(keys), [[t] for t in target_locations], None)
        return [t if ok else None for t, ok in zip(target_locations, done)]

    @_answer_on_error(lambda *a, **k: False)
    def set(self, key: str, value=None, target_location=None, target_sizes=None) -> bool:
        return self.batch_set([key], [value])

    @_answer_on_error(lambda *a, **k: False)
    def batch_set(self, keys: list[str], values=None, target_locations=None,
                  target_sizes=None) -> bool:
        if values is None or len(values) != len(keys):
            raise ValueError("batch_set needs one value tensor per key")
        if not self._writes(KV):
            self._count("pages_skipped", len(keys))
            return True
        return all(self._write_pages(FLAT, list(keys), [[v] for v in values], None))

    @_answer_on_error(lambda *a, **k: False)
    def exists(self, key: str) -> bool:
        """Whether ``key``'s page is stored by either path: ``set`` writes the generic objects
        even with ``interface_v1`` on, ``batch_set_v1`` the zero-copy ones."""
        if self.pages.leading_present(FLAT, [key], 1) == 1:
            return True
        return self.zero_copy and self.pages.leading_present(
            KV, [key], self._parts_of(KV), group=self._group([key], None)) == 1

    # ---- administration ---------------------------------------------------------------------

    @_answer_on_error(lambda *a, **k: False)
    def clear(self) -> bool:
        """Make everything this namespace stored unreachable (it ages out of GCache)."""
        ok = self.pages.clear()
        log.info("gcache namespace %s cleared: %s", self.pages.prefix, ok)
        return ok

    def get_stats(self):
        if StorageMetrics is None:
            return None
        with self._stats_lock:
            metrics = StorageMetrics(**{k: list(v) for k, v in self._metrics.items()})
            for values in self._metrics.values():
                values.clear()
        return metrics

    def close(self) -> None:
        self.client.close()

    def _count(self, name: str, n: int) -> None:
        with self._stats_lock:
            self.counters[name] += n

    def _record(self, phase: str, pool: str, n_pages: int, seconds: float) -> None:
        if not self.config.enable_storage_metrics or n_pages == 0:
            return
        host_pool = self.mem_pool_host if pool in (KV, FLAT) else self.registered_pools[pool]
        gigabytes = n_pages * host_pool.page_size * host_pool.size_per_token / 1e9
        with self._stats_lock:
            self._metrics[f"{phase}_pgs"].append(n_pages)
            self._metrics[f"{phase}_bandwidth"].append(gigabytes / max(seconds, 1e-9))


def _arange(n: int):
    """Token slots ``0..n-1`` as SGLang's index tensors are (torch, int64); sglang brings
    torch, so it is imported here, not by ``gcache``."""
    import torch
    return torch.arange(n, dtype=torch.int64)

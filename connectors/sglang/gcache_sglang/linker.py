"""``GCacheLinker``: GCache as SGLang's external cache linker (direct L3, no host tier).

SGLang 0.5.23's ``UnifiedRadixCache`` links its device KV pools straight to an external store
when started with ``--enable-unified-cache-external-linker --unified-cache-external-linker-backend
dynamic --unified-cache-external-linker-config '{"linker_module_path": "gcache_sglang.linker",
"linker": "GCacheLinker", "linker_extra_config": {"gcache_servers": ...}}'``. The tree asks
``lookup`` at match time, queues ``load``s into request-private device slots at
``init_load_back``, starts them with ``start_layer_wise_loading`` before the forward, waits with
``finish_layer_wise_loading`` after it, and hands write-through chains to ``offload``. This
class does the IO and nothing else (ARCHITECTURE §2): SGLang's page hashes and device slots
into ``gcache.kv.LayeredPages`` calls.

- Objects: one per (page, model layer, K or V), under SGLang's own page hash, so a load lands
  layer by layer: layer ``l`` of every page of the batch is one ``batch_get_into`` straight into
  the pool's slots, then ``layer_done_counter.complete(l)`` lets the forward run layer ``l``
  while later layers are in flight. Where the pool is host memory (the CPU engine) the bytes
  go between the pool and GCache with no staging copy; on a GPU the SDK moves the pool's views
  (registered for NIXL when the client uses it).
- Sliding-window models: SGLang restores a sliding-window prefix only at a tree node's end
  (the window state exists there), so of the ``swa`` pages SGLang hands over with a node only
  the window tail before the node's end is stored; ``lookup`` reports only prefix lengths whose
  window tail is stored for every sliding layer (``gcache.kv.restorable_prefixes``, the
  window-safe rule), never a pseudo-hit. Where the engine's attention backend reads sliding
  layers at full-pool slot numbers (SGLang 0.5.23's ``torch_native``: ``sliding_reads``) a
  loaded window would be read from the wrong slots, so there such lookups miss and the model
  computes, its nodes still stored.
- Namespace: the model path, the weights' fingerprint (``gcache.kv.weights_fingerprint``, when
  the model is a local directory), the pipeline and context-parallel stage, the tenant
  (``gcache_namespace``) and, per layer pool, its byte format and the tensor-parallel rank.
- Failure: ``lookup`` answers a miss for anything that goes wrong (the request computes);
  ``load`` refuses what it cannot place (SGLang frees the slots and the request computes); a
  read that fails mid-load (a dead server, a timeout, a checksum mismatch) fails that batch's
  counter, and SGLang aborts exactly the requests that were loading in that batch (503,
  "External KV cache load failed") while the rest of the batch and the engine go on; a page
  that failed is deleted in every layer, so lookups stop reporting it and the next save stores
  it whole again. An offload that fails is reported as such and the tree offloads the node
  again later. Nothing raises into SGLang.
- Time: ``probe`` (a lookup), ``fetch`` (a layer's read, straight into the pool: no ``place``)
  and ``layer_wait`` (the forward's wait for a layer) in ``gcache.kv.load_phases("sglang")``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from queue import Empty, Queue
from typing import Any

from gcache.kv import (
    KV_ONLY,
    LOADER_ONLY,
    ConfigError,
    EnginePages,
    LayeredPages,
    PoolPages,
    client_from_settings,
    gcache_settings,
    leading,
    load_phases,
    restorable_prefixes,
    weights_fingerprint,
)
from gcache_sglang._compat import (
    ComponentType,
    PoolName,
    PoolTransfer,
    UnifiedCacheLinker,
    model_path_of,
    tensor_parallel_rank,
)
from gcache_sglang.linker_pools import KV, SWA, DevicePools, LayerBuffers
from gcache_sglang.load_counter import TimedLoadCounter, batch_id
from gcache_sglang.sliding_reads import MISREADING, refusal

log = logging.getLogger(__name__)

# Settings that mean something to the vLLM connector or the HiCache backend only.
REFUSED = tuple(name for name in KV_ONLY if name != "namespace") + LOADER_ONLY
SUPPORTED = {ComponentType.FULL, ComponentType.SWA}


class LoadFailed(RuntimeError):
    """Some page of a load batch did not arrive; SGLang aborts that batch's loading requests."""


def _name(pool: Any) -> str:
    return str(getattr(pool, "value", pool))


class GCacheLinker(UnifiedCacheLinker):
    """SGLang ``UnifiedCacheLinker`` over a GCache cluster (module docstring)."""

    # Attention backends on which a sliding-window model's lookups miss: they would read a
    # loaded window from the wrong slots (sliding_reads), and a wrong answer is worse than a miss.
    misreading_backends = MISREADING

    def __init__(self, server_args: Any, params: Any, *, components: Any,
                 extra_config: dict | None = None, forward_stream: Any = None) -> None:
        self.forward_stream = forward_stream
        unsupported = set(components) - SUPPORTED
        if unsupported:
            raise ValueError("gcache linker: supports full-attention and sliding-window "
                             f"components; not {sorted(str(c) for c in unsupported)}")
        extra = dict(extra_config or {})
        foreign = sorted(k for k in extra if not str(k).startswith("gcache_"))
        if foreign:
            raise ConfigError("linker_extra_config", foreign, "the gcache linker reads only "
                              "gcache_* settings (connectors/sglang/README.md)")
        settings = gcache_settings(extra, unused=REFUSED)
        self.page_size = int(params.page_size)
        self.device_pools = DevicePools(params.token_to_kv_pool_allocator.get_kvcache(),
                                        self.page_size)
        if ComponentType.SWA in set(components) and SWA not in self.device_pools.by_pool:
            raise ValueError(f"gcache linker: the tree has a sliding-window component but the "
                             f"{self.device_pools.kind} pool has no sliding layers")
        # why sliding-window loads are not served here (None: they are, or there are none)
        self.sliding_loads_off = refusal(server_args, self.misreading_backends) \
            if SWA in self.device_pools.by_pool else None
        if self.sliding_loads_off:
            log.warning("gcache linker: sliding-window loads off: %s", self.sliding_loads_off)
        window = getattr(params, "swa_retain_window", None) or 0
        self.window_pages = math.ceil(window / self.page_size) if window else 0
        # the wrapper reads which pools a linker stores from this mapping's keys
        self.pools = {PoolName(name): layers for name, layers in
                      self.device_pools.by_pool.items()}
        self.tp_rank, self.tp_size = tensor_parallel_rank(params)
        self.client = client_from_settings(settings)
        self.store = LayeredPages(self._pages(server_args, params, settings))
        self.counters = {"lookups": 0, "hit_pages": 0, "loads": 0, "loaded_pages": 0,
                         "failed_loads": 0, "offloads": 0, "offloaded_pages": 0,
                         "failed_offloads": 0, "swa_pages_skipped": 0, "errors": 0}
        self._stats_lock = threading.Lock()
        self.device_pools.register(self.client)

        self.phases = load_phases("sglang")
        self.layer_done_counter = TimedLoadCounter(self.device_pools.num_layers, self.phases)
        self.pending_loads: dict[str, list[tuple[str, list[str], list[int]]]] = {}
        self.load_queue: Queue[tuple[int, list, list] | None] = Queue()
        self.offload_queue: Queue[tuple[list, list] | None] = Queue()
        self.offload_results: Queue[bool] = Queue()
        self._threads = [threading.Thread(target=self._serve, args=(q, work), daemon=True,
                                          name=f"gcache-linker-{what}-tp{self.tp_rank}")
                         for what, q, work in (("load", self.load_queue, self._load),
                                               ("offload", self.offload_queue, self._offload))]
        for thread in self._threads:
            thread.start()
        log.info("gcache linker: %s, %s pool, %d layers (%s), tp %d/%d, window %d pages",
                 self.client, self.device_pools.kind, self.device_pools.num_layers,
                 "/".join(self.device_pools.pools()), self.tp_rank, self.tp_size,
                 self.window_pages)

    def _pages(self, server_args: Any, params: Any, settings: dict) -> EnginePages:
        model = model_path_of(server_args)
        fingerprint = None
        if model and os.path.isdir(model):
            fingerprint = weights_fingerprint(model)
        if fingerprint is None:
            log.info("gcache linker: %s is not a local model directory with safetensors; keys "
                     "name the model by path alone", model)
        label = (model or "model").replace("/", "-").strip("-")[-120:] or "model"
        namespace = {"engine": "sglang-linker", "model": model, "weights": fingerprint,
                     "pp": f"{params.pp_rank}/{params.pp_size}",
                     "attn_cp": f"{params.attn_cp_rank}/{params.attn_cp_size}",
                     "tenant": settings.get("namespace", "")}
        pages = EnginePages(self.client, f"sgl-linker/{label}", namespace)
        for layer in self.device_pools.layers:
            pages.add_pool(layer.name, **self.device_pools.layer_format(layer),
                           tp=f"{self.tp_rank}/{self.tp_size}")
        return pages

    # ---- lookup -----------------------------------------------------------------------------

    def lookup(self, rid: str, transfers: list[PoolTransfer]) -> list[int]:
        """Every prefix length (pages of the tail) whose full layers and, for sliding layers,
        window tail are all stored. A failure is a miss."""
        began = time.perf_counter()
        try:
            return self._lookup(rid, transfers)
        except Exception:
            log.exception("gcache linker: lookup of %s failed; answering a miss", rid)
            self._count("errors")
            return []
        finally:
            self.phases.add(rid, "probe", time.perf_counter() - began)

    def _lookup(self, rid: str, transfers: list[PoolTransfer]) -> list[int]:
        by_name = {_name(t.name): t for t in transfers}
        kv = by_name.get(KV)
        keys = list(kv.keys or ()) if kv is not None else []
        if not keys:
            return []
        layers = self.device_pools.layers
        found = self.store.present([(layer.name, len(layer.buffers)) for layer in layers], keys)
        full = [layer.name for layer in layers if layer.pool == KV]
        kv_pages = leading([all(found[name][i] for name in full) for i in range(len(keys))])
        restorable = list(range(1, kv_pages + 1))
        if self.sliding_loads_off:
            self._count("lookups")
            return []
        if SWA in by_name and SWA in self.device_pools.by_pool and kv_pages:
            sliding = [layer.name for layer in self.device_pools.by_pool[SWA]]
            tails = [all(found[name][i] for name in sliding) for i in range(kv_pages)]
            window = self.window_pages or len(by_name[SWA].keys or ()) or 1
            restorable = restorable_prefixes(kv_pages, tails, window)
        self._count("lookups")
        if restorable:
            self._count("hit_pages", restorable[-1])
            log.info("gcache linker hit: rid=%s pages=%d of %d (full layers stored: %d)", rid,
                     restorable[-1], len(keys), kv_pages)
        return restorable

    # ---- load -------------------------------------------------------------------------------

    def load(self, rid: str, transfers: list[PoolTransfer]) -> bool:
        """Queue ``rid``'s load into its device slots; False (SGLang frees them and the request
        computes) for anything that cannot be placed."""
        try:
            plan = [self._placed(t) for t in transfers if t.keys]
        except ValueError as exc:
            log.error("gcache linker: load of %s refused: %s", rid, exc)
            self._count("errors")
            return False
        if not plan or rid in self.pending_loads:
            if plan:
                log.error("gcache linker: a load of %s is already queued", rid)
            return False
        self.pending_loads[rid] = plan
        return True

    def _placed(self, transfer: PoolTransfer) -> tuple[str, list[str], list[int]]:
        name, keys = _name(transfer.name), list(transfer.keys or ())
        if transfer.device_indices is None:
            raise ValueError(f"pool {name}: no device indices")
        starts = self.device_pools.page_starts(name, transfer.device_indices)
        if len(starts) != len(keys):
            raise ValueError(f"pool {name}: {len(keys)} pages but {len(starts)} pages of slots")
        return name, keys, starts

    def cancel_queued_load(self, rid: str) -> bool:
        return self.pending_loads.pop(rid, None) is not None

    def start_layer_wise_loading(self) -> int:
        if not self.pending_loads:
            return -1
        pending, self.pending_loads = self.pending_loads, {}
        index = self.layer_done_counter.update_producer()
        self.load_queue.put((index, list(pending.values()), self._ready_events()))
        self._count("loads", len(pending))
        return index

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        return self.layer_done_counter.finish(counter_index)

    def _load(self, index: int, plans: list, ready: list) -> None:
        """Read the batch layer by layer, completing each layer as it lands."""
        try:
            for event in ready:
                event.synchronize()
            merged: dict[str, tuple[list[str], list[int]]] = {}
            for plan in plans:
                for name, keys, starts in plan:
                    into = merged.setdefault(name, ([], []))
                    into[0].extend(keys)
                    into[1].extend(starts)
            for layer in self.device_pools.layers:
                if layer.pool in merged:
                    self._read_layer(index, layer, *merged[layer.pool])
                self.layer_done_counter.complete(index, layer.layer)
            self._count("loaded_pages", sum(len(keys) for keys, _ in merged.values()))
        except BaseException as exc:
            if not isinstance(exc, LoadFailed):            # _read_layer counted and failed it
                self._count("failed_loads")
                self.layer_done_counter.fail(index, exc)
            log.error("gcache linker: load batch %d failed (%s); SGLang aborts its loading "
                      "requests", index, exc)

    def _read_layer(self, index: int, layer: LayerBuffers, keys: list[str],
                    starts: list[int]) -> None:
        parts = self.device_pools.regions(layer, starts, self.page_size)
        began = time.perf_counter()
        done = self.store.read(layer.name, keys, parts)
        self.phases.add(batch_id(index), "fetch", time.perf_counter() - began)
        self.phases.placed(batch_id(index), sum(part.nbytes for page in parts for part in page))
        if all(done):
            return
        error = LoadFailed(f"layer {layer.layer} ({layer.pool}): {len(done) - sum(done)} of "
                           f"{len(done)} pages did not arrive")
        # dropped before the counter fails, so the request that SGLang aborts and retries, or
        # the next save, never finds half of such a page
        failed = [key for key, ok in zip(keys, done) if not ok]
        self.store.drop([(other.name, len(other.buffers))
                         for other in self.device_pools.by_pool[layer.pool]], failed)
        self._count("failed_loads")
        self.layer_done_counter.fail(index, error)
        raise error

    # ---- offload ----------------------------------------------------------------------------

    def offload(self, transfers: list[PoolTransfer], session_id: str | None = None) -> bool:
        """Queue a node's pages (every layer of each pool) for storing."""
        try:
            plan = [self._window_tail(*self._placed(t)) for t in transfers if t.keys]
        except ValueError as exc:
            log.error("gcache linker: offload refused: %s", exc)
            self._count("errors")
            return False
        if not plan:
            return False
        self.offload_queue.put((plan, self._ready_events()))
        return True

    def _window_tail(self, name: str, keys: list[str],
                     starts: list[int]) -> tuple[str, list[str], list[int]]:
        """A node's sliding-layer pages reduced to its window tail: SGLang offloads a whole
        node, and restores only at node boundaries (``lookup`` asks for the window before one),
        so the sliding pages further back than ``window_pages`` from the node's end are never
        read; every full-layer page is kept."""
        if name != SWA or not self.window_pages or len(keys) <= self.window_pages:
            return name, keys, starts
        self._count("swa_pages_skipped", len(keys) - self.window_pages)
        return name, keys[-self.window_pages:], starts[-self.window_pages:]

    def _offload(self, plan: list, ready: list) -> None:
        ok = False
        try:
            for event in ready:
                event.synchronize()
            batches = [PoolPages(layer.name, keys,
                                 self.device_pools.regions(layer, starts, self.page_size))
                       for name, keys, starts in plan
                       for layer in self.device_pools.by_pool[name]]
            ok = all(self.store.write(batches))
            self._count("offloads" if ok else "failed_offloads")
            if ok:
                self._count("offloaded_pages", sum(len(keys) for _, keys, _ in plan))
        except Exception:
            log.exception("gcache linker: offload failed")
            self._count("failed_offloads")
        finally:
            self.offload_results.put(ok)

    def num_completed_offloads(self) -> int:
        return self.offload_results.qsize()

    def pop_completed_offload(self) -> bool:
        return self.offload_results.get_nowait()

    # ---- lifecycle --------------------------------------------------------------------------

    def reset(self) -> None:
        self.pending_loads.clear()
        self.load_queue.join()
        self.offload_queue.join()
        while True:
            try:
                self.offload_results.get_nowait()
            except Empty:
                break
        self.layer_done_counter.reset()

    def close(self) -> None:
        self.reset()
        for q in (self.load_queue, self.offload_queue):
            q.put(None)
        for thread in self._threads:
            thread.join(timeout=30)
        log.info("gcache linker counters: %s", self.counters)
        self.client.close()

    # ---- helpers ----------------------------------------------------------------------------

    def _ready_events(self) -> list:
        """Events a transfer waits on before it touches device pages (a GPU's streams); a CPU
        engine's forward has finished writing them when the tree calls us."""
        if self.device_pools.device.type == "cpu":
            return []
        return self.record_offload_ready()

    @staticmethod
    def _serve(queue: Queue, work: Any) -> None:
        while True:
            task = queue.get()
            try:
                if task is None:
                    return
                work(*task)
            except BaseException:
                log.exception("gcache linker: worker task failed")
            finally:
                queue.task_done()

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self.counters[name] += n

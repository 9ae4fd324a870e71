"""The connector in each vLLM worker: KV moves between vLLM's paged layers and ``gcache.kv``.

``gcache.kv`` moves token-major bytes; ``paged.PagedLayer`` reads vLLM's layouts (CPU and GPU
backends) as such rows, and ``staging.Transfers`` moves them between the device and host
memory. A load fetches into one host buffer per layer (``KVStore.load``, layer by layer on its
loader thread) and ``wait_for_layer_load`` waits for that layer's bytes, copies them to the
device on the load stream and scatters them into the request's blocks, so layer 0 computes
while later layers are in flight. A save gathers the layer's blocks on the device right after
its attention (``save_kv_layer``), starts their copy to pinned host memory on the save stream
and hands them to a saver thread that puts them once the copy is done; the forward pass goes
on, and ``wait_for_save`` waits for the step's puts.

An asynchronous load (``LoadSpec.asynchronous``: vLLM has parked the request) is fetched the
same way but applied whole, after the forward pass of the first step in which all of it has
arrived (``get_finished``), and reported there as received; a failure is reported in that same
step, as vLLM requires: as blocks with one KV cache group, as the request (``failed_recving``)
with several, whose block ids vLLM cannot map back. A save at finish (a finished request's
prompt and answer, whose blocks vLLM keeps for it) gathers every layer outside the forward pass
and is reported as sent by ``get_finished`` once each layer is put or has failed.

A synchronous load belongs to the step whose metadata carries it, and to no other: vLLM starts a
step's loads before the forward pass only when the step has synchronous loads, and otherwise
calls ``start_load_kv`` after it, so a layer hook may run before this step's ``start_load``.
Loads are kept with the metadata object they came from and applied only while that object is
bound, and dropped when vLLM clears it (``end_step``): the previous step's loads are never
scattered into blocks vLLM has since reused, nor their failures reported twice.

Sliding-window groups hold only in-window blocks: the others are the null block 0, which is
never read or written. Full-attention layers get every page, sliding layers only the window
tail (``gcache.kv``'s rule), so the tail always covers the blocks vLLM keeps.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gcache.kv import load_phases
from gcache_vllm.paged import NULL_BLOCK, PagedLayer
from gcache_vllm.staging import (
    DEFAULT_PINNED_BYTES,
    GatheredSource,
    StagingSink,
    Transfers,
)

if TYPE_CHECKING:                        # metadata subclasses vLLM's; this module runs without
    from gcache_vllm.metadata import GCacheConnectorMetadata, LoadSpec, SaveSpec

IDLE_WAIT_S = 0.01       # an empty step waits this long at most for an asynchronous load

# Under vLLM's own logger (``_compat.get_logger``), without importing vLLM here: this module
# runs on GPU hosts' check machines that have torch but no vLLM.
log = logging.getLogger(f"vllm.{__name__}")


class WorkerSide:
    """``layer_index`` maps vLLM's layer names to model layers (``_compat.layer_index`` in the
    connector; the GPU checks, which run without vLLM, pass their own)."""

    def __init__(self, store: Any, layout: Any, group_of: dict[str, int], *,
                 layer_index: Callable[[str], int],
                 pinned_bytes: int = DEFAULT_PINNED_BYTES) -> None:
        self.store, self.layout, self.group_of = store, layout, group_of
        self.pinned_bytes = pinned_bytes
        # vLLM maps failed block ids back to requests only when block ids are unique, i.e.
        # with one KV cache group; with more, a failed load is reported by request
        self.block_failures = len(set(group_of.values())) <= 1
        self.layer_index = layer_index
        self.layers: dict[str, tuple[int, PagedLayer]] = {}
        self.transfers: Transfers | None = None
        self._loads: list[tuple[LoadSpec, Any, StagingSink]] = []
        self._async_loads: dict[str, tuple[LoadSpec, Any, StagingSink]] = {}
        self._finish_left: dict[str, int] = {}                  # req id -> layers to put
        self._finish_done: set[str] = set()
        self._finish_lock = threading.Lock()                    # the saver thread counts down
        self._loads_of: GCacheConnectorMetadata | None = None    # the metadata they came from
        self._load_errors: set[int] = set()
        self._failed_requests: set[str] = set()                # async loads, by request
        self._saves: queue.Queue = queue.Queue()
        self._plans: dict[tuple[str, int], Any] = {}
        self._saver = threading.Thread(target=self._save_loop, name="gcache-vllm-save",
                                       daemon=True)
        self._saver.start()
        self.counters = {"loads": 0, "async_loads": 0, "loaded_layers": 0, "failed_layers": 0,
                         "saved_layers": 0, "save_errors": 0, "skipped_saves": 0,
                         "bytes_loaded": 0, "bytes_saved": 0}
        self._reported: dict[str, int] = {}                     # counters at the last report
        self._samples: dict[str, list[Any]] = {"load_wait_s": [], "save_s": [], "load_times": []}
        self._samples_lock = threading.Lock()     # counters and samples: the saver adds too
        self.phases = load_phases("vllm")         # fetch, place, layer_wait, save_wait

    # ---- registration -----------------------------------------------------------------------

    def register(self, kv_caches: dict[str, Any]) -> None:
        for name, tensor in kv_caches.items():
            index = self.layer_index(name)
            paged = PagedLayer(tensor, self.layout.page_size, name=f"layer {name}")
            expected = self.layout.layer_bytes_per_token(index)
            if paged.bytes_per_token != expected:
                raise ValueError(f"layer {name}: vLLM holds {paged.bytes_per_token} KV bytes per "
                                 f"token, the model config gives {expected} (heads, head sizes "
                                 "or dtype disagree)")
            if self.transfers is None:
                self.transfers = Transfers(tensor.device, pinned_bytes=self.pinned_bytes,
                                           client=self.store.client)
            elif tensor.device != self.transfers.device:
                raise ValueError(f"layer {name} is on {tensor.device}, other layers on "
                                 f"{self.transfers.device}; one worker drives one device")
            self.layers[name] = (index, paged)

    # ---- load -------------------------------------------------------------------------------

    def start_load(self, meta: GCacheConnectorMetadata | None) -> None:
        self._release_loads()
        self._loads_of = meta
        for spec in (meta.loads if meta else ()):
            hit = len(spec.token_ids)
            sink = StagingSink(self.transfers, self.layout.layer_bytes_per_token,
                               lambda layer, hit=hit: self.store.load_span(layer, hit))
            try:
                handle = self.store.load(spec.token_ids, len(spec.token_ids), sink)
            except Exception:
                log.exception("gcache load of %s could not start", spec.req_id)
                sink.release()
                self._fail(spec)
                if spec.asynchronous:                      # vLLM waits for its report
                    self._async_loads[spec.req_id] = (spec, None, sink)
                continue
            if spec.asynchronous:
                self._async_loads[spec.req_id] = (spec, handle, sink)
                self._count("async_loads", 1)
            else:
                self._loads.append((spec, handle, sink))
                self._count("loads", 1)
        for spec in (meta.saves_at_finish if meta else ()):
            self._save_at_finish(spec)

    def wait_layer(self, layer_name: str, meta: GCacheConnectorMetadata | None) -> None:
        if layer_name not in self.layers or not self._loads or meta is not self._loads_of:
            return                            # no load of this step (see the module docstring)
        for spec, handle, sink in self._loads:
            self._apply_layer(layer_name, spec, handle, sink)

    def _apply_layer(self, layer_name: str, spec: LoadSpec, handle: Any,
                     sink: StagingSink) -> None:
        """Wait for one layer of a load, then copy it into the request's blocks (or report
        the load failed)."""
        index, paged = self.layers[layer_name]
        if index not in sink.spans:
            return                                         # nothing of this layer to load
        waited = time.perf_counter()
        handle.wait_layer(index)
        placing = time.perf_counter()
        self._sample("load_wait_s", placing - waited)
        self.phases.add(spec.req_id, "layer_wait", placing - waited)
        if index in handle.failed_layers:
            self._count("failed_layers", 1)
            self._fail(spec)
            return
        start, stop, host = sink.spans[index]
        staged, sink.copied[index] = self.transfers.to_device(host)
        self._count("bytes_loaded", host.numel())
        paged.scatter(spec.block_ids[self.group_of[layer_name]], start, stop, staged,
                      spec.skip_tokens)
        self.phases.add(spec.req_id, "place", time.perf_counter() - placing)
        self.phases.placed(spec.req_id, host.numel())
        self._count("loaded_layers", 1)

    def get_finished(self, meta: GCacheConnectorMetadata | None = None,
                     ) -> tuple[set[str], set[str], set[str]]:
        """(finish saves done, asynchronous loads done, those of them that failed) since the
        last call. A load is applied here, after the forward pass, once all of it has arrived:
        its blocks are the parked request's alone, and the next forward pass is queued after
        these copies. In a step with nothing to compute (``meta.idle``: every request waits
        for a load) this waits ``IDLE_WAIT_S`` at most for a load to arrive: vLLM's engine
        loop would otherwise run empty steps back to back, and its Python held the GIL the
        loader threads need (a parked 8K-token load fetched at a third of its speed)."""
        if meta is not None and meta.idle:
            pending = [h for _, h, _ in self._async_loads.values() if h is not None and not h.done]
            if pending:
                pending[0].wait(IDLE_WAIT_S)
        received = set()
        for req_id, (spec, handle, sink) in list(self._async_loads.items()):
            if handle is not None and not handle.done:
                continue
            if handle is not None:
                for name in self.layers:
                    self._apply_layer(name, spec, handle, sink)
                self._measured(spec, handle)
            sink.release()
            received.add(req_id)
            del self._async_loads[req_id]
        with self._finish_lock:
            sent, self._finish_done = self._finish_done, set()
        failed, self._failed_requests = self._failed_requests & received, \
            self._failed_requests - received
        return sent, received, failed

    def end_step(self) -> None:
        """vLLM cleared the step's metadata: its loads are over, applied or not."""
        self._release_loads()
        self._loads_of = None

    def _release_loads(self) -> None:
        # A load whose layers were not all waited for (their hooks never ran, or the step
        # ended early) is still fetching: the loader writes into the sink's pooled buffers
        # until it is done, on CPU as on CUDA. Releasing them first handed those buffers to
        # the next load while still being written, and let a closing client be torn down
        # under a fetch in flight (a heap corruption in the core suite once).
        for spec, handle, sink in self._loads:
            handle.wait()
            self._measured(spec, handle)
            sink.release()
        self._loads = []

    def _measured(self, spec: LoadSpec, handle: Any) -> None:
        """A whole load's time, for the scheduler's load-or-recompute choice (LoadCost)."""
        if handle is not None and handle.elapsed_s and not handle.failed_layers:
            self.phases.add(spec.req_id, "fetch", handle.elapsed_s)
            with self._samples_lock:
                self._samples["load_times"].append([len(spec.token_ids), handle.elapsed_s])

    def _fail(self, spec: LoadSpec) -> None:
        """Report every block of the load, or the request where block ids are not unique:
        vLLM recomputes them (kv_load_failure_policy)."""
        if not self.block_failures:
            if not spec.asynchronous:
                log.error("gcache load of %s failed in a synchronous load of a hybrid model, "
                          "which vLLM cannot take back; its output may be wrong", spec.req_id)
                return
            self._failed_requests.add(spec.req_id)
            return
        page = self.layout.page_size        # blocks before skip_tokens are vLLM's own (shared)
        self._load_errors.update(b for group in spec.block_ids
                                 for b in group[spec.skip_tokens // page:
                                                len(spec.token_ids) // page]
                                 if b != NULL_BLOCK)

    def take_load_errors(self) -> set[int]:
        """The blocks to recompute. vLLM asks after the forward pass: a bound load with a layer
        that was neither scattered nor failed by then (its hook never ran) left blocks vLLM
        takes as computed, so they are reported too, once."""
        for spec, handle, sink in self._loads:
            unapplied = set(sink.spans) - set(sink.copied) - set(handle.failed_layers)
            if unapplied and not sink.reported:
                log.error("gcache load of %s: layers %s were never applied", spec.req_id,
                          sorted(unapplied))
                self._fail(spec)
            sink.reported = True
        errors, self._load_errors = self._load_errors, set()
        return errors

    # ---- save -------------------------------------------------------------------------------

    def save_layer(self, layer_name: str, meta: GCacheConnectorMetadata | None) -> None:
        """Gather the layer's saved tokens on its device and start their copy to the host;
        the saver thread puts them once the copy is done. Never waits for the GPU."""
        if layer_name not in self.layers or not meta or not meta.saves:
            return
        for spec in meta.saves:
            self._start_save(layer_name, spec)

    def _save_at_finish(self, spec: SaveSpec) -> None:
        with self._finish_lock:
            self._finish_left[spec.req_id] = len(self.layers)
        for name in self.layers:
            if not self._start_save(name, spec, at_finish=True):
                self._finish_one(spec.req_id)

    def _start_save(self, layer_name: str, spec: SaveSpec, *, at_finish: bool = False) -> bool:
        """Queue one layer of ``spec`` for the saver; False when nothing was queued."""
        index, paged = self.layers[layer_name]
        ids = spec.block_ids[self.group_of[layer_name]]
        stop = len(spec.token_ids)
        first = paged.held_from(ids, stop)
        if first and not self.layout.is_swa(index):        # a full layer must hold every page
            self._count("skipped_saves", 1)
            return False
        try:
            host, copied = self.transfers.to_host(paged.gather(ids, first, stop))
        except Exception:
            self._count("save_errors", 1)
            log.exception("gcache save of %s layer %d could not start", spec.req_id, index)
            return False
        self._saves.put((spec, index, host, copied, first, at_finish))
        return True

    def _finish_one(self, req_id: str) -> None:
        with self._finish_lock:
            left = self._finish_left.get(req_id)
            if left is None:
                return
            if left <= 1:
                del self._finish_left[req_id]
                self._finish_done.add(req_id)
            else:
                self._finish_left[req_id] = left - 1

    def wait_saves(self, req_ids: tuple[str, ...] = ()) -> None:
        """Wait for the step's saves (``req_ids``: the requests whose saves they are, which
        the wait is counted against)."""
        waited = time.perf_counter()
        self._saves.join()
        self._plans.clear()
        for req_id in req_ids:
            self.phases.add(req_id, "save_wait", time.perf_counter() - waited)

    def close(self) -> None:
        """Finish what is in flight: queued saves, and loads still writing into pooled
        buffers."""
        self.wait_saves()
        self._release_loads()
        for _, handle, sink in self._async_loads.values():
            if handle is not None:
                handle.wait()
            sink.release()
        self._async_loads = {}

    def _save_loop(self) -> None:
        bound = None
        while True:
            spec, index, host, copied, first, at_finish = self._saves.get()
            try:
                if bound is not self.transfers:
                    self.transfers.bind_thread()
                    bound = self.transfers
                copied.synchronize()
                self._save(spec, index, host, first)
            except Exception:
                self._count("save_errors", 1)
                log.exception("gcache save of %s layer %d failed", spec.req_id, index)
            finally:
                self.transfers.release(host)
                if at_finish:
                    self._finish_one(spec.req_id)
                self._saves.task_done()

    def _save(self, spec: SaveSpec, index: int, host: Any, first: int) -> None:
        key = (spec.req_id, len(spec.token_ids))          # a prefill's and a finish's save
        plan = self._plans.get(key)
        if plan is None:                        # one plan for every layer of this save
            plan = self._plans[key] = self.store.plan_save(spec.token_ids)
        source = GatheredSource(self.layout, host, first)
        started = time.perf_counter()
        result = self.store.save(spec.token_ids, source, plan=plan, layers=[index])
        self._sample("save_s", time.perf_counter() - started)
        self._count("saved_layers", 1)
        self._count("bytes_saved", result.bytes_written)
        if result.objects_failed:
            self._count("save_errors", 1)

    # ---- stats ------------------------------------------------------------------------------

    def _count(self, name: str, n: int) -> None:
        with self._samples_lock:                # the forward thread and the saver both count
            self.counters[name] += n

    def _sample(self, name: str, seconds: float) -> None:
        with self._samples_lock:
            self._samples[name].append(seconds)

    def take_stats(self) -> dict[str, Any]:
        """What changed since the last call: counter increments and latency samples."""
        from gcache_vllm.stats import take_delta  # here: stats imports vLLM, this module not
        with self._samples_lock:
            counters = dict(self.counters)
        data: dict[str, Any] = take_delta(counters, self._reported)
        with self._samples_lock:
            for name, samples in self._samples.items():
                if samples:
                    data[name], self._samples[name] = samples, []
        return data

"""The connector in each vLLM worker: KV moves between vLLM's paged layers and ``gcache.kv``.

vLLM keeps a layer as ``[blocks, kv heads, block tokens, K‖V]``; ``gcache.kv`` moves token-major
bytes. A load fetches into a staging buffer per layer (``KVStore.load``, layer by layer on its
loader thread) and ``wait_for_layer_load`` scatters that layer into the request's blocks once it
has arrived, so layer 0 computes while later layers are in flight. A save gathers the layer's
tokens from its blocks right after its attention (``save_kv_layer``) and hands them to a saver
thread that puts them; the forward pass goes on, and ``wait_for_save`` waits for the step's puts.

A load belongs to the step whose metadata carries it, and to no other: vLLM starts a step's
loads before the forward pass only when the step has synchronous loads, and otherwise calls
``start_load_kv`` after it, so a layer hook may run before this step's ``start_load``. Loads are
kept with the metadata object they came from and applied only while that object is bound, and
dropped when vLLM clears it (``end_step``): the previous step's loads are never scattered into
blocks vLLM has since reused, nor their failures reported twice.

Sliding-window groups hold only in-window blocks: the others are the null block 0, which is
never read or written. Full-attention layers get every page, sliding layers only the window
tail (``gcache.kv``'s rule), so the tail always covers the blocks vLLM keeps.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import torch

from gcache_vllm._compat import get_logger, layer_index
from gcache_vllm.metadata import GCacheConnectorMetadata, LoadSpec, SaveSpec

log = get_logger(__name__)

NULL_BLOCK = 0


class PagedLayer:
    """One layer's paged KV and the block table of its group, as token-major rows."""

    def __init__(self, tensor: Any, page: int) -> None:
        self.tensor, self.page = tensor, page

    def rows(self, block_ids: list[int], start: int, stop: int):
        """(blocks, offsets, keep) of tokens ``[start, stop)``; ``keep`` drops null blocks."""
        tokens = torch.arange(start, stop)
        table = torch.tensor(block_ids, dtype=torch.long)
        blocks = table[tokens // self.page]
        return blocks, tokens % self.page, blocks != NULL_BLOCK

    def gather_held(self, block_ids: list[int], stop: int):
        """``(first, rows)``: the tokens ``[first, stop)`` that the layer still holds (every
        block from ``first`` on is a real block), as one contiguous ``[tokens, heads, K‖V]``
        tensor; ``first == stop`` when none are held."""
        blocks, offsets, keep = self.rows(block_ids, 0, stop)
        missing = (~keep).nonzero()
        first = int(missing[-1]) + 1 if len(missing) else 0
        return first, self.tensor[blocks[first:], :, offsets[first:], :].contiguous()

    def scatter(self, block_ids: list[int], start: int, stop: int, staged, skip: int) -> None:
        """Write staged tokens ``[start, stop)`` into their blocks, except null blocks and the
        tokens before ``skip`` (vLLM's own prefix cache holds them)."""
        blocks, offsets, keep = self.rows(block_ids, start, stop)
        keep &= torch.arange(start, stop) >= skip
        heads, width = self.tensor.shape[1], self.tensor.shape[3]
        rows = staged.view(self.tensor.dtype).view(stop - start, heads, width)
        self.tensor[blocks[keep], :, offsets[keep], :] = rows[keep]


class StagingSink:
    """``gcache.kv.KVSink`` for one load: a token-major staging buffer per span the load asks
    for (every page of a full layer, the window tail of a sliding one)."""

    def __init__(self, layout: Any) -> None:
        self.layout = layout
        self.spans: dict[int, dict[int, tuple[int, Any]]] = {}   # layer -> start -> (stop, buf)

    def write_target(self, layer: int, start: int, stop: int):
        buf = torch.empty((stop - start) * self.layout.layer_bytes_per_token(layer),
                          dtype=torch.uint8)
        self.spans.setdefault(layer, {})[start] = (stop, buf)
        return buf

    def staged(self, layer: int):
        """(start, stop, bytes) of everything staged for ``layer``: its spans are contiguous."""
        parts = self.spans[layer]
        starts = sorted(parts)
        return starts[0], parts[starts[-1]][0], torch.cat([parts[s][1] for s in starts])


class _GatheredSource:
    """``gcache.kv.KVSource`` over one layer's gathered tokens ``[first, n)``; earlier tokens
    (out of a sliding window) are not held, which ``KVStore.save`` takes as "skip that tail"."""

    def __init__(self, layout: Any, rows: Any, first: int) -> None:
        self.layout, self.first = layout, first
        self.flat = rows.reshape(-1).view(torch.uint8)

    def read(self, layer: int, start: int, stop: int):
        if start < self.first:
            return None
        bpt = self.layout.layer_bytes_per_token(layer)
        return self.flat[(start - self.first) * bpt:(stop - self.first) * bpt]


class WorkerSide:
    def __init__(self, store: Any, layout: Any, group_of: dict[str, int]) -> None:
        self.store, self.layout, self.group_of = store, layout, group_of
        self.layers: dict[str, tuple[int, PagedLayer]] = {}
        self._loads: list[tuple[LoadSpec, Any, StagingSink]] = []
        self._loads_of: GCacheConnectorMetadata | None = None    # the metadata they came from
        self._load_errors: set[int] = set()
        self._saves: queue.Queue = queue.Queue()
        self._probes: dict[str, Any] = {}
        self._saver = threading.Thread(target=self._save_loop, name="gcache-vllm-save",
                                       daemon=True)
        self._saver.start()
        self.counters = {"loads": 0, "loaded_layers": 0, "failed_layers": 0,
                         "saved_layers": 0, "save_errors": 0, "skipped_saves": 0}

    # ---- registration -----------------------------------------------------------------------

    def register(self, kv_caches: dict[str, Any]) -> None:
        for name, tensor in kv_caches.items():
            index = layer_index(name)
            if tensor.dim() != 4:
                raise ValueError(f"layer {name}: KV tensor of shape {tuple(tensor.shape)}; "
                                 "gcache_vllm needs vLLM's [blocks, heads, tokens, K‖V] layout")
            per_token = tensor.shape[1] * tensor.shape[3] * tensor.element_size()
            expected = self.layout.layer_bytes_per_token(index)
            if per_token != expected:
                raise ValueError(f"layer {name}: vLLM holds {per_token} KV bytes per token, the "
                                 f"model config gives {expected} (heads, head sizes or dtype "
                                 "disagree)")
            self.layers[name] = (index, PagedLayer(tensor, self.layout.page_size))

    # ---- load -------------------------------------------------------------------------------

    def start_load(self, meta: GCacheConnectorMetadata | None) -> None:
        self._loads, self._loads_of = [], meta
        for spec in (meta.loads if meta else ()):
            sink = StagingSink(self.layout)
            try:
                handle = self.store.load(spec.token_ids, len(spec.token_ids), sink)
            except Exception:                              # noqa: BLE001 - a failed load
                log.exception("gcache load of %s could not start", spec.req_id)
                self._fail(spec)
                continue
            self._loads.append((spec, handle, sink))
            self.counters["loads"] += 1

    def wait_layer(self, layer_name: str, meta: GCacheConnectorMetadata | None) -> None:
        if layer_name not in self.layers or not self._loads or meta is not self._loads_of:
            return                            # no load of this step (see the module docstring)
        index, paged = self.layers[layer_name]
        for spec, handle, sink in self._loads:
            if index not in sink.spans:
                continue                                   # nothing of this layer to load
            handle.wait_layer(index)
            if index in handle.failed_layers:
                self.counters["failed_layers"] += 1
                self._fail(spec)
                continue
            start, stop, staged = sink.staged(index)
            paged.scatter(spec.block_ids[self.group_of[layer_name]], start, stop, staged,
                          spec.skip_tokens)
            self.counters["loaded_layers"] += 1

    def end_step(self) -> None:
        """vLLM cleared the step's metadata: its loads are over, applied or not."""
        self._loads, self._loads_of = [], None

    def _fail(self, spec: LoadSpec) -> None:
        """Report every block of the load: vLLM recomputes them (kv_load_failure_policy)."""
        self._load_errors.update(b for group in spec.block_ids
                                 for b in group[:len(spec.token_ids) // self.layout.page_size]
                                 if b != NULL_BLOCK)

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # ---- save -------------------------------------------------------------------------------

    def save_layer(self, layer_name: str, meta: GCacheConnectorMetadata | None) -> None:
        if layer_name not in self.layers or not meta or not meta.saves:
            return
        index, paged = self.layers[layer_name]
        for spec in meta.saves:
            ids = spec.block_ids[self.group_of[layer_name]]
            first, rows = paged.gather_held(ids, len(spec.token_ids))
            if first and not self.layout.is_swa(index):    # a full layer must hold every page
                self.counters["skipped_saves"] += 1
                continue
            self._saves.put((spec, index, rows, first))

    def wait_saves(self) -> None:
        self._saves.join()
        self._probes.clear()

    def _save_loop(self) -> None:
        while True:
            spec, index, rows, first = self._saves.get()
            try:
                self._save(spec, index, rows, first)
            except Exception:                              # noqa: BLE001 - never kill the thread
                self.counters["save_errors"] += 1
                log.exception("gcache save of %s layer %d failed", spec.req_id, index)
            finally:
                self._saves.task_done()

    def _save(self, spec: SaveSpec, index: int, rows: Any, first: int) -> None:
        probe = self._probes.get(spec.req_id)
        if probe is None:
            probe = self._probes[spec.req_id] = self.store.probe(spec.token_ids)
        source = _GatheredSource(self.layout, rows, first)
        result = self.store.save(spec.token_ids, source, probe=probe, layers=[index])
        self.counters["saved_layers"] += 1
        if result.objects_failed:
            self.counters["save_errors"] += 1

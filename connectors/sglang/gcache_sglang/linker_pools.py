"""The engine's device KV pools as the GCache linker reads and writes them.

SGLang's linker contract hands a backend device slot indices (``PoolTransfer.device_indices``)
of one of two pools: ``kv`` (the full-attention layers) and, for sliding-window models, ``swa``
(the sliding layers' own, smaller pool). What lives where is the engine's: an
``MHATokenToKVPool`` keeps one K and one V tensor per layer, ``[slots, heads, head_dim]``, and
an ``SWAKVPool`` holds two of them, with ``layers_mapping`` saying which model layer is which.
SGLang 0.5.23 builds no linker pool view for these two pool types (its assembler has one only
for DeepSeek-V4, DSA and Mamba models), so this module is that view, read from the pools'
own attributes.

Invariants: a page is ``page_size`` consecutive slots starting at a multiple of ``page_size``
(SGLang's paged allocator hands out nothing else; anything else is refused, naming the pool),
so one layer's K (or V) of one page is one contiguous range of its tensor. Every buffer given
out is a view of the pool tensor itself: reads land in the pool and writes leave from it with
no copy on a CPU engine; on a GPU the SDK moves the views (registered for NIXL when it can).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

KV = "kv"
SWA = "swa"


@dataclass(frozen=True)
class LayerBuffers:
    """One model layer: the pool that holds it and its per-slot buffers (K then V)."""

    layer: int                        # model layer, 0-based within this pipeline stage
    pool: str                         # KV or SWA
    buffers: tuple[torch.Tensor, ...]

    @property
    def name(self) -> str:
        """The layer's pool name in GCache keys."""
        return f"{self.pool}.{self.layer}"


class DevicePools:
    """Per model layer, where its KV lives, and each page's buffers as tensor views."""

    def __init__(self, kvcache: Any, page_size: int) -> None:
        self.page_size = page_size
        self.kind = type(kvcache).__name__
        self.layers = _layers(kvcache)
        self.by_pool: dict[str, list[LayerBuffers]] = {}
        for layer in self.layers:
            self.by_pool.setdefault(layer.pool, []).append(layer)
            for buf in layer.buffers:
                if buf.dim() < 1 or not buf[:page_size].is_contiguous():
                    raise ValueError(f"gcache linker: layer {layer.layer} of the {layer.pool} "
                                     f"pool has a buffer whose slots are not contiguous "
                                     f"(shape {tuple(buf.shape)}, strides {buf.stride()})")
        self.device = self.layers[0].buffers[0].device

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def pools(self) -> list[str]:
        return sorted(self.by_pool)

    def register(self, client: Any) -> None:
        """Register the pools' tensors with ``client`` for NIXL, each once (a no-op for TCP and
        shared memory); a failure leaves transfers on bounce buffers, logged."""
        seen: set[tuple[int, int]] = set()
        for layer in self.layers:
            for buf in layer.buffers:
                span = (buf.data_ptr(), buf.numel() * buf.element_size())
                if span in seen:
                    continue
                seen.add(span)
                try:
                    if not client.register_buffer(buf):
                        return                      # this client never uses NIXL
                except Exception:
                    log.exception("gcache linker: registering a pool buffer failed; its "
                                  "transfers take bounce buffers")
                    return

    def layer_format(self, layer: LayerBuffers) -> dict[str, str]:
        """What fixes the meaning of a layer's page bytes (for its key namespace)."""
        return {"class": self.kind, "pool": layer.pool, "layer": str(layer.layer),
                "page_size": str(self.page_size),
                "buffers": ";".join(f"{b.dtype}{tuple(b.shape[1:])}" for b in layer.buffers)}

    def page_starts(self, pool: str, indices: torch.Tensor) -> list[int]:
        """The first slot of each page of ``indices`` (token slots of ``pool``, page by page)."""
        if pool not in self.by_pool:
            raise ValueError(f"gcache linker: no {pool!r} pool in this engine; it has "
                             f"{self.pools()}")
        page = self.page_size
        slots = indices.detach().to(device="cpu", dtype=torch.int64).flatten()
        if slots.numel() % page:
            raise ValueError(f"gcache linker: {slots.numel()} {pool} slots are not whole pages "
                             f"of {page}")
        if not slots.numel():
            return []
        pages = slots.view(-1, page)
        starts = pages[:, 0]
        if bool((starts % page).any()) or \
                not torch.equal(pages, starts[:, None] + torch.arange(page)):
            raise ValueError(f"gcache linker: {pool} slots are not page-aligned runs of {page}")
        rows = self.by_pool[pool][0].buffers[0].shape[0]
        if int(starts.min()) < 0 or int(starts.max()) + page > rows:
            raise ValueError(f"gcache linker: {pool} slots outside the pool's {rows} rows")
        return [int(s) for s in starts.tolist()]

    @staticmethod
    def regions(layer: LayerBuffers, starts: Sequence[int], page_size: int) -> list[list[Any]]:
        """Per page, the layer's buffers' views of that page (K then V): the pool's memory."""
        return [[buf[s:s + page_size] for buf in layer.buffers] for s in starts]


def _layers(kvcache: Any) -> list[LayerBuffers]:
    """Model layers in order, read from an ``MHATokenToKVPool`` or an ``SWAKVPool`` of two."""
    full = getattr(kvcache, "full_kv_pool", None)
    swa = getattr(kvcache, "swa_kv_pool", None)
    mapping = getattr(kvcache, "layers_mapping", None)
    if full is not None and swa is not None and mapping is not None:
        start = int(getattr(kvcache, "start_layer", 0) or 0)
        layers = []
        for global_id in sorted(mapping):
            local, is_swa = mapping[global_id]
            pool = swa if is_swa else full
            k, v = _mha_buffers(pool, f"the {'swa' if is_swa else 'full'} sub-pool")
            layers.append(LayerBuffers(global_id - start, SWA if is_swa else KV,
                                       (k[local], v[local])))
        _check_order(layers, type(kvcache).__name__)
        return layers
    k, v = _mha_buffers(kvcache, type(kvcache).__name__)
    return [LayerBuffers(i, KV, (k[i], v[i])) for i in range(len(k))]


def _mha_buffers(pool: Any, what: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    k, v = getattr(pool, "k_buffer", None), getattr(pool, "v_buffer", None)
    if not k or not v or len(k) != len(v):
        raise ValueError(f"gcache linker: {what} ({type(pool).__name__}) is not a K/V pool; "
                         "supported: MHATokenToKVPool and SWAKVPool of two (MLA, DSA, "
                         "DeepSeek-V4 and Mamba pools are not)")
    if getattr(pool, "k_scale_buffer", None) is not None or \
            getattr(pool, "native_k_scale_buffer", None) is not None:
        raise ValueError(f"gcache linker: {what} keeps KV scales beside its KV (a scaled "
                         "quantized cache); the linker stores only plain K/V pools")
    return list(k), list(v)


def _check_order(layers: list[LayerBuffers], kind: str) -> None:
    if [layer.layer for layer in layers] != list(range(len(layers))):
        raise ValueError(f"gcache linker: {kind} maps layers "
                         f"{[layer.layer for layer in layers]}; expected 0..{len(layers) - 1}")

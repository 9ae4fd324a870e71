"""Test-only SGLang general plugin: HiCache on the CPU device.

SGLang 0.5.23 gates HiCache to CUDA/ROCm/XPU in two places, both on the device<->host (L1<->L2)
side, not in the host<->storage path that the GCache backend implements:
- host pools default to pinned memory and ignore the CPU platform's "no pinning": we force
  ``pin_memory=False`` in ``HostKVCache.__init__``;
- the ``direct`` io backend's copy ops are imported only on CUDA/ROCm/XPU: we supply them as
  plain torch index copies.
Run the engine with ``--hicache-io-backend direct`` and ``SGLANG_PLUGINS=cpu_testshim``.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """Token-major layer buffers on both sides (``layer_first``)."""
    for src, dst in zip(src_layers, dst_layers):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)]


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id,
                                       page_size):
    """Host (page, layer, slot) buffers -> one device layer: load one layer."""
    pages, slots = src_indices // page_size, src_indices % page_size
    for src, dst in zip(src_ptrs, dst_ptrs):
        dst[dst_indices] = src[pages, layer_id, slots]


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size):
    """Every device layer (all K layers, then all V layers) -> host (page, layer, slot)."""
    pages, slots = dst_indices // page_size, dst_indices % page_size
    layers = len(src_ptrs) // len(dst_ptrs)
    for j, dst in enumerate(dst_ptrs):
        for layer in range(layers):
            dst[pages, layer, slots] = src_ptrs[j * layers + layer][src_indices]


OPS = {"transfer_kv_direct": transfer_kv_direct,
       "transfer_kv_per_layer_direct_pf_lf": transfer_kv_per_layer_direct_pf_lf,
       "transfer_kv_all_layer_direct_lf_pf": transfer_kv_all_layer_direct_lf_pf}


def register() -> None:
    import torch
    if torch.cuda.is_available():
        return
    from sglang.srt.mem_cache.pool_host import base, mha, mla

    original = base.HostKVCache.__init__
    if getattr(original, "_gcache_unpinned", False):
        return

    @functools.wraps(original)
    def unpinned(self, *args, **kwargs):
        kwargs["pin_memory"] = False
        original(self, *args, **kwargs)

    unpinned._gcache_unpinned = True
    base.HostKVCache.__init__ = unpinned
    for module in (mha, mla):
        for name, op in OPS.items():
            if not hasattr(module, name):
                setattr(module, name, op)
    log.info("GCache CPU test shim: HiCache host pools unpinned, direct copy ops supplied")

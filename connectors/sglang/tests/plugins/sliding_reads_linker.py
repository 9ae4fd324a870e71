"""Test-only linker that SGLang loads by module path (``linker_module_path``): the GCache linker
on a CPU engine whose ``torch_native`` attention reads sliding layers where SGLang put them.

SGLang 0.5.23's ``torch_native`` backend reads a sliding layer's K and V at full-pool slot
numbers instead of translating them through ``full_to_swa_index_mapping`` as its writes and
its ``intel_amx`` sibling do (``gcache_sglang.sliding_reads`` has the lines and what was
measured). The GCache linker therefore serves no sliding-window load on it. The test CPU has
no AMX, so to show a sliding-window prefix loaded through the linker and answered right, this
module (imported in the scheduler, where the linker is built) makes the backend's reads of
sliding layers go through the mapping, rows as ``intel_amx`` builds them, and lets the linker
serve. Everything the linker does is the shipped ``GCacheLinker``'s.
"""

from __future__ import annotations

import functools

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from gcache_sglang.linker import GCacheLinker


def _marking(forward):
    """``forward_extend``/``forward_decode``, noting whether ``layer`` is a sliding one."""
    @functools.wraps(forward)
    def marked(self, q, k, v, layer, forward_batch, *args, **kwargs):
        self._gcache_sliding = bool(self.use_sliding_window_kv_pool and
                                    self.token_to_kv_pool.layers_mapping[layer.layer_id][1])
        return forward(self, q, k, v, layer, forward_batch, *args, **kwargs)
    return marked


def _translating(run):
    """``_run_sdpa_forward_*`` given, for a sliding layer, the batch's rows of ``req_to_token``
    in the sliding pool's slot numbers (and row indices that address them)."""
    @functools.wraps(run)
    def translated(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                   seq_lens, *args, **kwargs):
        if getattr(self, "_gcache_sliding", False):
            rows = req_to_token[req_pool_indices, :int(seq_lens.max())].to(torch.int64)
            req_to_token = self.token_to_kv_pool.translate_loc_from_full_to_swa(rows).to(
                req_to_token.dtype)
            req_pool_indices = torch.arange(rows.shape[0], device=rows.device)
        return run(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                   seq_lens, *args, **kwargs)
    return translated


def translate_sliding_reads() -> None:
    if getattr(TorchNativeAttnBackend, "_gcache_translated", False):
        return
    for mode in ("extend", "decode"):
        forward, run = f"forward_{mode}", f"_run_sdpa_forward_{mode}"
        setattr(TorchNativeAttnBackend, forward,
                _marking(getattr(TorchNativeAttnBackend, forward)))
        setattr(TorchNativeAttnBackend, run, _translating(getattr(TorchNativeAttnBackend, run)))
    TorchNativeAttnBackend._gcache_translated = True


translate_sliding_reads()


class TranslatedReadsLinker(GCacheLinker):
    misreading_backends = frozenset()               # torch_native's reads are translated above

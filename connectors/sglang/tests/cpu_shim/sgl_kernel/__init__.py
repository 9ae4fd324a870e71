"""Test-only stand-in for ``sgl_kernel`` on a CPU without AMX.

PyPI has only CUDA builds of sgl-kernel, and on a CPU without AMX SGLang takes its pure-torch
paths anyway; it still imports a few helpers from ``sgl_kernel`` at module level. The two that
run on the CPU path are written here with torch; every other name is a function that raises
when called, so a path we did not expect fails loudly instead of computing garbage.
"""

from __future__ import annotations

import ctypes

import torch


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, max_len: int) -> None:
    """Write each request's new KV slots (``out_cache_loc``, concatenated in request order)
    into its row of ``req_to_token`` at ``[start, end)``."""
    pos = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(),
                               end_offset.tolist()):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[pos:pos + n].to(req_to_token.dtype)
        pos += n


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor,
                                tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
    """For every buffer (a raw pointer and its bytes per token), copy token rows
    ``src_loc`` to ``tgt_loc``."""
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for tgt, src in zip(tgt_loc.tolist(), src_loc.tolist()):
            ctypes.memmove(ptr + tgt * stride, ptr + src * stride, stride)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*_args, **_kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} has no CPU stand-in in the GCache "
                                  "test shim; this path is not expected on a CPU engine")
    unavailable.__name__ = name
    return unavailable

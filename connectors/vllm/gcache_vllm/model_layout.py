"""The ``gcache.kv`` layout of the model a vLLM engine serves, and its KV groups.

vLLM hands each layer's paged KV as ``[blocks, kv heads, block tokens, K‖V]``; one token of one
layer is ``kv heads × (head_size + head_size_v)`` elements of the KV cache dtype, which is the
layout's bytes per token when the layout is read with that dtype. The engine's byte order (K and
V packed per head) is its own, so the layout's model name carries ``vllm/``: another engine's
objects for the same model are never read as these.
"""

from __future__ import annotations

from typing import Any

from gcache.kv import ModelLayout


def kv_dtype_name(vllm_config: Any) -> str:
    dtype = vllm_config.cache_config.cache_dtype
    if dtype in (None, "auto"):
        dtype = vllm_config.model_config.dtype
    return str(dtype).removeprefix("torch.")


def model_layout(vllm_config: Any, tp_rank: int) -> ModelLayout:
    config = dict(vllm_config.model_config.hf_text_config.to_dict())
    config["torch_dtype"] = kv_dtype_name(vllm_config)
    return ModelLayout.from_config(
        config, page_size=vllm_config.cache_config.block_size, tp_rank=tp_rank,
        tp_size=vllm_config.parallel_config.tensor_parallel_size,
        model=f"vllm/{vllm_config.model_config.model}")


def group_of_layers(kv_cache_config: Any) -> dict[str, int]:
    """KV cache group index of every attention layer name."""
    return {name: g for g, group in enumerate(kv_cache_config.kv_cache_groups)
            for name in group.layer_names}


def check_block_sizes(kv_cache_config: Any, page_size: int) -> None:
    """Every group's block must be one GCache page: the page keys are per block."""
    sizes = {getattr(group.kv_cache_spec, "block_size", page_size)
             for group in kv_cache_config.kv_cache_groups}
    if sizes - {page_size}:
        raise ValueError(f"KV cache groups use block sizes {sorted(sizes)}; GCache needs one "
                         f"block size for all groups (the page size, {page_size})")

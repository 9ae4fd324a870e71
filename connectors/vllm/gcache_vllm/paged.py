"""vLLM's paged KV layers as token-major rows, on the CPU or a GPU; imports torch, never vLLM.

GCache stores a layer's KV token-major, per token and per KV head the key then the value, so an
engine on a GPU host and one on a CPU host share the same objects. vLLM lays a layer out by
attention backend; ``PagedLayer`` recognises three layouts from the tensor's shape and reads
them as views of ``[blocks, block_tokens, heads, width]`` whose widths add up to K‖V:
- the CPU backend: ``[blocks, heads, block_tokens, 2 * head_size]`` (one view, K‖V per head);
- FlashAttention and the other CUDA backends: ``[2, blocks, block_tokens, heads, head_size]``;
- FlashInfer: ``[blocks, 2, block_tokens, heads, head_size]``;
- the diff-KV backends (K and V of different head sizes): ``[blocks, heads, block_tokens,
  head_size + head_size_v]``, read as the CPU layout is;
- MLA: ``[blocks, block_tokens, kv_lora_rank + qk_rope_head_dim]``, one latent "head".
(A 5-D tensor with two blocks and its first two dimensions both 2 is read as FlashAttention's.)

A save gathers whole blocks with ``index_select`` on the tensor's device (saves are of whole
pages); a load scatters tokens with one indexed write per view, skipping null blocks and the
tokens vLLM's own prefix cache already holds. Which tokens those are is worked out on the host
from the block table, so neither direction waits on the GPU to learn a size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

NULL_BLOCK = 0


class PagedLayer:
    """One layer's paged KV, read and written as rows ``[tokens, heads, K‖V]``."""

    def __init__(self, tensor: Any, page: int, *, name: str = "layer") -> None:
        self.tensor, self.page, self.device = tensor, page, tensor.device
        self.parts = _token_views(tensor, page, name)
        self.heads = self.parts[0].shape[2]
        self.widths = [p.shape[3] for p in self.parts]

    @property
    def bytes_per_token(self) -> int:
        return self.heads * sum(self.widths) * self.tensor.element_size()

    def held_from(self, block_ids: list[int], stop: int) -> int:
        """The first token of ``[0, stop)`` from which every block is a real one (sliding
        window groups hand out null blocks for what fell out of the window)."""
        n_blocks = -(-stop // self.page)
        nulls = [i for i in range(n_blocks) if block_ids[i] == NULL_BLOCK]
        return (nulls[-1] + 1) * self.page if nulls else 0

    def gather(self, block_ids: list[int], first: int, stop: int) -> Any:
        """Tokens ``[first, stop)`` (both on block boundaries) as one contiguous
        ``[tokens, heads, K‖V]`` tensor on the layer's device."""
        if first % self.page or stop % self.page:
            raise ValueError(f"gather of tokens [{first}, {stop}) is not on {self.page}-token "
                             "block boundaries")
        index = self._on_device(np.asarray(block_ids[first // self.page:stop // self.page]))
        picked = [p.index_select(0, index).reshape(stop - first, self.heads, w)
                  for p, w in zip(self.parts, self.widths)]
        return picked[0] if len(picked) == 1 else torch.cat(picked, dim=-1)

    def scatter(self, block_ids: list[int], start: int, stop: int, staged: Any,
                skip: int) -> None:
        """Write staged rows of tokens ``[start, stop)`` (bytes, on the layer's device) into
        their blocks, except null blocks and the tokens before ``skip``."""
        tokens = np.arange(start, stop)
        blocks = np.asarray(block_ids, dtype=np.int64)[tokens // self.page]
        keep = np.flatnonzero((blocks != NULL_BLOCK) & (tokens >= skip))
        if not len(keep):
            return
        rows = staged.view(self.tensor.dtype).view(stop - start, self.heads, sum(self.widths))
        if len(keep) != len(tokens):
            rows = rows[self._on_device(keep)]
        b, o = self._on_device(blocks[keep]), self._on_device(tokens[keep] % self.page)
        column = 0
        for part, width in zip(self.parts, self.widths):
            part[b, o] = rows[..., column:column + width]
            column += width

    def _on_device(self, array: np.ndarray) -> Any:
        # non_blocking: a blocking copy from pageable memory waits for the whole stream (the
        # forward pass so far); a non-blocking one is staged by the driver before it returns.
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(
            self.device, non_blocking=True)


def _token_views(tensor: Any, page: int, name: str) -> list[Any]:
    shape = tuple(tensor.shape)
    if tensor.dim() == 3 and shape[1] == page:
        return [tensor.unsqueeze(2)]
    if tensor.dim() == 4 and shape[2] == page:
        return [tensor.transpose(1, 2)]
    if tensor.dim() == 5 and shape[2] == page:
        if shape[0] == 2:
            return [tensor[0], tensor[1]]
        if shape[1] == 2:
            return [tensor[:, 0], tensor[:, 1]]
    raise ValueError(f"{name}: KV tensor of shape {shape} with {page}-token blocks; gcache_vllm "
                     "reads vLLM's [blocks, heads, block_tokens, K‖V] (CPU, diff-KV), "
                     "[blocks, block_tokens, latent] (MLA), "
                     "[2, blocks, block_tokens, heads, head_size] (FlashAttention) and "
                     "[blocks, 2, block_tokens, heads, head_size] (FlashInfer) layouts")

"""What the scheduler tells the workers each step (plain data: it is pickled to workers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gcache_vllm._compat import KVConnectorMetadata


@dataclass
class LoadSpec:
    """Load the window-safe prefix ``token_ids`` (``len`` is the hit, whole pages) of a request
    into its blocks; tokens before ``skip_tokens`` are already in vLLM's prefix cache."""

    req_id: str
    token_ids: list[int]
    skip_tokens: int
    block_ids: tuple[list[int], ...]          # one list per KV cache group


@dataclass
class SaveSpec:
    """Save the full pages of ``token_ids`` (a finished prefill) from the request's blocks."""

    req_id: str
    token_ids: list[int]
    block_ids: tuple[list[int], ...]


@dataclass
class GCacheConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)

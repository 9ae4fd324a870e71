"""What the scheduler tells the workers each step (plain data: it is pickled to workers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gcache_vllm._compat import KVConnectorMetadata


@dataclass
class LoadSpec:
    """Load the window-safe prefix ``token_ids`` (``len`` is the hit, whole pages) of a request
    into its blocks; tokens before ``skip_tokens`` are already in vLLM's prefix cache. An
    ``asynchronous`` load runs beside the forward passes and is reported by ``get_finished``;
    the others are applied layer by layer within this step's forward pass."""

    req_id: str
    token_ids: list[int]
    skip_tokens: int
    block_ids: tuple[list[int], ...]          # one list per KV cache group
    asynchronous: bool = False


@dataclass
class SaveSpec:
    """Save the full pages of ``token_ids`` from the request's blocks: in the forward pass that
    finishes the prefill, or, for a finished request (``saves_at_finish``), outside it."""

    req_id: str
    token_ids: list[int]
    block_ids: tuple[list[int], ...]


@dataclass
class GCacheConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    saves_at_finish: list[SaveSpec] = field(default_factory=list)   # prompt and answer
    # the step schedules no tokens (every request is parked): a worker may wait for its loads
    idle: bool = False

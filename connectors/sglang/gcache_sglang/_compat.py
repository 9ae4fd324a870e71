"""The SGLang names this connector uses, in one place, so a version change is one edit.

Checked against sglang 0.5.23 (the version the tests pin). Older releases kept the host pools
in ``memory_pool_host`` and had no v2 (hybrid pool) types; they are not supported.
"""

from __future__ import annotations

try:
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
        PoolTransferResult,
    )
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
except ImportError as exc:                                   # pragma: no cover - wrong engine
    raise ImportError(f"gcache_sglang needs sglang 0.5.23 (HiCache v2 storage API): {exc}") from exc

try:
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (
        LayerWiseLoadCounter,
        UnifiedCacheLinker,
    )
except ImportError as exc:                                   # pragma: no cover - wrong engine
    raise ImportError(f"gcache_sglang needs sglang 0.5.23 (the unified cache linker): "
                      f"{exc}") from exc

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics
except ImportError:                                          # pragma: no cover - metrics moved
    StorageMetrics = None

KV = PoolName.KV.value

__all__ = [
    "KV",
    "ComponentType",
    "HiCacheStorage",
    "HiCacheStorageConfig",
    "HiCacheStorageExtraInfo",
    "LayerWiseLoadCounter",
    "MLATokenToKVPoolHost",
    "PoolHitPolicy",
    "PoolName",
    "PoolTransfer",
    "PoolTransferResult",
    "StorageMetrics",
    "UnifiedCacheLinker",
]

PASS_PREFIX_KEYS = "hicache_storage_pass_prefix_keys"


def engine_passes_prefix_keys(extra_config: dict | None) -> bool:
    """Whether SGLang hands the backend each call's prefix keys.

    SGLang pops ``hicache_storage_pass_prefix_keys`` from the extra config before the backend
    sees it, so the engine's own copy of the launch config is parsed with SGLang's own parser;
    a backend built outside an engine (the unit tests) still has the key.
    """
    if PASS_PREFIX_KEYS in (extra_config or {}):
        return bool(extra_config[PASS_PREFIX_KEYS])
    try:
        from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
        from sglang.srt.runtime_context import get_memory
        raw = get_memory().hicache_storage_backend_extra_config
        return bool(raw) and bool(HybridCacheController.parse_storage_backend_extra_config(raw)[4])
    except Exception:
        return False


def model_path_of(server_args: object) -> str | None:
    """The served model's path (or hub name): the linker's constructor gets the server args;
    SGLang's own linkers read the runtime context, which holds the same path."""
    path = getattr(server_args, "model_path", None)
    if isinstance(path, str) and path:
        return path
    try:
        from sglang.srt.runtime_context import get_model
        found = get_model().model_path
        return found if isinstance(found, str) and found else None
    except Exception:
        return None


def tensor_parallel_rank(params: object) -> tuple[int, int]:
    """This worker's (rank, size) in the attention tensor-parallel group that shards the KV
    pool, as SGLang's own linkers read it; (0, 1) without torch.distributed."""
    import torch
    group = getattr(params, "attn_tp_cache_group", None) or \
        getattr(params, "tp_cache_group", None)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return (torch.distributed.get_rank(group=group),
                torch.distributed.get_world_size(group=group))
    return 0, 1

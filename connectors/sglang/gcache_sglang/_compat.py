"""The SGLang names this connector uses, in one place, so a version change is one edit.

Checked against sglang 0.5.23 (the version the tests pin). Older releases kept the host pools
in ``memory_pool_host`` and had no v2 (hybrid pool) types; they are not supported.
"""

from __future__ import annotations

try:
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo, PoolHitPolicy, PoolName,
        PoolTransfer, PoolTransferResult)
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
except ImportError as exc:                                   # pragma: no cover - wrong engine
    raise ImportError(f"gcache_sglang needs sglang 0.5.23 (HiCache v2 storage API): {exc}") from exc

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics
except ImportError:                                          # pragma: no cover - metrics moved
    StorageMetrics = None

KV = PoolName.KV.value

__all__ = ["HiCacheStorage", "HiCacheStorageConfig", "HiCacheStorageExtraInfo", "KV",
           "MLATokenToKVPoolHost", "PoolHitPolicy", "PoolName", "PoolTransfer",
           "PoolTransferResult", "StorageMetrics"]

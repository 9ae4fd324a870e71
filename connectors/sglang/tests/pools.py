"""SGLang's real host pools built on CPU (no engine, no stubs), and its real page hashes."""

from __future__ import annotations

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str

PAGE = 16
DEVICE_TOKENS = 512


def mha_host(layout: str, *, layers: int = 3, heads: int = 2, head_dim: int = 32,
             dtype=torch.bfloat16) -> MHATokenToKVPoolHost:
    device = MHATokenToKVPool(DEVICE_TOKENS, PAGE, dtype, heads, head_dim, layers, device="cpu",
                              enable_memory_saver=False)
    info = device.get_device_pool_infos()[0].buffer_info
    return MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=device.size,
                                start_layer=device.start_layer, end_layer=device.end_layer)


def mla_host(layout: str, *, layers: int = 3, lora: int = 64, rope: int = 16,
             dtype=torch.bfloat16) -> MLATokenToKVPoolHost:
    device = MLATokenToKVPool(DEVICE_TOKENS, PAGE, dtype, lora, rope, layers, device="cpu",
                              enable_memory_saver=False)
    info = device.get_device_pool_infos()[0].buffer_info
    return MLATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                override_kv_cache_dim=device.kv_cache_dim,
                                device_capacity_tokens=device.size,
                                start_layer=device.start_layer, end_layer=device.end_layer,
                                target_layer_num=layers)


def storage_config(servers: list[str], *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False,
                   model: str = "tests/tiny", zero_copy: bool = True,
                   **extra) -> HiCacheStorageConfig:
    config = {"backend_name": "gcache", "module_path": "gcache_sglang.storage",
              "class_name": "GCacheHiCacheStorage", "gcache_servers": ",".join(servers),
              "gcache_timeout_ms": 1000, **extra}
    if zero_copy:
        config["interface_v1"] = 1
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
                                enable_storage_metrics=True, is_page_first_layout=True,
                                model_name=model, extra_config=config)


def backend(config: HiCacheStorageConfig, host, **pools):
    """Our backend as SGLang creates and wires it: factory, anchor pool, then every pool."""
    made = StorageBackendFactory.create_backend("dynamic", config, host)
    made.register_mem_pool_host(host)
    made.register_mem_host_pool_v2(host, "kv")
    for name, pool in pools.items():
        made.register_mem_host_pool_v2(pool, name)
    made.on_host_pools_registered()
    return made


def page_keys(tokens: list[int]) -> list[str]:
    """SGLang's own chained page hashes."""
    keys, prior = [], None
    for start in range(0, len(tokens) - len(tokens) % PAGE, PAGE):
        prior = get_hash_str(tokens[start:start + PAGE], prior)
        keys.append(prior)
    return keys


def fill(host, n_pages: int, seed: int) -> torch.Tensor:
    """Allocate ``n_pages`` host pages and fill them with random bytes; their slot indices."""
    indices = host.alloc(n_pages * PAGE)
    assert indices is not None and len(indices) == n_pages * PAGE
    generator = torch.Generator().manual_seed(seed)
    raw = host.kv_buffer.view(torch.uint8)
    random = torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator)
    raw.copy_(random)                                  # every slot random; what we read must match
    return indices


def pages_of(host, indices: torch.Tensor) -> list[torch.Tensor]:
    """Each page's bytes, in SGLang's own flat page format."""
    return [host.get_data_page(int(indices[i]), flat=True).view(torch.uint8).clone()
            for i in range(0, len(indices), PAGE)]

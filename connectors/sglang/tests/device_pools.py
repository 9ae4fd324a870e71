"""SGLang's real device KV pools built on CPU, and the GCache linker made by SGLang's own
linker factory from the launch config, for the linker's interface tier."""

from __future__ import annotations

import json
import pathlib
import time
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.linker_config import UnifiedCacheLinkerConfig
from sglang.srt.mem_cache.unified_cache.linker_factory import create_unified_cache_linker

from .pools import page_keys

PAGE = 16
WINDOW = 32                       # tokens: two pages


def mha_pool(*, layers: int = 3, size: int = 512) -> MHATokenToKVPool:
    return MHATokenToKVPool(size, PAGE, torch.float32, 2, 8, layers, device="cpu",
                            enable_memory_saver=False)


def swa_pool(*, size: int = 512) -> SWAKVPool:
    """Layers 0 and 2 slide, layer 1 is full attention (Gemma's alternation)."""
    return SWAKVPool(size=size, size_swa=size // 2, page_size=PAGE, dtype=torch.float32,
                     head_num=2, head_dim=8, swa_attention_layer_ids=[0, 2],
                     full_attention_layer_ids=[1], device="cpu", enable_memory_saver=False)


def model_dir(path: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """A model directory with a config and random safetensors weights (their fingerprint)."""
    from safetensors.torch import save_file
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    generator = torch.Generator().manual_seed(seed)
    save_file({"w": torch.randn(64, 64, generator=generator)}, str(path / "model.safetensors"))
    return path


def launch_config(servers: list[str], **settings) -> dict:
    """The ``--unified-cache-external-linker-config`` object, as the README writes it."""
    return {"linker_module_path": "gcache_sglang.linker", "linker": "GCacheLinker",
            "linker_extra_config": {"gcache_servers": ",".join(servers),
                                    "gcache_timeout_ms": 1000, **settings}}


def make_linker(servers: list[str], pool, model: pathlib.Path, *, window: int | None = None,
                module: str | None = None, attention_backend: str | None = None, **settings):
    """The linker as SGLang's worker builds it: the launch config checked by SGLang's parser,
    then ``create_unified_cache_linker`` with the ``dynamic`` backend. ``attention_backend``:
    the engine's (SGLang's runtime context is not published here, so the server args say it)."""
    config = launch_config(servers, **settings)
    if module is not None:
        config["linker_module_path"] = module
    UnifiedCacheLinkerConfig.from_dict(config)
    components = {ComponentType.FULL} | ({ComponentType.SWA} if window else set())
    params = SimpleNamespace(page_size=PAGE,
                             token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: pool),
                             pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                             swa_retain_window=window, attn_tp_cache_group=None,
                             tp_cache_group=None)
    server_args = SimpleNamespace(model_path=str(model), attention_backend=attention_backend)
    return create_unified_cache_linker(server_args, params,
                                       backend="dynamic", config=config,
                                       components=components, forward_stream=None)


def keys_of(n_pages: int, seed: int = 0) -> list[str]:
    """SGLang's chained page hashes of ``n_pages`` pages of tokens."""
    generator = torch.Generator().manual_seed(seed)
    return page_keys(torch.randint(0, 500, (n_pages * PAGE,), generator=generator).tolist())


def slots(first_page: int, n_pages: int) -> torch.Tensor:
    return torch.arange(first_page * PAGE, (first_page + n_pages) * PAGE, dtype=torch.int64)


def fill(buffers: list[torch.Tensor], where: torch.Tensor, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for buf in buffers:
        buf[where] = torch.randn(buf[where].shape, generator=generator)


def kv(keys: list[str], where: torch.Tensor | None = None) -> PoolTransfer:
    return PoolTransfer(name=PoolName.KV, keys=list(keys), device_indices=where)


def swa(keys: list[str], where: torch.Tensor | None = None) -> PoolTransfer:
    return PoolTransfer(name=PoolName.SWA, keys=list(keys), device_indices=where,
                        hit_policy=PoolHitPolicy.TRAILING_PAGES)


def offload(linker, transfers: list[PoolTransfer], timeout_s: float = 30.0) -> bool:
    """Offload, then take its result the way the tree polls for it."""
    assert linker.offload(transfers)
    deadline = time.monotonic() + timeout_s
    while linker.num_completed_offloads() == 0:
        assert time.monotonic() < deadline, "offload did not complete"
        time.sleep(0.01)
    return linker.pop_completed_offload()


def load(linker, rid: str, transfers: list[PoolTransfer]) -> tuple[bool, list[int]]:
    """Queue, start, wait layer by layer as the forward does, finish. Returns whether every
    layer landed and the layers in the order the forward saw them resolve."""
    assert linker.load(rid, transfers)
    index = linker.start_layer_wise_loading()
    counter = linker.layer_done_counter
    counter.set_consumer(index)
    seen = []
    for layer in range(counter.num_layers):
        counter.wait_until(layer)
        seen.append(layer)
    counter.set_consumer(-1)
    return linker.finish_layer_wise_loading(index), seen


def layer_buffers(pool) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Per model layer: its pool (kv or swa) and its K and V tensors."""
    mapping = getattr(pool, "layers_mapping", None)
    if mapping is None:
        return [("kv", k, v) for k, v in zip(pool.k_buffer, pool.v_buffer)]
    out = []
    for layer in sorted(mapping):
        local, is_swa = mapping[layer]
        sub = pool.swa_kv_pool if is_swa else pool.full_kv_pool
        out.append(("swa" if is_swa else "kv", sub.k_buffer[local], sub.v_buffer[local]))
    return out

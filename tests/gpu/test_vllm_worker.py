"""The vLLM connector's worker side on the device vLLM keeps its KV on, driven in vLLM's call
order (register, then per step: start_load, per layer wait_for_layer_load and save_kv_layer,
wait_for_save, clear): a prompt saved from one worker's paged KV loads into another worker's
blocks, bit for bit, in the FlashAttention and FlashInfer layouts on CUDA (the CPU layout here
too). KV saved from a CPU engine loads into a GPU engine: the stored rows are the same."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gcache import Client
from gcache.kv import KVStore
from gcache.kv.layout import LayerGeometry, ModelLayout
from gcache.kv.window import tail_span
from gcache_vllm.paged import PagedLayer
from gcache_vllm.worker_side import WorkerSide

PAGE, BLOCKS, HEADS, HD, WINDOW = 16, 24, 2, 64, 32
LAYOUT = ModelLayout(model="gpu-check", num_layers=4, swa_layers=(1, 3), window=WINDOW,
                     full=LayerGeometry(HEADS, HD, HD, 2), swa=LayerGeometry(HEADS, HD, HD, 2),
                     page_size=PAGE)
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYOUT.num_layers)]
GROUP_OF = {name: 1 if LAYOUT.is_swa(i) else 0 for i, name in enumerate(NAMES)}
PROMPT = list(range(1000, 1000 + 6 * PAGE))
CUDA = pytest.param("cuda", marks=pytest.mark.requires_gpu)


def kv_caches(layout: str, device: str, seed: int | None) -> dict[str, torch.Tensor]:
    shape = {"cpu": (BLOCKS, HEADS, PAGE, 2 * HD), "flash_attn": (2, BLOCKS, PAGE, HEADS, HD),
             "flashinfer": (BLOCKS, 2, PAGE, HEADS, HD)}[layout]
    if seed is None:
        return {n: torch.zeros(shape, dtype=torch.bfloat16, device=device) for n in NAMES}
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(shape, generator=g).to(torch.bfloat16).to(device) for n in NAMES}


def worker(client: Client, caches: dict[str, torch.Tensor]) -> WorkerSide:
    store = KVStore(client, LAYOUT, policy="tail")
    side = WorkerSide(store, LAYOUT, GROUP_OF, layer_index=lambda n: int(n.split(".")[2]))
    side.register(caches)
    return side


def step(side: WorkerSide, meta) -> None:
    side.start_load(meta)
    for name in NAMES:
        side.wait_layer(name, meta)
        side.save_layer(name, meta)
    side.wait_saves()
    side.end_step()


def save(side: WorkerSide, blocks: list[int]) -> None:
    saved = side.counters["saved_layers"]
    spec = SimpleNamespace(req_id="saver", token_ids=PROMPT, block_ids=(blocks, blocks))
    step(side, SimpleNamespace(loads=[], saves=[spec]))
    assert side.counters["saved_layers"] == saved + LAYOUT.num_layers, side.counters
    assert side.counters["save_errors"] == 0, side.counters


def load_and_compare(client: Client, source: dict, saved_blocks: list[int], layout: str,
                     device: str) -> None:
    hit = KVStore(client, LAYOUT, policy="tail").match(PROMPT)
    assert hit == len(PROMPT)
    target_caches = kv_caches(layout, device, seed=None)
    loader = worker(client, target_caches)
    full_ids = list(range(10, 16))
    start, stop = tail_span(hit // PAGE, PAGE, WINDOW)
    swa_ids = [0] * (start // PAGE) + list(range(17, 17 + (stop - start) // PAGE))
    spec = SimpleNamespace(req_id="loader", token_ids=PROMPT[:hit], skip_tokens=0,
                           block_ids=(full_ids, swa_ids))
    step(loader, SimpleNamespace(loads=[spec], saves=[]))
    assert loader.take_load_errors() == set()
    assert loader.counters["loaded_layers"] == LAYOUT.num_layers, loader.counters
    for i, name in enumerate(NAMES):
        saved = PagedLayer(source[name], PAGE).gather(saved_blocks, 0, hit).cpu()
        got = PagedLayer(target_caches[name], PAGE)
        if LAYOUT.is_swa(i):
            assert torch.equal(got.gather(swa_ids, start, stop).cpu(), saved[start:stop]), name
        else:
            assert torch.equal(got.gather(full_ids, 0, hit).cpu(), saved), name


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("layout", ["flash_attn", "flashinfer", "cpu"])
def test_a_saved_prompt_loads_into_other_blocks_bit_for_bit(cluster_factory, device, layout):
    cluster = cluster_factory(1, memory="64MiB")
    caches = kv_caches(layout, device, seed=7)
    blocks = [3, 4, 5, 6, 7, 8]
    with Client(cluster.addresses, timeout_s=5.0) as client:
        saver = worker(client, caches)
        if device == "cuda":
            # The forward pass's writes still queued when the save starts: the copy to the
            # host must wait for them on the GPU (a missing wait would copy stale rows).
            torch.cuda._sleep(200_000_000)
            for tensor in caches.values():
                tensor.add_(1)
        save(saver, blocks)
        load_and_compare(client, caches, blocks, layout, device)
        if device == "cuda":
            assert saver.transfers.pool.allocations > 0            # pinned staging, reused
            before = saver.transfers.pool.allocations
            save(saver, blocks)                    # gathered and copied again, into the same buffers
            assert saver.transfers.pool.allocations == before


@pytest.mark.requires_gpu
def test_kv_saved_by_a_cpu_engine_loads_into_a_gpu_engine(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")
    caches = kv_caches("cpu", "cpu", seed=11)
    blocks = [2, 3, 4, 5, 6, 7]
    with Client(cluster.addresses, timeout_s=5.0) as client:
        save(worker(client, caches), blocks)
        load_and_compare(client, caches, blocks, "flash_attn", "cuda")


def test_a_bound_load_whose_layers_never_ran_is_reported_for_recompute(cluster_factory):
    """vLLM asks for load errors after the forward pass: a load none of whose layer hooks ran
    left blocks vLLM takes as computed; they are reported, once."""
    cluster = cluster_factory(1, memory="64MiB")
    caches = kv_caches("cpu", "cpu", seed=3)
    with Client(cluster.addresses, timeout_s=5.0) as client:
        save(worker(client, caches), [1, 2, 3, 4, 5, 6])
        loader = worker(client, kv_caches("cpu", "cpu", seed=None))
        spec = SimpleNamespace(req_id="loader", token_ids=PROMPT, skip_tokens=0,
                               block_ids=([7, 8, 9, 10, 11, 12], [7, 8, 9, 10, 11, 12]))
        meta = SimpleNamespace(loads=[spec], saves=[])
        loader.start_load(meta)
        assert loader.take_load_errors() == {7, 8, 9, 10, 11, 12}
        assert loader.take_load_errors() == set()
        loader.end_step()

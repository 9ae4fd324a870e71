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


def worker(client: Client, caches: dict[str, torch.Tensor], group_of=None) -> WorkerSide:
    store = KVStore(client, LAYOUT, policy="tail")
    side = WorkerSide(store, LAYOUT, group_of or GROUP_OF,
                      layer_index=lambda n: int(n.split(".")[2]))
    side.register(caches)
    return side


def meta_of(*, loads=(), saves=(), saves_at_finish=()) -> SimpleNamespace:
    """What ``GCacheConnectorMetadata`` carries (that class subclasses vLLM's; no vLLM here)."""
    return SimpleNamespace(loads=list(loads), saves=list(saves),
                           saves_at_finish=list(saves_at_finish))


def step(side: WorkerSide, meta) -> None:
    side.start_load(meta)
    for name in NAMES:
        side.wait_layer(name, meta)
        side.save_layer(name, meta)
    side.wait_saves()
    side.end_step()


def save(side: WorkerSide, blocks: list[int]) -> None:
    saved = side.counters["saved_layers"]
    spec = SimpleNamespace(req_id="saver", token_ids=PROMPT,
                           block_ids=tuple(blocks for _ in set(side.group_of.values())))
    step(side, meta_of(saves=[spec]))
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
                           block_ids=(full_ids, swa_ids), asynchronous=False)
    step(loader, meta_of(loads=[spec]))
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
            save(saver, blocks)            # gathered and copied again, into the same buffers
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
    left blocks vLLM takes as computed; they are reported, once. (One KV cache group: the only
    kind of model whose loads are synchronous, and whose failures vLLM takes as block ids.)"""
    cluster = cluster_factory(1, memory="64MiB")
    caches = kv_caches("cpu", "cpu", seed=3)
    one_group = dict.fromkeys(NAMES, 0)
    with Client(cluster.addresses, timeout_s=5.0) as client:
        save(worker(client, caches, one_group), [1, 2, 3, 4, 5, 6])
        loader = worker(client, kv_caches("cpu", "cpu", seed=None), one_group)
        spec = SimpleNamespace(req_id="loader", token_ids=PROMPT, skip_tokens=0,
                               block_ids=([7, 8, 9, 10, 11, 12],), asynchronous=False)
        meta = meta_of(loads=[spec])
        loader.start_load(meta)
        assert loader.take_load_errors() == {7, 8, 9, 10, 11, 12}
        assert loader.take_load_errors() == set()
        loader.end_step()


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_an_async_load_is_applied_whole_and_reported_once(cluster_factory, device):
    """A parked request's load (hybrid models load only this way): fetched beside the steps,
    copied into its blocks in the first ``get_finished`` after all of it arrived, reported as
    received once; nothing happens in the layer hooks."""
    import time
    cluster = cluster_factory(1, memory="64MiB")
    caches = kv_caches("flash_attn" if device == "cuda" else "cpu", device, seed=5)
    blocks = [3, 4, 5, 6, 7, 8]
    with Client(cluster.addresses, timeout_s=5.0) as client:
        save(worker(client, caches), blocks)
        target = kv_caches("flash_attn" if device == "cuda" else "cpu", device, seed=None)
        loader = worker(client, target)
        full_ids = list(range(10, 16))
        start, stop = tail_span(len(PROMPT) // PAGE, PAGE, WINDOW)
        swa_ids = [0] * (start // PAGE) + list(range(17, 17 + (stop - start) // PAGE))
        spec = SimpleNamespace(req_id="parked", token_ids=PROMPT, skip_tokens=0,
                               block_ids=(full_ids, swa_ids), asynchronous=True)
        step(loader, meta_of(loads=[spec]))
        assert loader.counters["loaded_layers"] == 0            # not in the layer hooks
        received = set()
        for _ in range(500):
            _, received, failed = loader.get_finished()
            if received:
                break
            time.sleep(0.01)
        assert received == {"parked"} and not failed
        assert loader.get_finished() == (set(), set(), set())   # once
        assert loader.counters["loaded_layers"] == LAYOUT.num_layers
        for i, name in enumerate(NAMES):
            saved = PagedLayer(caches[name], PAGE).gather(blocks, 0, len(PROMPT)).cpu()
            got = PagedLayer(target[name], PAGE)
            if LAYOUT.is_swa(i):
                assert torch.equal(got.gather(swa_ids, start, stop).cpu(), saved[start:stop])
            else:
                assert torch.equal(got.gather(full_ids, 0, len(PROMPT)).cpu(), saved)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_save_at_finish_is_reported_sent_once_every_layer_is_put(cluster_factory, device):
    cluster = cluster_factory(1, memory="64MiB")
    caches = kv_caches("flash_attn" if device == "cuda" else "cpu", device, seed=6)
    blocks = [3, 4, 5, 6, 7, 8]
    with Client(cluster.addresses, timeout_s=5.0) as client:
        side = worker(client, caches)
        spec = SimpleNamespace(req_id="done", token_ids=PROMPT, block_ids=(blocks, blocks))
        step(side, meta_of(saves_at_finish=[spec]))
        sent, received, _ = side.get_finished()
        assert sent == {"done"} and not received
        assert side.counters["saved_layers"] == LAYOUT.num_layers
        assert KVStore(client, LAYOUT, policy="tail").match(PROMPT) == len(PROMPT)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("shape,bytes_per_token", [
    ((BLOCKS, PAGE, 576), 576 * 2),                        # MLA: one latent per token
    ((BLOCKS, HEADS, PAGE, 192 + 128), HEADS * 320 * 2),   # diff-KV: K 192, V 128 per head
], ids=["mla", "diff-kv"])
def test_mla_and_diff_kv_layers_gather_and_scatter_whole_rows(device, shape, bytes_per_token):
    g = torch.Generator().manual_seed(11)
    source = torch.randn(shape, generator=g).to(torch.bfloat16).to(device)
    target = torch.zeros_like(source)
    src, dst = PagedLayer(source, PAGE), PagedLayer(target, PAGE)
    assert src.bytes_per_token == bytes_per_token
    rows = src.gather([3, 4, 5], 0, 3 * PAGE)
    dst.scatter([7, 0, 9], 0, 3 * PAGE, rows.reshape(-1).view(torch.uint8), skip=0)
    assert torch.equal(target[7], source[3]) and torch.equal(target[9], source[5])
    assert not target[0].any()                             # the null block is never written

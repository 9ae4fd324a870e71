"""vLLM's tiering manager with GCache as its secondary tier, built the way an engine builds it,
and driven the way its offloading scheduler drives it (every call under ``manager.lock``): for
``connectors/vllm/tests/test_tier.py`` and ``bench/tier_vllm.py``.

vLLM's offloading worker runs only on CUDA and XPU, so nothing here starts an engine: the
scheduler side is vLLM's own code from a ``KVTransferConfig`` (``build_offloading_config``,
``OffloadingSpecFactory``, ``TieringOffloadingSpec.get_manager``), and the test plays the GPU
worker by writing a chunk's bytes into the CPU tier's shared memory between ``prepare_store``
and ``complete_store``, as the worker's GPU-to-CPU copy does.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import time
import types
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from vllm.config import CacheConfig, KVTransferConfig, ParallelConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.base import TransferJob

BLOCK, HEADS, HEAD_DIM, LAYERS, WINDOW = 16, 2, 16, 2, 64
END = ScheduleEndContext((), ())


def transfer_config(tier: dict, *, cpu_bytes: int = 1 << 21) -> dict:
    """The ``--kv-transfer-config`` a user writes: vLLM's offloading with GCache under it."""
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
                                          "cpu_bytes_to_use": cpu_bytes,
                                          "secondary_tiers": [tier]}}


def build_manager(config: dict, **model):
    """vLLM's ``TieringOffloadingManager`` from ``config`` (``build_spec``'s model)."""
    return build_spec(config, **model).get_manager()


def build_spec(config: dict, *, model: str = "gcache-test/tiny", events: bool = False,
               heads: int = HEADS, head_dim: int = HEAD_DIM, sliding: bool = True):
    """vLLM's ``TieringOffloadingSpec`` from ``config``, for a model of one full-attention
    layer and one sliding-window layer (two KV cache groups; one group with ``sliding``
    off). Its ``get_manager`` maps the CPU tier; a test of the tier alone builds the tier
    from it with ``SecondaryTierFactory`` over memory of its own."""
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=heads, head_size=head_dim,
                             dtype=torch.float16)
    groups = [KVCacheGroupSpec(["l0"] if sliding else ["l0", "l1"], full)]
    if sliding:
        groups.append(KVCacheGroupSpec(["l1"], SlidingWindowSpec(
            block_size=BLOCK, num_kv_heads=heads, head_size=head_dim, dtype=torch.float16,
            sliding_window=WINDOW)))
    blocks = 64
    kv_cache_config = KVCacheConfig(
        num_blocks=blocks,
        kv_cache_tensors=[KVCacheTensor(size=full.page_size_bytes * LAYERS * blocks,
                                        layers=["l0", "l1"],
                                        layer_stride=full.page_size_bytes * blocks,
                                        block_stride=full.page_size_bytes)],
        kv_cache_groups=groups)
    model_config = types.SimpleNamespace(use_mla=False, model=model, dtype=torch.float16,
                                         max_model_len=4096,
                                         get_total_num_kv_heads=lambda: heads)
    events_config = types.SimpleNamespace(enable_kv_cache_events=True, publisher="null") \
        if events else None
    vllm_config = types.SimpleNamespace(kv_transfer_config=KVTransferConfig(**config),
                                        parallel_config=ParallelConfig(),
                                        cache_config=CacheConfig(block_size=BLOCK),
                                        model_config=model_config,
                                        kv_events_config=events_config,
                                        use_v2_model_runner=False)
    offloading = build_offloading_config(vllm_config, kv_cache_config)
    return OffloadingSpecFactory.create_spec(offloading)


def chunk_keys(n: int, *, seed: int, group: int = 0) -> list[OffloadKey]:
    rng = np.random.default_rng(seed)
    return [make_offload_key(rng.bytes(32), group) for _ in range(n)]


def rows(manager):
    return manager.primary_tier.get_kv_memoryview().cast("B")


def row_bytes(manager) -> int:
    return manager.secondary_tiers[0].block_size_bytes


def store(manager, req_id: str, keys: Sequence[OffloadKey], *, seed: int) -> dict:
    """Offload ``keys`` as the engine does (the worker's copy played here); the bytes written,
    by key. The cascade to GCache is submitted at ``complete_store``."""
    ctx = ReqContext(req_id=req_id)
    size = row_bytes(manager)
    rng = np.random.default_rng(seed)
    written = {}
    view = rows(manager)
    try:
        with manager.lock:
            manager.on_new_request(ctx)
            out = manager.prepare_store(list(keys), ctx)
            assert out is not None, "the CPU tier refused the store"
            for key, chunk in zip(out.keys_to_store, out.store_spec.block_ids):
                data = rng.bytes(size)
                view[int(chunk) * size:(int(chunk) + 1) * size] = data
                written[key] = data
            manager.complete_store(list(keys), ctx)
            manager.on_request_finished(ctx)
            manager.on_schedule_end(END)
    finally:
        view.release()
    return written


def steps(manager, until: Callable[[], bool], *, limit_s: float = 30.0) -> int:
    """Engine steps (``on_schedule_end``) until ``until()`` holds; how many it took."""
    deadline = time.monotonic() + limit_s
    n = 0
    while True:
        with manager.lock:
            if until():
                return n
            manager.on_schedule_end(END)
        n += 1
        assert time.monotonic() < deadline, f"not done after {n} steps"
        time.sleep(0.01)


def settle(manager) -> None:
    """Steps until the tiers have no job or lookup in flight."""
    steps(manager, lambda: not manager.has_pending_work())


def look_up(manager, ctx: ReqContext, keys: Sequence[OffloadKey], *,
            waiting=(LookupResult.RETRY,)) -> list[LookupResult]:
    """Each key's lookup once no answer is one of ``waiting``, a step apart, as the scheduler
    defers a request while a lookup says RETRY (or HIT_PENDING: a promotion in flight)."""
    answers: list[LookupResult] = []

    def final() -> bool:
        answers[:] = [manager.lookup(key, ctx) for key in keys]
        return not set(answers) & set(waiting)
    steps(manager, final)
    return answers


def promote(manager, req_id: str, keys: Sequence[OffloadKey]) -> dict:
    """A fresh request that finds ``keys`` in GCache: lookups until the promotions into the
    CPU tier are done, then a load of the hits from it; the bytes of each hit's chunk."""
    ctx = ReqContext(req_id=req_id)
    with manager.lock:
        manager.on_new_request(ctx)
    final = look_up(manager, ctx, keys,
                    waiting=(LookupResult.RETRY, LookupResult.HIT_PENDING))
    hits = [key for key, answer in zip(keys, final) if answer == LookupResult.HIT]
    got = {}
    size = row_bytes(manager)
    view = rows(manager)
    try:
        with manager.lock:
            if hits:
                spec = manager.prepare_load(hits, ctx)
                for key, chunk in zip(hits, spec.block_ids):
                    got[key] = bytes(view[int(chunk) * size:(int(chunk) + 1) * size])
                manager.complete_load(hits, ctx)
            manager.on_request_finished(ctx)
    finally:
        view.release()
    return got


def offload_mappings() -> set[str]:
    """The CPU tiers (``vllm_offload_*`` files) this process maps now, from /proc/self/maps.
    vLLM unmaps a tier at its manager's shutdown, or keeps it mapped, with a warning, while
    a view of it is still exported: a tier that leaks a view shows here."""
    with open("/proc/self/maps") as maps:
        return {word for line in maps for word in line.split() if "vllm_offload_" in word}


def tier_config(servers: Sequence[str], **extra) -> dict:
    return {"type": "GCacheTier", "module_path": "gcache_vllm.tier",
            "gcache_servers": ",".join(servers), **extra}


# ---- the tier alone, as vLLM's tests of a tier drive it (test_tier_upstream.py) ---------------

CHUNKS, ROW = 8, 16 << 10


class Memory:
    """A CPU tier of the test's own: ``CHUNKS`` rows of ``ROW`` bytes in a mapping."""

    def __init__(self) -> None:
        self.mapping = mmap.mmap(-1, CHUNKS * ROW)
        self.rows = np.frombuffer(self.mapping, np.uint8).reshape(CHUNKS, ROW)
        self.view = memoryview(self.rows)

    def fill(self, chunks, seed: int) -> list[bytes]:
        rng = np.random.default_rng(seed)
        for chunk in chunks:
            self.rows[chunk] = rng.integers(0, 256, ROW, dtype=np.uint8)
        return [self.rows[chunk].tobytes() for chunk in chunks]

    def close(self) -> None:
        """Fails (BufferError) while anything still holds a view of the mapping."""
        self.view.release()
        del self.rows
        self.mapping.close()


def key(n: int) -> OffloadKey:
    """Key ``n`` of group 0."""
    return make_offload_key(n.to_bytes(8, "big"), 0)


def job(job_id: int, keys, chunks, *, promotion: bool = False,
        req: str = "test") -> TransferJob:
    """The job vLLM's manager would hand the tier: ``keys`` to or from ``chunks``."""
    return TransferJob(job_id=job_id, keys=list(keys), chunk_ids=np.array(chunks, np.int64),
                       is_promotion=promotion, req_context=ReqContext(req_id=req))


def drain(tier) -> list:
    """Every submitted job's result (``drain_jobs``, then ``get_finished_jobs``)."""
    tier.drain_jobs()
    return list(tier.get_finished_jobs())


def lookup_and_wait(tier, keys, req: str = "test", *,
                    limit_s: float = 30.0) -> list[LookupResult]:
    """A tier's lookups as the manager asks them: RETRY, the step's end (the probe goes
    out), then again, a step apart, until answered."""
    ctx = ReqContext(req_id=req)
    deadline = time.monotonic() + limit_s
    answers = [tier.lookup(k, ctx) for k in keys]
    while LookupResult.RETRY in answers:
        assert time.monotonic() < deadline, f"lookups still RETRY: {answers}"
        tier.on_schedule_end(END)
        time.sleep(0.01)
        answers = [tier.lookup(k, ctx) for k in keys]
    return answers


def server_of(tier, offload_key) -> str:
    """The server GCache places ``offload_key``'s chunk on."""
    name = tier.pages.object_key("chunk", offload_key.hex(), 0, tier.pages.generation())
    return tier.client.owner(name)


def split_by_server(tier, cluster, n: int, start: int = 0):
    """``n`` keys on the first server and ``n`` on the second."""
    first, second = [], []
    for i in range(start, start + 1000):
        (first if server_of(tier, key(i)) == cluster.addresses[0] else second).append(key(i))
        if len(first) >= n and len(second) >= n:
            return first[:n], second[:n]
    raise AssertionError("keys do not spread over both servers")


@contextlib.contextmanager
def stopped(cluster, *indices: int) -> Iterator[None]:
    """The servers ``indices`` of ``cluster`` (all by default) alive but silent (SIGSTOP)
    within the block."""
    pids = [cluster.servers[i].pid for i in (indices or range(len(cluster.servers)))]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

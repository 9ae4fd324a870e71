"""Interface tier of the GCache linker: SGLang's real device pools on CPU (``MHATokenToKVPool``,
``SWAKVPool``), the linker made by SGLang's own factory from the launch config, driven in the
tree's order (lookup; load, start, the forward's per-layer waits, finish; offload, completion
polls), against real gcache-server processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from gcache.cli.local_cluster import LocalCluster
from gcache.cli.ports import free_port
from gcache.errors import ConfigError

from .device_pools import (
    PAGE,
    WINDOW,
    fill,
    keys_of,
    kv,
    layer_buffers,
    load,
    make_linker,
    mha_pool,
    model_dir,
    offload,
    slots,
    swa,
    swa_pool,
)
from .engine import corrupt_every_value

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture
def linkers():
    made = []

    def make(*args, **kwargs):
        made.append(make_linker(*args, **kwargs))
        return made[-1]

    yield make
    for linker in made:
        linker.close()


def same(a, b, where_a, where_b) -> bool:
    return all(torch.equal(ka[where_a], kb[where_b]) and torch.equal(va[where_a], vb[where_b])
               for (_, ka, va), (_, kb, vb) in zip(layer_buffers(a), layer_buffers(b)))


def test_pages_come_back_layer_by_layer_into_a_fresh_pool(cluster, model, linkers):
    source, target = mha_pool(), mha_pool()
    writer = linkers(cluster.addresses, source, model)
    keys = keys_of(6, seed=1)
    fill([b for _, k, v in layer_buffers(source) for b in (k, v)], slots(1, 4), seed=1)
    assert offload(writer, [kv(keys[:4], slots(1, 4))])
    assert offload(writer, [kv(keys[:4], slots(1, 4))])       # stored already: nothing sent
    assert writer.counters["offloaded_pages"] == 8

    reader = linkers(cluster.addresses, target, model)           # another engine's pool
    reader.phases.take()                                          # the process's, so far
    assert reader.lookup("r1", [kv(keys)]) == [1, 2, 3, 4]       # stops where the pages end
    landed, seen = load(reader, "r1", [kv(keys[:4], slots(20, 4))])
    assert landed and seen == [0, 1, 2]
    assert same(source, target, slots(1, 4), slots(20, 4))
    assert reader.counters["loaded_pages"] == 4
    # the load's phases: the lookup by request, the batch's reads and the forward's waits
    phases = reader.phases.take()
    assert phases["r1"]["probe"] > 0
    (batch,) = [v for k, v in phases.items() if k.startswith("sglang-load-")]
    assert batch["fetch"] > 0 and "layer_wait" in batch
    assert batch["bytes"] == 4 * 3 * 2 * PAGE * 2 * 8 * 4        # pages, layers, K/V, fp32


def test_a_sliding_window_model_reports_only_window_safe_prefixes(cluster, model, linkers):
    """Layers 0 and 2 slide over 32 tokens (2 pages): a prefix of b pages is restorable only
    when the sliding layers' pages b-2 and b-1 are stored, whatever the full layers hold. On
    SGLang's torch_native attention, which would read a loaded window from the wrong slots
    (gcache_sglang.sliding_reads), every such lookup misses."""
    source, target = swa_pool(), swa_pool()
    writer = linkers(cluster.addresses, source, model, window=WINDOW)
    keys = keys_of(6, seed=2)
    buffers = layer_buffers(source)
    fill([b for pool, k, v in buffers if pool == "kv" for b in (k, v)], slots(1, 6), seed=2)
    fill([b for pool, k, v in buffers if pool == "swa" for b in (k, v)], slots(1, 6), seed=3)
    # two nodes' window tails: pages 1-2 and 4-5 of the sliding layers
    assert offload(writer, [kv(keys[:3], slots(1, 3)), swa(keys[1:3], slots(2, 2))])
    assert offload(writer, [kv(keys[3:], slots(4, 3)), swa(keys[4:], slots(5, 2))])

    misread = linkers(cluster.addresses, swa_pool(), model, window=WINDOW,
                      attention_backend="torch_native")
    assert "torch_native" in misread.sliding_loads_off
    assert misread.lookup("r", [kv(keys), swa(keys[-2:])]) == []
    # a full-attention model loads on that backend: its reads need no translation
    assert linkers(cluster.addresses, mha_pool(), model,
                   attention_backend="torch_native").sliding_loads_off is None

    reader = linkers(cluster.addresses, target, model, window=WINDOW, attention_backend="fa3")
    assert reader.sliding_loads_off is None
    assert reader.lookup("r", [kv(keys), swa(keys[-2:])]) == [3, 6]
    assert reader.lookup("r", [kv(keys[:5]), swa(keys[3:5])]) == [3]   # not 4 or 5
    landed, _ = load(reader, "r", [kv(keys[:3], slots(30, 3)), swa(keys[1:3], slots(10, 2))])
    assert landed
    for (pool, ks, vs), (_, kt, vt) in zip(buffers, layer_buffers(target)):
        src, dst = (slots(1, 3), slots(30, 3)) if pool == "kv" else (slots(2, 2), slots(10, 2))
        assert torch.equal(ks[src], kt[dst]) and torch.equal(vs[src], vt[dst])


def test_a_node_stores_only_the_window_tail_of_its_sliding_pages(cluster, model, linkers):
    source = swa_pool()
    writer = linkers(cluster.addresses, source, model, window=WINDOW)
    keys = keys_of(6, seed=4)
    # SGLang hands over every sliding page the node still holds: six here
    assert offload(writer, [kv(keys, slots(1, 6)), swa(keys, slots(1, 6))])
    assert writer.counters["swa_pages_skipped"] == 4
    reader = linkers(cluster.addresses, swa_pool(), model, window=WINDOW)
    assert reader.lookup("r", [kv(keys), swa(keys[-2:])]) == [6]       # the node's end only


def test_keys_name_the_weights_not_only_the_model_path(cluster, tmp_path, linkers):
    path = model_dir(tmp_path / "model", seed=0)
    keys = keys_of(2, seed=5)
    writer = linkers(cluster.addresses, mha_pool(), path)
    assert offload(writer, [kv(keys, slots(1, 2))])
    assert linkers(cluster.addresses, mha_pool(), path).lookup("r", [kv(keys)]) == [1, 2]
    model_dir(path, seed=1)                          # new weights under the same path
    assert linkers(cluster.addresses, mha_pool(), path).lookup("r", [kv(keys)]) == []
    tenant = linkers(cluster.addresses, mha_pool(), path, gcache_namespace="other")
    assert offload(tenant, [kv(keys, slots(1, 2))])
    assert linkers(cluster.addresses, mha_pool(), path).lookup("r", [kv(keys)]) == []


RANK_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
torch.distributed.init_process_group("gloo", rank={rank}, world_size=2,
                                     init_method="tcp://127.0.0.1:{port}")
from tests.device_pools import kv, keys_of, make_linker, mha_pool, offload, slots
import pathlib
linker = make_linker({servers!r}, mha_pool(), pathlib.Path({model!r}))
keys = keys_of(3, seed=6)
if {rank} == 0:
    assert offload(linker, [kv(keys, slots(1, 3))])
torch.distributed.barrier()
print("RESULT", json.dumps([linker.tp_rank, linker.tp_size, linker.lookup("r", [kv(keys)])]))
linker.close()
torch.distributed.barrier()
"""


def test_tensor_parallel_ranks_do_not_share_pages(cluster, model):
    """Two ranks of a real gloo group: rank 0's shard is not rank 1's."""
    port = free_port()
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT.format(
        tests=tests, rank=rank, port=port, servers=cluster.addresses, model=str(model))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    out = [proc.communicate(timeout=240)[0] for proc in procs]
    results = [json.loads(next(line for line in text.splitlines()
                               if line.startswith("RESULT "))[len("RESULT "):])
               for text in out]
    assert results == [[0, 2, [1, 2, 3]], [1, 2, []]], out


def test_a_server_killed_after_the_lookup_fails_only_that_load(tmp_path, model, linkers):
    with LocalCluster(2, memory="128MiB", log_dir=str(tmp_path)) as private:
        source = mha_pool()
        writer = linkers(private.addresses, source, model, gcache_timeout_ms=300)
        keys = keys_of(12, seed=7)
        fill([b for _, k, v in layer_buffers(source) for b in (k, v)], slots(1, 12), seed=7)
        assert offload(writer, [kv(keys, slots(1, 12))])
        reader = linkers(private.addresses, mha_pool(), model, gcache_timeout_ms=300)
        assert reader.lookup("r", [kv(keys)]) == list(range(1, 13))
        private.kill(1)                                  # ... then a server dies
        landed, seen = load(reader, "r", [kv(keys, slots(20, 12))])
        assert not landed and seen == [0, 1, 2]          # every layer resolved, none hangs
        assert reader.counters["failed_loads"] == 1
        # the engine goes on: what is left is found, and a load of it lands
        left = reader.lookup("r2", [kv(keys)])
        assert left == list(range(1, len(left) + 1)) and len(left) < 12
        if left:
            assert load(reader, "r2", [kv(keys[:len(left)], slots(20, len(left)))])[0]


def test_a_corrupted_value_fails_the_load_and_the_next_offload_heals(tmp_path, model,
                                                                     linkers):
    with LocalCluster(1, memory="128MiB", log_dir=str(tmp_path)) as private:
        source, target = mha_pool(), mha_pool()
        settings = {"gcache_verify_arena_reads": True}
        writer = linkers(private.addresses, source, model, **settings)
        keys = keys_of(3, seed=8)
        fill([b for _, k, v in layer_buffers(source) for b in (k, v)], slots(1, 3), seed=8)
        assert offload(writer, [kv(keys, slots(1, 3))])
        assert corrupt_every_value(private.servers[0].shm_name) >= 3 * 3 * 2
        reader = linkers(private.addresses, target, model, **settings)
        assert reader.lookup("r", [kv(keys)]) == [1, 2, 3]
        assert not load(reader, "r", [kv(keys, slots(20, 3))])[0]
        assert reader.lookup("r", [kv(keys)]) == []       # the unreadable parts were dropped
        assert offload(writer, [kv(keys, slots(1, 3))])   # the engine's next save stores them
        assert load(reader, "r", [kv(keys, slots(20, 3))])[0]
        assert same(source, target, slots(1, 3), slots(20, 3))


def test_a_dead_cluster_is_a_miss_and_a_failed_offload(model, linkers):
    linker = linkers([f"127.0.0.1:{free_port()}"], mha_pool(), model, gcache_timeout_ms=200)
    keys = keys_of(2, seed=9)
    assert linker.lookup("r", [kv(keys)]) == []
    assert offload(linker, [kv(keys, slots(1, 2))]) is False
    assert linker.counters["failed_offloads"] == 1


def test_what_cannot_be_placed_is_refused_not_raised(cluster, model, linkers):
    linker = linkers(cluster.addresses, mha_pool(), model)
    keys = keys_of(2, seed=10)
    assert not linker.load("r", [kv(keys, slots(1, 1))])         # one page of slots, two keys
    assert not linker.load("r", [kv(keys, slots(1, 2) + 3)])     # not page-aligned
    assert not linker.offload([swa(keys, slots(1, 2))])          # no sliding pool here
    assert linker.load("r", [kv(keys, slots(1, 2))])
    assert not linker.load("r", [kv(keys, slots(3, 2))])         # already queued
    assert linker.cancel_queued_load("r") and not linker.cancel_queued_load("r")
    assert linker.start_layer_wise_loading() == -1               # nothing left to start
    linker.reset()


def test_settings_are_checked_at_start(cluster, model):
    pool = mha_pool()
    with pytest.raises(ConfigError, match="prefetch_threshold"):
        make_linker(cluster.addresses, pool, model, prefetch_threshold=16)
    with pytest.raises(ConfigError, match="gcache_policy"):
        make_linker(cluster.addresses, pool, model, gcache_policy="tail")
    with pytest.raises(ConfigError, match="gcache_servrs"):
        make_linker(cluster.addresses, pool, model, gcache_servrs="x")
    with pytest.raises(ValueError, match="sliding"):
        make_linker(cluster.addresses, pool, model, window=WINDOW)   # no sliding layers
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    mla = MLATokenToKVPool(256, 16, torch.float32, 64, 16, 2, device="cpu",
                           enable_memory_saver=False)
    with pytest.raises(ValueError, match="MLATokenToKVPool"):
        make_linker(cluster.addresses, mla, model)

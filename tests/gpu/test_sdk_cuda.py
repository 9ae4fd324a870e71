"""The SDK with CUDA tensors on both links: same host (one DMA between the tensor and the
server's registered arena) and TCP (through the client's pinned staging, allocated once and
reused). Needs a CUDA device; ``make gpu-check`` runs it."""

from __future__ import annotations

import pytest

from gcache.sdk import Client

pytestmark = pytest.mark.requires_gpu
MIB = 1 << 20


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_cuda_tensors_round_trip_single_and_batched(cluster_factory, transport):
    import torch
    cluster = cluster_factory(2)
    value = torch.randint(0, 255, (3 * MIB,), dtype=torch.uint8, device="cuda")
    with Client(cluster.addresses, transport=transport) as client:
        assert client.put("one", value)
        out = torch.zeros_like(value)
        assert client.get_into("one", out) == value.numel() and torch.equal(out, value)
        assert client.get("one") == value.cpu().numpy().tobytes()
        keys = [f"b{i}" for i in range(8)]
        values = [torch.roll(value, i) for i in range(8)]
        assert client.batch_put(keys, values) == [True] * 8
        outs = [torch.zeros_like(value) for _ in keys]
        assert client.batch_get_into(keys, outs) == [value.numel()] * 8
        assert all(torch.equal(o, v) for o, v in zip(outs, values))
        assert client.stats()["misses_by_reason"].get("staging", 0) == 0


def test_tcp_staging_is_pinned_once_and_reused(cluster_factory):
    import torch
    cluster = cluster_factory(1)
    value = torch.randint(0, 255, (2 * MIB,), dtype=torch.uint8, device="cuda")
    out = torch.zeros_like(value)
    with Client(cluster.addresses, transport="tcp") as client:
        for i in range(20):
            assert client.put(f"k{i}", value)
            assert client.get_into(f"k{i}", out) == value.numel()
        pool = client._d.cuda_staging().pool
        assert pool.pin and pool.allocations <= 2, pool.allocations   # not one per IO
        assert torch.equal(out, value)


def test_a_tcp_read_of_a_float_tensor_lands_on_the_device(cluster_factory):
    import torch
    cluster = cluster_factory(1)
    kv = torch.randn(4, 16, 128, dtype=torch.bfloat16, device="cuda")
    with Client(cluster.addresses, transport="tcp") as client:
        assert client.put("kv", kv)
        out = torch.empty_like(kv)
        assert client.get_into("kv", out) == kv.numel() * kv.element_size()
        assert torch.equal(out, kv)

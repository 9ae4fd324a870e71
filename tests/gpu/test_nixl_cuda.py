"""CUDA tensors over NIXL: a registered tensor is the transfer's own end (VRAM, GPU Direct where
the NIC allows; UCX's cuda_copy on a host without one), an unregistered one is staged through
pinned host memory. Needs a CUDA device and nixl-cu12; ``make gpu-check`` runs it."""

from __future__ import annotations

import pytest

from gcache.sdk import Client

pytestmark = pytest.mark.requires_gpu
pytest.importorskip("nixl_cu12", reason="NIXL (pip install --no-deps nixl-cu12==1.5.1)")
MIB = 1 << 20
NIXL_SERVER = ("--segment-size", "4MiB", "--lease-ttl", "1.0", "--nixl")


@pytest.mark.parametrize("registered", [True, False])
def test_cuda_tensors_round_trip_over_nixl(cluster_factory, registered):
    import torch
    cluster = cluster_factory(2, server_args=NIXL_SERVER)
    value = torch.randint(0, 255, (3 * MIB,), dtype=torch.uint8, device="cuda")
    out = torch.zeros_like(value)
    with Client(cluster.addresses, transport="nixl", timeout_s=5.0) as client:
        if registered:
            assert client.register_buffer(value) and client.register_buffer(out)
        assert client.put("one", value)
        assert client.get_into("one", out) == value.numel() and torch.equal(out, value)
        assert client.get("one") == value.cpu().numpy().tobytes()
        keys = [f"b{i}" for i in range(8)]
        values = [torch.roll(value, i) for i in range(8)]
        outs = [torch.zeros_like(value) for _ in keys]
        if registered:
            for tensor in values + outs:
                assert client.register_buffer(tensor)
        assert client.batch_put(keys, values) == [True] * 8
        assert client.batch_get_into(keys, outs) == [value.numel()] * 8
        assert all(torch.equal(o, v) for o, v in zip(outs, values))
        stats = client.stats()
        assert stats["misses_by_reason"] == {} and set(stats["transports"].values()) == {"nixl"}


def test_a_bf16_kv_block_lands_on_the_device_over_nixl(cluster_factory):
    import torch
    cluster = cluster_factory(1, server_args=NIXL_SERVER)
    kv = torch.randn(4, 16, 128, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(kv)
    with Client(cluster.addresses, transport="nixl", timeout_s=5.0) as client:
        assert client.register_buffer(out)
        assert client.put("kv", kv)
        assert client.get_into("kv", out) == kv.numel() * kv.element_size()
        assert torch.equal(out, kv)


def test_pinned_staging_registered_with_the_client_moves_without_a_bounce(cluster_factory):
    # The vLLM connector's staging on a GPU host: pinned buffers registered as they are made.
    import torch

    from gcache.transport.pinned import PinnedPool
    cluster = cluster_factory(1, server_args=NIXL_SERVER)
    value = torch.randint(0, 255, (2 * MIB,), dtype=torch.uint8, device="cuda")
    with Client(cluster.addresses, transport="nixl", timeout_s=5.0) as client:
        pool = PinnedPool(pin=True, cap_bytes=16 * MIB, on_new=client.register_buffer,
                          on_drop=client.unregister_buffer)
        host = pool.take(2 * MIB)
        assert host.is_pinned()
        host.copy_(value)
        assert client.put("pinned", host)
        back = pool.take(2 * MIB)
        assert client.get_into("pinned", back) == 2 * MIB
        assert torch.equal(back.to("cuda"), value)
        assert client.stats()["nixl_regions"] >= 3        # bounce slots and both buffers
        assert client.stats()["misses_by_reason"] == {}

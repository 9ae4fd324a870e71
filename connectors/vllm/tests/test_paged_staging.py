"""The device-independent parts of the worker's GPU path, on CPU: vLLM's three KV layouts read
as the same token rows, gather and scatter through block tables with null blocks and a skip,
the pinned pool's reuse bookkeeping, and the staging sink's spans. (The CUDA streams and DMAs
themselves are in ``tests/gpu``.)"""

from __future__ import annotations

import pytest
import torch

from gcache_vllm.paged import PagedLayer
from gcache_vllm.staging import DONE, StagingSink, Transfers

BLOCKS, PAGE, HEADS, HD = 9, 4, 3, 5


def layouts(seed: int = 0) -> dict[str, torch.Tensor]:
    """One KV in vLLM's CPU, FlashAttention and FlashInfer layouts (same values)."""
    k = torch.randn(BLOCKS, PAGE, HEADS, HD, generator=torch.Generator().manual_seed(seed))
    v = torch.randn(BLOCKS, PAGE, HEADS, HD, generator=torch.Generator().manual_seed(seed + 1))
    return {"cpu": torch.cat([k, v], dim=-1).transpose(1, 2).contiguous(),
            "flash_attn": torch.stack([k, v]).contiguous(),
            "flashinfer": torch.stack([k, v], dim=1).contiguous()}


def expected_rows(kv: dict[str, torch.Tensor], blocks: list[int]) -> torch.Tensor:
    """Per token and head, K then V: read straight off the FlashAttention tensor."""
    fa = kv["flash_attn"]
    return torch.cat([torch.cat([fa[0, b], fa[1, b]], dim=-1) for b in blocks])


@pytest.mark.parametrize("name", ["cpu", "flash_attn", "flashinfer"])
def test_every_layout_gathers_the_same_rows(name):
    kv = layouts()
    layer = PagedLayer(kv[name], PAGE)
    assert layer.bytes_per_token == HEADS * 2 * HD * 4
    rows = layer.gather([5, 2, 7, 1], 0, 4 * PAGE)
    assert rows.is_contiguous() and rows.shape == (4 * PAGE, HEADS, 2 * HD)
    assert torch.equal(rows, expected_rows(kv, [5, 2, 7, 1]))
    assert torch.equal(layer.gather([5, 2, 7, 1], 2 * PAGE, 4 * PAGE), expected_rows(kv, [7, 1]))


@pytest.mark.parametrize("name", ["cpu", "flash_attn", "flashinfer"])
def test_scatter_skips_null_blocks_and_the_prefix_vllm_holds(name):
    source = PagedLayer(layouts()[name], PAGE)
    rows = source.gather([3, 4, 6], 0, 3 * PAGE)
    target_kv = {k: torch.zeros_like(t) for k, t in layouts().items()}
    target = PagedLayer(target_kv[name], PAGE)
    skip = PAGE + 1                                    # vLLM holds token 0..PAGE of the prefix
    target.scatter([0, 8, 2], 0, 3 * PAGE, rows.reshape(-1).view(torch.uint8), skip)
    back = target.gather([1, 8, 2], 0, 3 * PAGE)       # block 1 stands for the null block 0
    assert torch.equal(back[2 * PAGE:], rows[2 * PAGE:])
    assert torch.equal(back[skip:2 * PAGE], rows[skip:2 * PAGE])
    assert not back[PAGE:skip].any()                   # before skip: untouched
    assert not target.tensor.select(_block_dim(name), 0).any()   # the null block: untouched


def _block_dim(name: str) -> int:
    return 1 if name == "flash_attn" else 0


def test_held_from_starts_after_the_last_null_block():
    layer = PagedLayer(layouts()["cpu"], PAGE)
    assert layer.held_from([0, 0, 5, 6], 4 * PAGE) == 2 * PAGE
    assert layer.held_from([3, 4, 5], 3 * PAGE) == 0
    assert layer.held_from([3, 0, 5, 6], 4 * PAGE) == 2 * PAGE


def test_a_gather_off_block_boundaries_and_unknown_layouts_are_refused():
    layer = PagedLayer(layouts()["cpu"], PAGE)
    with pytest.raises(ValueError, match="block boundaries"):
        layer.gather([1, 2], 1, 2 * PAGE)
    with pytest.raises(ValueError, match=r"shape \(9, 3, 7, 10\)"):
        PagedLayer(torch.zeros(BLOCKS, HEADS, 7, 2 * HD), PAGE, name="layer x")
    with pytest.raises(ValueError, match="FlashInfer"):
        PagedLayer(torch.zeros(3, 3, PAGE, HEADS, HD), PAGE)


def test_on_cpu_the_transfers_hand_back_the_rows_own_bytes_and_reuse_load_buffers():
    transfers = Transfers(torch.device("cpu"))
    rows = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    host, ready = transfers.to_host(rows)
    assert ready is DONE and host.data_ptr() == rows.data_ptr() and host.numel() == 96
    staged, copied = transfers.to_device(host)
    assert staged is host and copied is DONE
    transfers.release(host)                           # the rows' own bytes: not the pool's
    loaded = transfers.host_buffer(10)                # a load's buffer: the pool's, reused
    assert loaded.numel() == 10 and transfers.pool.allocations == 1
    transfers.release(loaded)
    again = transfers.host_buffer(10)
    assert again.data_ptr() == loaded.data_ptr() and transfers.pool.allocations == 1


def test_the_staging_sink_hands_out_slices_of_one_buffer_per_layer():
    spans = {0: (0, 8), 1: (4, 8)}
    sink = StagingSink(Transfers(torch.device("cpu")), lambda layer: 10, spans.__getitem__)
    a, b = sink.write_target(0, 0, 4), sink.write_target(0, 4, 8)
    assert a.numel() == b.numel() == 40 and b.data_ptr() == a.data_ptr() + 40
    assert sink.write_target(1, 4, 8).numel() == 40
    with pytest.raises(ValueError, match=r"tokens \[0, 4\) are outside the staged span \[4, 8\)"):
        sink.write_target(1, 0, 4)
    sink.release()
    assert sink.spans == {}

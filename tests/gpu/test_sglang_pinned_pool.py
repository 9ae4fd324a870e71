"""SGLang's HiCache on a GPU host: its host pool is pinned memory, filled from and drained to
the device pool by its own copies, and GCache's backend reads and writes that pinned pool in
place through (pointer, size) pairs (``get_page_buffer_meta`` -> ``gcache.kv.page_regions`` ->
``EnginePages``), the calls ``gcache_sglang.storage`` makes. The check machine has no SGLang, so
the pools are laid out here as SGLang's MHA host pool lays them out: ``layer_first``
(``[2, layers, tokens, heads, dim]``: K and V per layer of a page) and ``page_first``
(``[tokens, 2, layers, heads, dim]``: one region per page)."""

from __future__ import annotations

import pytest

from gcache.kv import EnginePages, page_regions
from gcache.sdk import Client

pytestmark = pytest.mark.requires_gpu
LAYERS, HEADS, DIM, PAGE, PAGES = 4, 8, 128, 64, 16


def pinned_pool(layout: str):
    import torch
    tokens = PAGE * PAGES
    shape = (2, LAYERS, tokens, HEADS, DIM) if layout == "layer_first" else \
        (tokens, 2, LAYERS, HEADS, DIM)
    return torch.zeros(shape, dtype=torch.bfloat16, pin_memory=True)


def page_buffer_meta(pool, layout: str, pages: list[int]) -> tuple[list[int], list[int]]:
    """SGLang's (pointers, sizes) for whole pages: per page, K and V of each layer
    (layer_first) or the page's one contiguous region (page_first)."""
    pointers, sizes = [], []
    for page in pages:
        tokens = slice(page * PAGE, (page + 1) * PAGE)
        if layout == "layer_first":
            for kv in range(2):
                for layer in range(LAYERS):
                    part = pool[kv, layer, tokens]
                    pointers.append(part.data_ptr())
                    sizes.append(part.numel() * part.element_size())
        else:
            part = pool[tokens]
            pointers.append(part.data_ptr())
            sizes.append(part.numel() * part.element_size())
    return pointers, sizes


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_pages_backed_up_from_the_device_through_the_pinned_pool_come_back(cluster_factory,
                                                                            layout, transport):
    import torch
    cluster = cluster_factory(2)
    host = pinned_pool(layout)
    assert host.is_pinned()
    device = torch.randn(host.shape, dtype=host.dtype, device="cuda")
    host.copy_(device, non_blocking=True)                  # SGLang's backup_from_device
    torch.cuda.current_stream().synchronize()
    keys = [f"{i:064x}" for i in range(PAGES)]
    with Client(cluster.addresses, transport=transport) as client:
        pages = EnginePages(client, "sgl/gpu-check", {"layout": layout})
        pages.add_pool("kv", layout=layout)
        regions = page_regions(*page_buffer_meta(host, layout, list(range(PAGES))), PAGES)
        assert all(pages.write("kv", keys, regions))
        host.zero_()
        assert all(pages.read("kv", keys, regions))
    back = torch.empty_like(device)
    back.copy_(host, non_blocking=True)                    # SGLang's load_to_device
    torch.cuda.current_stream().synchronize()
    assert torch.equal(back, device)

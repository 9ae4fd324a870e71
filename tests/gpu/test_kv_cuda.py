"""``gcache.kv`` over CUDA tensors: the MiMo-V2.5-Pro layout (70 layers, 60 of them sliding with
a 128-token window, K 192 and V 128 per head) saved from per-layer device buffers, matched, and
loaded into other device buffers, over shared memory (one DMA per object between the tensor
and the arena) and TCP (through the client's pinned staging). The CPU variant runs the same
code with host tensors."""

from __future__ import annotations

import pytest
import torch

from gcache.kv import KVStore, LayerArrays, ModelLayout, tail_span
from gcache.sdk import Client

CUDA = pytest.param("cuda", marks=pytest.mark.requires_gpu)
PAGE, PAGES = 64, 4


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_mimo_pro_kv_saves_matches_and_loads_between_device_buffers(cluster_factory, device,
                                                                   transport):
    layout = ModelLayout.from_config("mimo-v2.5-pro", page_size=PAGE)
    tokens = list(range(5000, 5000 + PAGE * PAGES))
    g = torch.Generator().manual_seed(3)
    source = {layer: torch.randint(0, 255, (len(tokens) * layout.layer_bytes_per_token(layer),),
                                   generator=g, dtype=torch.uint8).to(device)
              for layer in range(layout.num_layers)}
    target = {layer: torch.zeros_like(t) for layer, t in source.items()}
    cluster = cluster_factory(2, memory="256MiB")
    with Client(cluster.addresses, transport=transport, timeout_s=5.0) as client, \
            KVStore(client, layout, policy="tail") as store:
        result = store.save(tokens, LayerArrays(layout, source))
        assert result.objects_failed == 0 and result.objects_written > 0
        assert store.match(tokens) == len(tokens)
        handle = store.load(tokens, len(tokens), LayerArrays(layout, target))
        assert handle.wait(timeout_s=60) and not handle.failed_layers
        assert client.stats()["misses_by_reason"].get("staging", 0) == 0
    start, stop = tail_span(PAGES, PAGE, layout.window)
    for layer in range(layout.num_layers):
        bpt = layout.layer_bytes_per_token(layer)
        span = slice(start * bpt, stop * bpt) if layout.is_swa(layer) else slice(None)
        assert torch.equal(target[layer][span], source[layer][span]), f"layer {layer}"

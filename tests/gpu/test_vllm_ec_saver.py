"""The vLLM EC connector's saver on a GPU: an encoder output still being written by kernels on
the forward stream is put as it is once they end (the saver's copy waits for an event recorded
after them, on a stream of its own), while the forward thread goes on; on a CPU engine the
same calls put the tensor's own bytes."""

from __future__ import annotations

import pytest
import torch

from gcache import Client
from gcache.mm import EncoderCache
from gcache_vllm.ec_saver import EncoderSaver


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.requires_gpu)])
def test_an_output_the_forward_stream_is_still_writing_is_saved_whole(cluster_factory, device):
    cluster = cluster_factory(1)
    with Client(cluster.addresses, timeout_s=5.0) as client:
        cache = EncoderCache(client, encoder="gpu-check")
        saver = EncoderSaver(cache)
        outputs = []
        for i in range(8):
            out = torch.zeros(576, 1024, dtype=torch.bfloat16, device=device)
            for _ in range(50):                  # kernels still queued when the save starts
                out.add_(0.5)
            out.add_(i)
            assert saver.submit(cache.key(f"img-{i}"), out)
            outputs.append(out)
        saver.close()
        assert saver.counters == {"saves": 8, "save_failures": 0, "saves_skipped": 0}
        for i, out in enumerate(outputs):
            got = cache.get(cache.key(f"img-{i}"), device=device)
            assert got is not None and torch.equal(got, out), i

"""``gcache.mm.EncoderCache`` on a real local cluster: encoder outputs stored once and read
straight into tensors, keyed by everything that changes them; a wrong shape or a dead server is
a miss, never a wrong tensor or an exception."""

import pytest
import torch

from gcache.errors import InvalidRequest
from gcache.mm import EncoderCache, EncoderOutput
from gcache.sdk import Client

PRE = {"image_size": 336, "patch_size": 14, "dtype": "bfloat16"}


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(2, memory="64MiB")


@pytest.fixture
def cache(cluster):
    with Client(cluster.addresses, timeout_s=2.0) as client:
        yield EncoderCache(client, encoder="tiny-vl@abc123")


def embeds(seed: int, tokens: int = 576, hidden: int = 64, dtype=torch.bfloat16):
    return torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_an_output_is_read_back_into_the_callers_tensor(cache):
    key = cache.key("sha256:image-a", PRE)
    value = embeds(1)
    assert not cache.exists(key)
    assert cache.put(key, value) and cache.exists(key)
    out = torch.empty_like(value)
    assert cache.get_into(key, out) and torch.equal(out, value)
    assert cache.describe(key) == EncoderOutput("bfloat16", (576, 64))
    got = cache.get(key)
    assert got.dtype == torch.bfloat16 and torch.equal(got, value)


def test_everything_that_changes_the_output_is_in_the_key(cache, cluster):
    key = cache.key("sha256:image-a", PRE)
    assert key == cache.key("sha256:image-a", dict(reversed(PRE.items())))   # order-free
    others = [cache.key("sha256:image-b", PRE),
              cache.key("sha256:image-a", {**PRE, "image_size": 448}),
              cache.key("sha256:image-a", {**PRE, "dtype": "float16"}),
              EncoderCache(cache.client, encoder="tiny-vl@def456").key("sha256:image-a", PRE),
              EncoderCache(cache.client, encoder="tiny-vl@abc123",
                           namespace="tenant-2").key("sha256:image-a", PRE)]
    assert len({key, *others}) == 6
    assert cache.put(key, embeds(2))
    assert cache.exists_many([key, *others]) == [True] + [False] * 5


def test_an_output_of_another_dtype_or_shape_is_a_miss(cache):
    key = cache.key("sha256:image-c", PRE)
    assert cache.put(key, embeds(3, tokens=100))
    for wrong in (torch.empty(100, 64, dtype=torch.float16),     # same bytes, other dtype
                  torch.empty(50, 128, dtype=torch.bfloat16),    # same bytes, other shape
                  torch.empty(99, 64, dtype=torch.bfloat16),     # smaller
                  torch.empty(101, 64, dtype=torch.bfloat16)):   # larger
        assert cache.get_into(key, wrong) is False
    assert cache.get_into_many([key, cache.key("absent")],
                               [torch.empty(100, 64, dtype=torch.bfloat16),
                                torch.empty(100, 64, dtype=torch.bfloat16)]) == [True, False]
    other = cache.key("sha256:image-d", PRE)
    assert cache.put(other, embeds(4, tokens=10))
    assert cache.get_into_many([key, other],            # the second's out is too small
                               [torch.empty(100, 64, dtype=torch.bfloat16),
                                torch.empty(5, 64, dtype=torch.bfloat16)]) == [True, False]


def test_a_dead_server_is_a_miss_not_an_exception(cache, cluster):
    keys = [cache.key(f"sha256:frame-{i}", PRE) for i in range(8)]
    values = [embeds(10 + i, tokens=64) for i in range(8)]
    assert all(cache.put_many(keys, values))
    cluster.kill(0)
    outs = [torch.empty_like(v) for v in values]
    got = cache.get_into_many(keys, outs)
    assert 0 < sum(got) < len(keys)                     # the other server's still read
    assert all(torch.equal(o, v) for o, v, ok in zip(outs, values, got) if ok)
    assert cache.exists_many(keys) == got


def test_bad_arguments_are_refused_by_name(cache):
    with pytest.raises(InvalidRequest, match="media_hash is empty"):
        cache.key("")
    with pytest.raises(InvalidRequest, match="encoder is empty"):
        EncoderCache(cache.client, encoder="")
    with pytest.raises(InvalidRequest, match="not contiguous"):
        cache.put(cache.key("x"), embeds(4).t())
    with pytest.raises(InvalidRequest, match="2 keys and 1 tensors"):
        cache.put_many(["a", "b"], [embeds(5)])

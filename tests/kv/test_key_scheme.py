"""A connector's published key scheme: another process that reads it matches exactly what the
connector stored, on a real local cluster."""

import time

import numpy as np
import pytest

from gcache.errors import InvalidRequest
from gcache.kv import KeyScheme, KVStore, LayerArrays, SchemePublisher
from gcache.kv.key_scheme import read, scheme_key
from gcache.sdk import Client
from tests.kv.layouts import full_attention, hybrid


@pytest.fixture(scope="module")
def kv_client(shared_cluster):
    with Client(shared_cluster.addresses, timeout_s=2.0) as client:
        yield client


@pytest.mark.parametrize("layout, policy", [
    (hybrid(window=64, page=32, model="scheme-hybrid", tp_rank=1, tp_size=2), "adaptive"),
    (hybrid(window=64, page=32, model="scheme-full-layer"), "full-layer"),
    (full_attention(page=16, model="scheme-llama"), "tail"),
], ids=["hybrid-tp1", "full-layer", "llama"])
def test_a_reader_of_the_scheme_matches_what_the_engine_stored(kv_client, layout, policy):
    tokens = np.random.default_rng(7).integers(0, 50_000, 8 * layout.page_size + 3)
    arrays = {layer: np.ones((len(tokens), layout.layer_bytes_per_token(layer)), np.uint8)
              for layer in range(layout.num_layers)}
    served = f"served/{layout.model}"
    with KVStore(kv_client, layout, policy=policy, group_head_tokens=64) as engine:
        SchemePublisher(kv_client, served, KeyScheme(layout, policy, 64)).tick()
        assert engine.save(tokens, LayerArrays(layout, arrays)).objects_failed == 0
        expected = engine.match(tokens)
    assert expected >= 4 * layout.page_size
    scheme = None
    for _ in range(50):                    # the publisher's put is asynchronous
        scheme = read(kv_client, served)
        if scheme is not None:
            break
        time.sleep(0.02)
    assert scheme == KeyScheme(layout, policy, 64)
    with scheme.store(kv_client) as router_side:
        assert router_side.match(tokens) == expected


def test_an_unpublished_name_reads_none_and_a_foreign_value_is_refused(kv_client):
    assert read(kv_client, "never-published") is None
    assert kv_client.put(scheme_key("garbage"), b"{\"format\": \"other/9\"}")
    with pytest.raises(InvalidRequest, match="format 'other/9'"):
        read(kv_client, "garbage")
    assert kv_client.put(scheme_key("broken"), b"not json")
    with pytest.raises(InvalidRequest, match="not a key scheme"):
        read(kv_client, "broken")
    with pytest.raises(InvalidRequest, match="empty"):
        scheme_key("")

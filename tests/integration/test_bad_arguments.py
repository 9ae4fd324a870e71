"""Bad arguments raise ValueError / TypeError naming the value and the rule, before any IO."""

import numpy as np
import pytest

from gcache import Client


def test_key_rules(client):
    with pytest.raises(ValueError, match="key is empty"):
        client.put("", b"v")
    with pytest.raises(ValueError, match="1025 bytes; limit is 1024"):
        client.get(b"k" * 1025)
    with pytest.raises(TypeError, match="key must be str or bytes"):
        client.exists(42)


def test_value_rules(shared_cluster):
    with Client(shared_cluster.addresses, max_value_size=1000) as small:
        with pytest.raises(ValueError, match="value is empty"):
            small.put("k", b"")
        with pytest.raises(ValueError, match="1001 bytes; limit is max_value_size=1000"):
            small.put("k", b"x" * 1001)
        with pytest.raises(ValueError, match=r"values\[1\] is empty"):
            small.batch_put(["a", "b"], [b"x", b""])


def test_buffer_rules(client):
    grid = np.zeros((8, 8), dtype=np.uint8)
    with pytest.raises(ValueError, match="non-contiguous"):
        client.put("k", grid[:, ::2])
    with pytest.raises(TypeError, match="out is read-only"):
        client.get_into("k", b"immutable")
    with pytest.raises(ValueError, match="3 keys and 2 values"):
        client.batch_put(["a", "b", "c"], [b"1", b"2"])


def test_out_smaller_than_the_value_is_a_value_error_and_the_client_recovers(client):
    client.put("small-out", b"x" * 100)
    with pytest.raises(ValueError, match="out is 10 bytes; the value is 100 bytes"):
        client.get_into("small-out", bytearray(10))
    with pytest.raises(ValueError, match=r"outs\[0\] is 10 bytes"):
        client.batch_get_into(["small-out"], [bytearray(10)])
    out = bytearray(100)
    assert client.get_into("small-out", out) == 100 and out == b"x" * 100


def test_client_construction_rules():
    with pytest.raises(ValueError, match="give either servers"):
        Client([])
    with pytest.raises(ValueError, match="give either servers"):
        Client(["127.0.0.1:1"], master="127.0.0.1:2")
    with pytest.raises(ValueError, match="master"):
        Client(master="nonsense")
    with pytest.raises(TypeError, match="not one str"):
        Client("127.0.0.1:1")
    with pytest.raises(ValueError, match="HOST:PORT"):
        Client(["nonsense"])
    with pytest.raises(TypeError, match="unknown Client arguments"):
        Client(["127.0.0.1:1"], timeout=3)

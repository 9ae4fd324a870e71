"""Every SDK method, for values of 1 B, 4 KiB, 4 MiB and 64 MiB and every buffer type."""

import itertools

import numpy as np
import pytest

SIZES = [1, 4096, 4 << 20, 64 << 20]
BUFFERS = ["bytes", "bytearray", "memoryview", "numpy", "torch"]
_names = itertools.count()


def data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def as_buffer(kind: str, raw: bytes):
    if kind == "bytes":
        return raw
    if kind == "bytearray":
        return bytearray(raw)
    if kind == "memoryview":
        return memoryview(raw)
    if kind == "numpy":
        return np.frombuffer(raw, dtype=np.uint8).copy()
    torch = pytest.importorskip("torch")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def empty_out(kind: str, size: int):
    if kind == "torch":
        torch = pytest.importorskip("torch")
        return torch.zeros(size, dtype=torch.uint8)
    if kind == "numpy":
        return np.zeros(size, dtype=np.uint8)
    if kind == "memoryview":
        return memoryview(bytearray(size))
    return bytearray(size)                        # bytes cannot be written into


def as_bytes(out) -> bytes:
    return out.numpy().tobytes() if hasattr(out, "numpy") and not isinstance(out, np.ndarray) \
        else bytes(out)


def fresh_key(prefix: str) -> str:
    return f"{prefix}/{next(_names)}"


@pytest.mark.parametrize("kind", BUFFERS)
@pytest.mark.parametrize("size", SIZES)
def test_put_get_get_into_exists_delete(client, size, kind):
    raw, key = data(size, size), fresh_key("single")
    assert client.put(key, as_buffer(kind, raw)) is True
    assert client.exists(key) is True
    assert client.get(key) == raw
    out = empty_out(kind, size + 7)              # a larger out is fine; the length says how much
    assert client.get_into(key, out) == size
    assert as_bytes(out)[:size] == raw
    assert client.delete(key) is True
    assert client.exists(key) is False and client.get(key) is None
    assert client.delete(key) is False


@pytest.mark.parametrize("kind", BUFFERS)
@pytest.mark.parametrize("size", SIZES)
def test_batch_methods(client, size, kind):
    count = 3 if size >= 64 << 20 else 6
    keys = [fresh_key("batch") for _ in range(count)]
    raws = [data(size, i) for i in range(count)]
    assert client.batch_put(keys, [as_buffer(kind, r) for r in raws]) == [True] * count
    assert client.batch_exists(keys + ["batch/absent"]) == [True] * count + [False]
    assert client.batch_get(keys + ["batch/absent"]) == raws + [None]
    outs = [empty_out(kind, size) for _ in range(count)]
    assert client.batch_get_into(keys, outs) == [size] * count
    assert [as_bytes(o) for o in outs] == raws


@pytest.mark.parametrize("size", SIZES)
def test_async_methods_return_futures(client, size):
    raw, key = data(size, 99), fresh_key("async")
    assert client.put_async(key, raw).result(timeout=30) is True
    assert client.get_async(key).result(timeout=30) == raw
    out = bytearray(size)
    assert client.get_into_async(key, out).result(timeout=30) == size and out == raw


def test_group_keeps_a_prefix_on_group_width_servers(client, shared_cluster):
    keys = [fresh_key("grouped") for _ in range(40)]
    assert all(client.batch_put(keys, [b"v"] * 40, group="tree-1"))
    assert client.batch_get(keys, group="tree-1") == [b"v"] * 40
    assert client.get(keys[0], group="tree-1") == b"v"
    per_server = {a: s["tier"]["objects"] for a, s in client.server_stats().items()}
    assert all(n > 0 for n in per_server.values())   # width 2 over 2 servers: both used


def test_overwrite_replaces_the_value(client):
    key = fresh_key("overwrite")
    assert client.put(key, b"first")
    assert client.put(key, b"second value")
    assert client.get(key) == b"second value"


def test_stats_count_hits_and_misses_by_reason(client):
    key = fresh_key("stats")
    client.put(key, b"x")
    client.get(key)
    client.get("stats/absent")
    stats = client.stats()
    assert stats["hits"] >= 1 and stats["misses_by_reason"]["absent"] >= 1
    assert stats["bytes_written"] >= 1 and stats["suspect_servers"] == []


def test_a_batch_takes_one_group_per_key(client, shared_cluster):
    keys = [fresh_key("per-key-group") for _ in range(40)]
    groups: list[str | None] = ["tree-a" if i % 2 else "tree-b" for i in range(40)]
    groups[7] = None                                    # one key placed by itself
    values = [f"v{i}".encode() for i in range(40)]
    assert all(client.batch_put(keys, values, group=groups))
    assert client.batch_get(keys, group=tuple(groups)) == values
    assert all(client.batch_exists(keys, group=groups))
    # each key is where a single-key call with its own group looks for it
    assert [client.get(k, group=g) for k, g in zip(keys, groups)] == values
    with pytest.raises(ValueError, match="39 groups for 40 keys"):
        client.batch_get(keys, group=groups[:-1])

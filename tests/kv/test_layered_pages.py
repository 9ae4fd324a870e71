"""``LayeredPages``: an engine's pages stored one object per (page, layer pool, part), checked,
written and dropped across many layer pools in one batch, read one layer at a time."""

from __future__ import annotations

import numpy as np
import pytest

from gcache.errors import InvalidRequest
from gcache.kv import EnginePages, LayeredPages, PoolPages
from gcache.sdk import Client

LAYERS, PARTS, PART_BYTES = 3, 2, 256


@pytest.fixture
def store(shared_cluster):
    with Client(shared_cluster.addresses, timeout_s=5.0) as client:
        pages = EnginePages(client, "test/layered", {"model": "m", "tp": "0/1"},
                            generation_refresh_s=0.0)
        for layer in range(LAYERS):
            pages.add_pool(f"kv.{layer}", dtype="bf16", layer=layer)
        yield LayeredPages(pages)


def pool(n_pages: int, seed: int) -> np.ndarray:
    """A layer-major pool: [layer, page, part, bytes]."""
    return np.random.default_rng(seed).integers(0, 256, (LAYERS, n_pages, PARTS, PART_BYTES),
                                                dtype=np.uint8)


def regions(buf: np.ndarray, layer: int) -> list[list[memoryview]]:
    return [[memoryview(buf[layer, page, part]) for part in range(PARTS)]
            for page in range(buf.shape[1])]


def pools() -> list[tuple[str, int]]:
    return [(f"kv.{layer}", PARTS) for layer in range(LAYERS)]


def test_every_layer_of_many_pages_round_trips(store):
    keys = [f"layered-a-{i}" for i in range(4)]
    source = pool(4, seed=1)
    batches = [PoolPages(f"kv.{layer}", keys, regions(source, layer)) for layer in range(LAYERS)]
    assert store.write(batches) == [True] * LAYERS
    assert store.present(pools(), keys) == {name: [True] * 4 for name, _ in pools()}
    target = np.zeros_like(source)
    for layer in range(LAYERS):
        assert store.read(f"kv.{layer}", keys, regions(target, layer)) == [True] * 4
    assert np.array_equal(source, target)


def test_presence_is_per_pool_and_per_page(store):
    keys = [f"layered-b-{i}" for i in range(3)]
    source = pool(3, seed=2)
    # layer 2 holds only the last page (a window tail); layers 0 and 1 hold every page
    assert store.write([PoolPages("kv.0", keys, regions(source, 0)),
                        PoolPages("kv.1", keys, regions(source, 1)),
                        PoolPages("kv.2", keys[2:], regions(source, 2)[2:])]) == [True] * 3
    found = store.present(pools(), keys)
    assert found == {"kv.0": [True] * 3, "kv.1": [True] * 3, "kv.2": [False, False, True]}


def test_drop_removes_a_page_in_every_layer(store):
    keys = [f"layered-c-{i}" for i in range(2)]
    source = pool(2, seed=3)
    store.write([PoolPages(f"kv.{layer}", keys, regions(source, layer))
                 for layer in range(LAYERS)])
    assert store.drop(pools(), keys[:1]) == LAYERS * PARTS
    found = store.present(pools(), keys)
    assert all(found[name] == [False, True] for name, _ in pools())
    assert store.write([PoolPages(f"kv.{layer}", keys, regions(source, layer))
                        for layer in range(LAYERS)]) == [True] * LAYERS   # stored again


def test_bad_batches_are_refused_by_name(store):
    with pytest.raises(InvalidRequest, match="kv.0: 2 page keys but 1 part lists"):
        store.write([PoolPages("kv.0", ["x", "y"], [[memoryview(b"a")]])])
    with pytest.raises(InvalidRequest, match="at least one"):
        store.present([], ["x"])
    with pytest.raises(InvalidRequest, match="unknown pool"):
        store.present([("nope", 1)], ["x"])

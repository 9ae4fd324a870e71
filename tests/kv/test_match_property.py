"""Property: ``match`` never reports a boundary whose pages or window tail are missing, under
random saves, deletes and evictions, on a real server with a small arena."""

import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gcache.kv import KVStore, LayerArrays, page_keys
from gcache.kv.window import leading
from gcache.sdk import Client
from tests.kv.layouts import hybrid

PAGE = 16
BASE = np.random.default_rng(11).integers(0, 1000, 12 * PAGE)
# Sequences that share prefixes of different lengths with the base, as conversations do.
SEQUENCES = [BASE[:n * PAGE + extra] for n, extra in ((12, 0), (8, 5), (5, 0), (3, 9))] + [
    np.concatenate([BASE[:k * PAGE], np.full(6 * PAGE, 2000 + k)]) for k in (2, 7)]
POLICIES = ["tail", "checkpoint-2", "checkpoint-5", "adaptive", "full-layer"]

operations = st.lists(st.one_of(
    st.tuples(st.just("save"), st.integers(0, len(SEQUENCES) - 1),
              st.integers(0, len(POLICIES) - 1)),
    st.tuples(st.just("delete"), st.integers(0, len(SEQUENCES) - 1), st.integers(0, 10_000)),
    st.tuples(st.just("fill"), st.integers(1, 6), st.integers(0, 0)),
), min_size=1, max_size=14)


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory):
    from gcache.cli.local_cluster import LocalCluster
    with LocalCluster(1, memory="512KiB", server_args=("--segment-size", "64KiB"),
                      log_dir=str(tmp_path_factory.mktemp("logs"))) as cluster, \
            Client(cluster.addresses, timeout_s=2.0) as client:
        yield client


def required_keys(store: KVStore, hashes: list[bytes], boundary: int) -> list[str]:
    keys = [page_keys.page_key(h, layer) for h in hashes[:boundary]
            for layer in store.paged_layers]
    if boundary and store.tail_layers:
        keys += [page_keys.tail_key(hashes[boundary - 1], layer) for layer in store.tail_layers]
    return keys


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, window=st.sampled_from([8, 16, 40]))
def test_match_never_reports_a_missing_page_or_tail(small_cluster, ops, window):
    client = small_cluster
    layout = hybrid(window=window, page=PAGE, model=f"prop-{uuid.uuid4().hex[:8]}")
    arrays = {layer: np.full((16 * PAGE, layout.layer_bytes_per_token(layer)), layer + 1,
                             np.uint8) for layer in range(layout.num_layers)}
    stores = {p: KVStore(client, layout, policy=p, pressure_poll_s=0.0) for p in POLICIES}
    try:
        for op, a, b in ops:
            tokens = SEQUENCES[a] if op != "fill" else None
            if op == "save":
                stores[POLICIES[b]].save(tokens, LayerArrays(layout, arrays))
            elif op == "delete":
                store = stores["tail"]
                hashes = store.hashes(tokens)
                keys = required_keys(store, hashes, len(hashes)) + \
                    [page_keys.tail_key(h, layer) for h in hashes for layer in store.tail_layers]
                key = keys[b % len(keys)]
                client.delete(key, group=store.key_groups(hashes, [key])[0])
            else:                                    # other traffic: forces evictions
                client.batch_put([f"junk/{uuid.uuid4().hex}" for _ in range(a)],
                                 [bytes(60_000)] * a)
            for store in (stores["tail"], stores["full-layer"]):
                for seq in SEQUENCES:
                    probe = store.probe(seq)
                    keys = required_keys(store, list(probe.hashes), probe.hit_pages)
                    present = client.batch_exists(
                        keys, group=store.key_groups(probe.hashes, keys))
                    assert all(present), f"match {probe.hit_pages} pages with a missing object"
                    event(f"hit {'>0' if probe.hit_pages else '0'}")
                    width = len(store.paged_layers)
                    paged = [page_keys.page_key(h, layer) for h in probe.hashes
                             for layer in store.paged_layers]
                    flat = client.batch_exists(paged,
                                               group=store.key_groups(probe.hashes, paged))
                    pages = [all(flat[i:i + width]) for i in range(0, len(flat), width)]
                    assert probe.hit_pages <= leading(pages) == probe.shared_pages
    finally:
        for store in stores.values():
            store.close()

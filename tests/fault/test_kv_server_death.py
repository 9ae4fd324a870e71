"""gcache.kv with a dead server: shorter matches, failed layers and unstored objects, never an
exception and never a stall beyond the IO timeout."""

import numpy as np

from gcache.kv import KVStore, LayerArrays
from gcache.sdk import Client
from tests.kv.layouts import hybrid


def test_a_killed_server_turns_into_misses_not_errors(cluster_factory):
    cluster = cluster_factory(2, memory="64MiB")
    layout = hybrid(model="fault")
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, 9999, 6 * 64) for _ in range(8)]
    arrays = {layer: np.ones((6 * 64, layout.layer_bytes_per_token(layer)), np.uint8)
              for layer in range(layout.num_layers)}
    with Client(cluster.addresses, timeout_s=0.5) as client, \
            KVStore(client, layout, policy="tail") as store:
        for tokens in sequences:
            store.save(tokens, LayerArrays(layout, arrays))
        assert all(store.match(t) == 6 * 64 for t in sequences)
        cluster.kill(0)
        hits = [store.match(t) for t in sequences]
        # A prefix whose group slots both sit on the survivor stays whole; any other is gone.
        assert all(h in (0, 6 * 64) for h in hits) and 0 in hits
        out = {layer: np.zeros_like(a) for layer, a in arrays.items()}
        lost = sequences[hits.index(0)]
        handle = store.load(lost, 6 * 64, LayerArrays(layout, out))
        assert handle.wait(timeout_s=10) is False and handle.failed_layers
        saves = [store.save(rng.integers(0, 9999, 6 * 64), LayerArrays(layout, arrays))
                 for _ in range(8)]                      # some land on the dead server
        assert sum(s.objects_failed for s in saves) > 0
        assert sum(s.objects_written for s in saves) > 0
        assert client.stats()["misses_by_reason"]

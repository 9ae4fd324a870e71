"""gcache-router's prefetch with real servers: once a request is routed, ``GCacheHits`` has the
servers promote the objects of GCache's hit from their cold tier, with the keys the engine's
published scheme gives, so the engine's load finds them in memory."""

import os

import numpy as np

from gcache import Client
from gcache.cli.replay import ZeroKV
from gcache.kv import KVStore, ModelLayout
from gcache.kv.key_scheme import KeyScheme, publish
from gcache.kv.page_keys import GROUP_HEAD_TOKENS
from gcache.router.gcache_hits import GCacheHits
from tests.integration.test_tiers import SERVER_ARGS, VALUE, value


def test_the_router_promotes_a_routed_requests_hit_from_the_cold_tier(cluster_factory,
                                                                      tmp_path):
    os.makedirs(tmp_path / "disk")
    cluster = cluster_factory(1, memory="8MiB", server_args=(
        *SERVER_ARGS, "--disk-dir", str(tmp_path / "disk")))
    layout = ModelLayout.from_config("gemma-3-1b", page_size=16).scaled(64)
    tokens = [int(t) for t in np.arange(16 * 10)]
    with Client(cluster.addresses, timeout_s=3.0) as engine_side, \
            KVStore(engine_side, layout, pressure_poll_s=0.0) as store:
        assert store.save(tokens, ZeroKV(layout)).bytes_written > 0
        assert publish(engine_side, "tiny", KeyScheme(layout, store.policy.name,
                                                      GROUP_HEAD_TOKENS))
        for i in range(3 * (8 << 20) // VALUE):       # the engine's pages go to disk
            assert engine_side.put(f"filler{i}", value(i))
    hits = GCacheHits(Client(cluster.addresses, timeout_s=3.0))
    try:
        hit = hits.hit_tokens("tiny", tokens)
        assert hit == 16 * 10
        hits.prefetch("tiny", tokens, hit)
        promoted = hits.prefetched_objects
        assert promoted > 0
        hits.prefetch("tiny", tokens, hit)            # now in memory: nothing more to promote
        assert hits.prefetched_objects == promoted
        hits.prefetch("unknown-model", tokens, hit)   # no scheme: nothing asked, no error
        assert hits.prefetched_objects == promoted
    finally:
        hits.close()

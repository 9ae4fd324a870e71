"""Prometheus metrics of ``gcache.kv``, in the process that runs it: an engine's, whose own
/metrics (vLLM's) serves the default registry, so these appear beside the engine's and the
SDK's ``gcache_sdk_*`` with nothing to serve here.

``gcache_kv_lookup_tokens_total`` counts the tokens a lookup (``KVStore.probe`` / ``match``)
asked for and ``gcache_kv_hit_tokens_total`` the window-safe hit it found: their ratio is the
connector's token hit rate. A save's own probe is no lookup and is not counted.
``gcache_kv_load_seconds`` observes each load of a hit once, from ``KVStore.load`` to its last
layer's completion (queueing on the loader threads included: the engine waits for that).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# From a same-host load of a few pages (a fraction of a millisecond) to a long prefix over TCP.
LOAD_BUCKETS_S = (50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
                  0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

LOOKUP_TOKENS = Counter("gcache_kv_lookup_tokens", "Tokens a lookup asked for")
HIT_TOKENS = Counter("gcache_kv_hit_tokens", "Tokens a lookup found (the window-safe hit)")
LOAD_SECONDS = Histogram("gcache_kv_load_seconds", "Time to load one sequence's hit, all layers",
                         buckets=LOAD_BUCKETS_S)

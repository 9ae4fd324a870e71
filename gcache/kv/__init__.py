"""``gcache.kv``: engine-agnostic KV-cache logic over the SDK (ARCHITECTURE §2, §3).

Model layouts read from ``config.json``, chained page keys, the window-safe rule, SWA store
policies, ``KVStore`` (save, match, layer-by-layer load), ``EnginePages`` (pages under an
engine's own keys, straight from its memory) and ``LayeredPages`` (the same, one object per
layer), the weights' fingerprint that keys carry, the connectors' shared settings and the SDK's
pinned host staging for copies to and from a GPU. The connectors use only the names below.
"""

from gcache.errors import ConfigError
from gcache.kv.connect import (
    KV_ONLY,
    LOADER_ONLY,
    client_from_settings,
    count_setting,
    flag_setting,
    gcache_settings,
)
from gcache.kv.engine_announce import EngineAnnouncer, announcer_from_settings
from gcache.kv.engine_pages import EnginePages, page_regions
from gcache.kv.key_scheme import KeyScheme, SchemePublisher
from gcache.kv.layer_buffers import KVSink, KVSource, LayerArrays
from gcache.kv.layered_pages import LayeredPages, PoolPages
from gcache.kv.layout import SHIPPED_CONFIGS, LayerGeometry, ModelLayout
from gcache.kv.load import LoadHandle
from gcache.kv.load_cost import LoadCost, LoadDecision
from gcache.kv.load_phases import PHASES, LoadPhases, load_phases
from gcache.kv.page_keys import GROUP_HEAD_TOKENS, head_groups, head_pages, page_hashes
from gcache.kv.policy import DEFAULT_POLICY, StorePolicy, policy_from_name
from gcache.kv.prefetch import PrefetchResult, prefetch_prefix
from gcache.kv.store import KVStore, Probe, SavePlan, SaveResult
from gcache.kv.weights import weights_fingerprint
from gcache.kv.window import leading, restorable_prefixes, safe_boundary, tail_span
from gcache.sdk import DONE, PinnedPool, PoolExhausted

__all__ = [
    "DEFAULT_POLICY",
    "DONE",
    "GROUP_HEAD_TOKENS",
    "KV_ONLY",
    "LOADER_ONLY",
    "PHASES",
    "SHIPPED_CONFIGS",
    "ConfigError",
    "EngineAnnouncer",
    "EnginePages",
    "KVSink",
    "KVSource",
    "KVStore",
    "KeyScheme",
    "LayerArrays",
    "LayerGeometry",
    "LayeredPages",
    "LoadCost",
    "LoadDecision",
    "LoadHandle",
    "LoadPhases",
    "ModelLayout",
    "PinnedPool",
    "PoolExhausted",
    "PoolPages",
    "PrefetchResult",
    "Probe",
    "SavePlan",
    "SaveResult",
    "SchemePublisher",
    "StorePolicy",
    "announcer_from_settings",
    "client_from_settings",
    "count_setting",
    "flag_setting",
    "gcache_settings",
    "head_groups",
    "head_pages",
    "leading",
    "load_phases",
    "page_hashes",
    "page_regions",
    "policy_from_name",
    "prefetch_prefix",
    "restorable_prefixes",
    "safe_boundary",
    "tail_span",
    "weights_fingerprint",
]

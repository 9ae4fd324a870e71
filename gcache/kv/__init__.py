"""``gcache.kv``: engine-agnostic KV-cache logic over the SDK (ARCHITECTURE §2, §3).

Model layouts read from ``config.json``, chained page keys, the window-safe rule, SWA store
policies, and ``KVStore`` (save, match, layer-by-layer load). The connectors use only the names
below.
"""

from gcache.kv.layer_buffers import KVSink, KVSource, LayerArrays
from gcache.kv.layout import SHIPPED_CONFIGS, LayerGeometry, ModelLayout
from gcache.kv.load import LoadHandle
from gcache.kv.page_keys import page_hashes
from gcache.kv.policy import DEFAULT_POLICY, StorePolicy, policy_from_name
from gcache.kv.store import KVStore, Probe, SaveResult
from gcache.kv.window import safe_boundary, tail_span

__all__ = [
    "DEFAULT_POLICY", "KVSink", "KVSource", "KVStore", "LayerArrays", "LayerGeometry",
    "LoadHandle", "ModelLayout", "Probe", "SHIPPED_CONFIGS", "SaveResult", "StorePolicy",
    "page_hashes", "policy_from_name", "safe_boundary", "tail_span",
]

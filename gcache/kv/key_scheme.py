"""``KeyScheme``: what another process needs to compute an engine's page keys, published in GCache.

A page key depends on the layout fingerprint (model name with the weights' digest, layers, window,
page size, KV geometry, tensor-parallel rank), the store policy (which layers are paged) and the
placement head. A connector knows all of these from its engine's config; a process beside the
engines (``gcache-router``) knows none of them, and rebuilding them from a model folder would
have to repeat every rule the connector applies (the KV dtype, vLLM's own sliding layers, the
namespace, the weights' fingerprint) and would drift silently. So the connector's scheduler side
publishes its scheme under ``scheme_key(served_name)`` and the router matches with the
``KVStore`` that ``store()`` builds from it: the same code computes both sides' keys.

The value is a small JSON document, ``FORMAT`` naming its version. It is a cache entry like any
other and can be evicted, so a connector publishes it again from time to time
(``REPUBLISH_S``); a reader keeps the last scheme it read. Engines serving one name with
different weights overwrite each other's scheme: one name should mean one model.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import xxhash

from gcache.documents import decode_document, encode_document
from gcache.errors import InvalidRequest
from gcache.kv.layout import LayerGeometry, ModelLayout
from gcache.kv.policy import policy_from_name
from gcache.kv.store import KVStore
from gcache.sdk import Client

FORMAT = "gcache.kv.scheme/1"
REPUBLISH_S = 60.0


def scheme_key(served_name: str) -> str:
    """The object key of the scheme of the model engines serve as ``served_name`` (hashed: a
    served name may be any string, up to the length of a key or beyond)."""
    if not served_name:
        raise InvalidRequest("a served model name is empty")
    return "kvscheme/" + xxhash.xxh3_128_hexdigest(served_name.encode())


@dataclass(frozen=True, slots=True)
class KeyScheme:
    layout: ModelLayout
    policy: str
    group_head_tokens: int

    def to_bytes(self) -> bytes:
        layout = {f.name: getattr(self.layout, f.name)
                  for f in dataclasses.fields(ModelLayout) if f.init}
        layout["full"] = dataclasses.asdict(self.layout.full)
        layout["swa"] = dataclasses.asdict(self.layout.swa)
        layout["swa_layers"] = list(self.layout.swa_layers)
        return encode_document(FORMAT, {"layout": layout, "policy": self.policy,
                                        "group_head_tokens": self.group_head_tokens})

    @classmethod
    def from_bytes(cls, raw: bytes) -> KeyScheme:
        """Raises ``InvalidRequest`` naming what is wrong with a value that is not a scheme."""
        doc = decode_document(raw, FORMAT, "key scheme")
        try:
            fields: dict[str, Any] = dict(doc["layout"])
            fields["full"] = LayerGeometry(**fields["full"])
            fields["swa"] = LayerGeometry(**fields["swa"])
            fields["swa_layers"] = tuple(fields["swa_layers"])
            scheme = cls(ModelLayout(**fields), str(doc["policy"]), int(doc["group_head_tokens"]))
            policy_from_name(scheme.policy)
        except InvalidRequest:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRequest(f"not a key scheme: {type(exc).__name__}: {exc}") from exc
        return scheme

    def store(self, client: Client) -> KVStore:
        """A ``KVStore`` whose ``match`` finds exactly what the publishing engine stored."""
        return KVStore(client, self.layout, policy=self.policy,
                       group_head_tokens=self.group_head_tokens, load_threads=1)


def publish(client: Client, served_name: str, scheme: KeyScheme) -> bool:
    return client.put(scheme_key(served_name), scheme.to_bytes())


def read(client: Client, served_name: str) -> KeyScheme | None:
    """The scheme published for ``served_name``; None when none is stored (or no server
    answered). A stored value that is not a scheme raises ``InvalidRequest``."""
    raw = client.get(scheme_key(served_name))
    return None if raw is None else KeyScheme.from_bytes(raw)


class SchemePublisher:
    """Publishes one scheme now and again every ``REPUBLISH_S`` (``tick`` is called from an
    engine's scheduler loop: it never blocks there, the put is asynchronous)."""

    def __init__(self, client: Client, served_name: str, scheme: KeyScheme, *,
                 every_s: float = REPUBLISH_S) -> None:
        self.client, self.key, self.value = client, scheme_key(served_name), scheme.to_bytes()
        self.every_s = every_s
        self._next = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.every_s
            self.client.put_async(self.key, self.value)

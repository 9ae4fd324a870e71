"""GCache's window-safe hit for a prompt, with the keys its engines store.

The engines' connectors publish their key scheme (``gcache.kv.key_scheme``); the router reads
it per served model and asks the ``KVStore`` built from it, so the router's lookup and the
connector's are one function over one layout. Until a scheme is read (no engine has started yet,
or it was evicted before the router first read it) GCache's hit counts as 0: the router then
routes on its views and load alone, which is never wrong, only less informed. A missing scheme
is read again at most every ``RETRY_S``; one that was read is kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from gcache.errors import GCacheError
from gcache.kv import KVStore
from gcache.kv.key_scheme import read
from gcache.sdk import Client

log = logging.getLogger(__name__)

RETRY_S = 5.0


class GCacheHits:
    def __init__(self, client: Client | None) -> None:
        self.client = client
        self._stores: dict[str, KVStore] = {}
        self._tried: dict[str, float] = {}
        self._lock = threading.Lock()

    def hit_tokens(self, model: str, token_ids: Sequence[int]) -> int:
        """Tokens of ``token_ids`` GCache can restore for ``model`` (0 when unknown)."""
        store = self._store(model)
        return 0 if store is None else store.match(token_ids)

    def _store(self, model: str) -> KVStore | None:
        if self.client is None:
            return None
        with self._lock:
            store = self._stores.get(model)
            if store is not None or time.monotonic() < self._tried.get(model, 0.0) + RETRY_S:
                return store
            self._tried[model] = time.monotonic()
        try:
            scheme = read(self.client, model)
        except GCacheError as exc:
            log.warning("router.gcache the key scheme of %s is unreadable: %s", model, exc)
            return None
        if scheme is None:
            return None
        with self._lock:
            store = self._stores.setdefault(model, scheme.store(self.client))
        log.info("router.gcache matching %s with the keys of %s (page %d, policy %s)", model,
                 scheme.layout.model, scheme.layout.page_size, scheme.policy)
        return store

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()
        if self.client is not None:
            self.client.close()

"""GCache's window-safe hit for a prompt, with the keys its engines store.

The engines' connectors publish their key scheme (``gcache.kv.key_scheme``); the router reads
it per served model and asks the ``KVStore`` built from it, so the router's lookup and the
connector's are one function over one layout. Until a scheme is read (no engine has started yet,
or it was evicted before the router first read it) GCache's hit counts as 0: the router then
routes on its views and load alone, which is never wrong, only less informed. A missing scheme
is read again at most every ``RETRY_S``; one that was read is kept.

``prefetch``: once a request is routed and its engine will read GCache's hit, the router asks
the servers to promote that hit's objects from their cold tier into memory (``Client.prefetch``)
while the request travels to the engine, so the engine's load does not wait on a disk.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from gcache.errors import GCacheError
from gcache.kv import KVStore, prefetch_prefix
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
        self.prefetched_objects = 0          # promoted from a cold tier by ``prefetch``

    def hit_tokens(self, model: str, token_ids: Sequence[int]) -> int:
        """Tokens of ``token_ids`` GCache can restore for ``model`` (0 when unknown)."""
        store = self._store(model)
        return 0 if store is None else store.match(token_ids)

    def prefetch(self, model: str, token_ids: Sequence[int], hit_tokens: int) -> None:
        """Promote the objects a load of GCache's hit of ``hit_tokens`` tokens reads into
        memory on their servers (``prefetch_prefix``), ahead of the engine's scheduler asking
        for them; a failure only costs the engine the promotion it would have paid anyway."""
        store = self._store(model)
        if store is None or hit_tokens <= 0:
            return
        try:
            done = prefetch_prefix(store, token_ids, hit_tokens)
        except GCacheError as exc:
            log.warning("router.gcache prefetch for %s failed: %s", model, exc)
            return
        self.prefetched_objects += done.promoted

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

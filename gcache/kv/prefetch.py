"""Prefetch of a prefix: the objects a load of a hit will read, promoted from the cold tier first.

``load`` reads, for a hit of ``b`` pages, every paged layer's pages ``0..b-1`` and every SWA
layer's window tail before ``b``. Where those sit on a server's cold tier, the engine's load pays
a disk read and a promotion per object on the request's critical path. ``prefetch_prefix`` asks
the owning servers for exactly those objects (``Client.prefetch``) as soon as the hit is known
(``gcache-router`` does so right after it routes a request, before the engine's scheduler
probes), so the load finds them in memory. Nothing is leased or returned: the objects take
memory as any promoted value does, and are evicted as any other if no load comes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gcache.errors import InvalidRequest
from gcache.kv import page_keys
from gcache.prefetched import Prefetched

if TYPE_CHECKING:
    from gcache.kv.store import KVStore


@dataclass(frozen=True, slots=True)
class PrefetchResult:
    keys: int                          # objects asked for
    states: Counter[Prefetched]        # how many ended in each state

    @property
    def in_memory(self) -> int:
        """Objects a load right after finds in memory."""
        return sum(n for state, n in self.states.items() if state.in_memory)

    @property
    def promoted(self) -> int:
        return self.states[Prefetched.PROMOTED]


def prefix_keys(store: KVStore, token_ids: Sequence[int] | np.ndarray,
                hit_tokens: int) -> list[str]:
    """The keys ``store.load(token_ids, hit_tokens, ...)`` reads, in layer order. Raises
    ``InvalidRequest`` for a length that is not a whole number of the sequence's pages."""
    hashes = store.hashes(token_ids)
    page = store.layout.page_size
    if hit_tokens % page or not 0 <= hit_tokens <= len(hashes) * page:
        raise InvalidRequest(f"hit_tokens={hit_tokens} must be a multiple of the page size "
                             f"{page} within the {len(hashes) * page} tokens of full pages")
    b = hit_tokens // page
    if b == 0:
        return []
    return ([page_keys.page_key(hashes[i], layer) for layer in store.paged_layers
             for i in range(b)]
            + [page_keys.tail_key(hashes[b - 1], layer) for layer in store.tail_layers])


def prefetch_prefix(store: KVStore, token_ids: Sequence[int] | np.ndarray,
                    hit_tokens: int) -> PrefetchResult:
    """Promote into memory what a load of the first ``hit_tokens`` tokens of ``token_ids`` will
    read (``prefix_keys``), in batches of the store's ``max_batch_keys``."""
    keys = prefix_keys(store, token_ids, hit_tokens)
    groups = store.key_groups(store.hashes(token_ids), keys)
    states: Counter[Prefetched] = Counter()
    step = store.max_batch_keys
    for i in range(0, len(keys), step):
        states.update(store.client.prefetch(keys[i:i + step], group=groups[i:i + step]))
    return PrefetchResult(len(keys), states)

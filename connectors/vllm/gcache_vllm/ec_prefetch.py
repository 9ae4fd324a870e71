"""The scheduler's account of encoder outputs read ahead into the workers' encoder caches.

With vLLM's V2 model runner a request that needs an encoder output GCache holds is held back
(``ensure_cache_available`` says no) until the workers have read it into their encoder caches
and said so; only then does the scheduler learn that the item need not be encoded
(``has_cache_item``). A read that fails (the server died, the value was evicted since the
probe) makes the item a miss and the encoder runs: the step that uses an output never finds it
missing, which vLLM would answer by failing the whole step ("Encoder cache miss").

States of an item, by its identifier: *loading* (asked of the workers, no answer yet: the
request waits, at most ``load_wait_s``, then encodes it), *ready* (in the workers' caches,
not yet allocated by the scheduler: kept ``claim_s``, then dropped from the workers' caches
so that an abandoned request leaks nothing), *refused* (a read failed: encoded for
``refuse_s`` without asking GCache again) and *resident* (allocated in the scheduler's encoder
cache: vLLM frees it). The items loading and ready together hold at most ``budget``
embeddings (vLLM sizes its encoder cache in those): past it a request waits for room rather
than fill the workers' memory with outputs of requests that are far from running, unless
nothing is in flight (an item larger than the budget is read alone). Pure bookkeeping: no
GCache and no vLLM calls here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CLAIM_S = 30.0        # a request held back for its read is scheduled within steps, not this
REFUSE_S = 10.0       # after a failed read, encode rather than probe the same item again


@dataclass(slots=True)
class _Held:
    """An item loading or ready in the workers' caches."""

    embeddings: int
    until: float          # loading: give up waiting then; ready: drop it unclaimed then
    ready: bool = False


class Prefetches:
    def __init__(self, exists: Callable[[str], bool], *, load_wait_s: float, budget: int,
                 claim_s: float = CLAIM_S, refuse_s: float = REFUSE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._exists = exists
        self._load_wait_s, self._claim_s, self._refuse_s = load_wait_s, claim_s, refuse_s
        self._budget = budget
        self._clock = clock
        self._held: dict[str, _Held] = {}         # loading or ready, by identifier
        self._refused: dict[str, float] = {}      # identifier -> ask GCache again then
        self._resident: set[str] = set()
        self._to_load: list[str] = []
        self._to_drop: list[str] = []
        self.counters = {"prefetches": 0, "gave_up": 0, "failed": 0, "dropped": 0,
                         "waits_for_room": 0}

    def available(self, items: Iterable[tuple[str, int]]) -> bool:
        """Whether every item of ``items`` (identifier, embeddings: those the request still
        needs) is either in the workers' caches or to be encoded; False while any is being
        read or waits for room, starting the reads GCache can serve."""
        now, ready = self._clock(), True
        for identifier, embeddings in items:
            if identifier in self._resident:
                continue
            held = self._held.get(identifier)
            if held is not None:
                if held.ready:
                    continue
                if now < held.until:
                    ready = False
                else:                                   # the workers never answered
                    del self._held[identifier]
                    self._refused[identifier] = now + self._refuse_s
                    self.counters["gave_up"] += 1
                continue
            if self._refused.get(identifier, 0.0) > now or not self._exists(identifier):
                continue
            if self._held and \
                    sum(h.embeddings for h in self._held.values()) + embeddings > self._budget:
                self.counters["waits_for_room"] += 1
                ready = False
                continue
            self._held[identifier] = _Held(embeddings, now + self._load_wait_s)
            self._to_load.append(identifier)
            self.counters["prefetches"] += 1
            ready = False
        return ready

    def ready(self, identifier: str) -> bool:
        """In the workers' caches and not yet allocated: the scheduler may skip its encoder."""
        held = self._held.get(identifier)
        return held is not None and held.ready

    def allocated(self, identifier: str) -> None:
        """The scheduler's encoder cache holds it now (read ahead or encoded): vLLM frees it."""
        self._resident.add(identifier)
        self._held.pop(identifier, None)

    def freed(self, identifiers: Iterable[str]) -> None:
        self._resident.difference_update(identifiers)

    def reported(self, loaded: Iterable[str], failed: Iterable[str]) -> None:
        """The workers' answer: read into every worker's cache, or not into some."""
        now = self._clock()
        for identifier in failed:
            held = self._held.pop(identifier, None)
            if held is not None and not held.ready:
                self.counters["failed"] += 1
            self._refused[identifier] = now + self._refuse_s
            self._unclaimed(identifier)
        for identifier in loaded:
            held = self._held.get(identifier)
            if held is None:                            # after we gave up on it
                self._unclaimed(identifier)
            elif not held.ready:
                held.ready, held.until = True, now + self._claim_s

    def take_step(self) -> tuple[list[str], list[str]]:
        """This step's reads to start and unclaimed items to drop from the workers' caches."""
        now = self._clock()
        for identifier in [i for i, h in self._held.items() if h.ready and h.until <= now]:
            del self._held[identifier]
            self._unclaimed(identifier)
        self._refused = {i: until for i, until in self._refused.items() if until > now}
        loads = self._to_load
        drops = [i for i in dict.fromkeys(self._to_drop) if i not in self._resident]
        self._to_load, self._to_drop = [], []
        self.counters["dropped"] += len(drops)
        return loads, drops

    def _unclaimed(self, identifier: str) -> None:
        """A copy in the workers' caches that the scheduler does not account for goes, unless
        the scheduler's own cache holds the item by the time the drop is sent (then vLLM
        frees it)."""
        self._to_drop.append(identifier)

"""An in-process model of the store under a byte budget, for replaying traces fast.

It keeps what the real cluster keeps, as whole units — a page over all paged layers, a window
tail over all SWA layers — and evicts first in, first out, as the server's arena does (it
reclaims its oldest segment). It shares the page hashing, the window-safe rule and the store
policies with ``KVStore``, so a replay here and a replay on a real cluster differ only in what
the model leaves out: per-layer objects, segment granularity, per-server budgets and record
headers. ``gcache replay --cluster`` measures how far apart that puts them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gcache.kv.layout import ModelLayout
from gcache.kv.policy import PressureGauge, StorePolicy
from gcache.kv.window import leading, safe_boundary


class FifoBudget:
    """Units of known size, evicted oldest first once their total passes ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self.evicted = 0
        self._units: OrderedDict[bytes, int] = OrderedDict()

    def __contains__(self, unit: bytes) -> bool:
        return unit in self._units

    def add(self, unit: bytes, size_bytes: int) -> bool:
        """Store a unit unless present; False when it can never fit."""
        if unit in self._units:
            return True
        if size_bytes > self.budget_bytes:
            return False
        self._units[unit] = size_bytes
        self.used_bytes += size_bytes
        while self.used_bytes > self.budget_bytes:
            _, size = self._units.popitem(last=False)
            self.used_bytes -= size
            self.evicted += 1
        return True


@dataclass(slots=True)
class ModelOutcome:
    hit_pages: int
    shared_pages: int


class StoreModel:
    """What ``KVStore`` would hold and report, for one layout, policy and budget."""

    def __init__(self, layout: ModelLayout, policy: StorePolicy, budget_bytes: int) -> None:
        self.layout, self.policy = layout, policy
        self.units = FifoBudget(budget_bytes)
        self.stored_bytes = 0           # every byte ever written (the store's write volume)
        full_layer = policy.full_layer
        self._page_bytes = layout.all_layers_page_bytes() if full_layer \
            else layout.full_page_bytes()
        self._has_pages = full_layer or bool(layout.full_layers)
        self._has_tails = not full_layer and bool(layout.swa_layers)
        self._gauge = PressureGauge()

    def request(self, hashes: list[bytes]) -> ModelOutcome:
        """Look a request's full pages up, then save them as the engine would after prefill."""
        n = len(hashes)
        present = [b"p" + h in self.units for h in hashes] if self._has_pages else None
        shared = leading(present) if present is not None else 0
        tail = (lambda b: b"t" + hashes[b - 1] in self.units) if self._has_tails else None
        hit = safe_boundary(n, present, tail)
        self._gauge.observe(evicted_total=self.units.evicted, used_bytes=self.units.used_bytes,
                            capacity_bytes=self.units.budget_bytes)
        pressure = self._gauge.next_save()
        if present is not None:                  # exactly when self._has_pages
            for i, h in enumerate(hashes):
                if not present[i] and self.units.add(b"p" + h, self._page_bytes):
                    self.stored_bytes += self._page_bytes
        if self._has_tails:
            for b in self.policy.tail_boundaries(n, shared_pages=shared, hit_pages=hit,
                                                     pressure=pressure):
                unit = b"t" + hashes[b - 1]
                if unit not in self.units:
                    size = self.layout.tail_bytes(b)
                    if self.units.add(unit, size):
                        self.stored_bytes += size
        return ModelOutcome(hit, shared)

"""An in-process model of the store under a byte budget, for replaying traces fast.

It keeps what the real cluster keeps, as whole units — a page over all paged layers, a window
tail over all SWA layers — and evicts by the server's own rule, ``gcache.eviction``, each unit a
span of its own: a unit whose prefix is broken goes first (a span made of values that can no
longer hit), else the oldest; and a unit read since it was stored gets one second chance unless
its prefix is broken. A lookup's
hit reads its pages and the tail at its boundary, as the engine's load of it does. It shares
the page hashing, the window-safe rule and the store policies with ``KVStore``, so a replay here
and a replay on a real cluster differ only in what the model leaves out: per-layer objects,
segment granularity (a second chance needs room in the reopened segment), per-server budgets
and record headers. ``gcache replay --cluster`` measures how far apart that puts them.

It also measures what the eviction wastes: a page is *unreachable* while a page before it in its
prefix is gone, and so is a tail while any page of its prefix is gone; neither can hit until a
request writes the missing page again. ``Reachability`` keeps the reachable bytes as units come
and go (a walk over the pages below the one that came or went, never a scan of the store), and
``StoreModel`` sums held and unreachable bytes at every lookup.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gcache.eviction import NEVER_WRITTEN, Candidate, choose_victim, earns_second_chance
from gcache.kv.layout import ModelLayout
from gcache.kv.policy import PressureGauge, StorePolicy
from gcache.kv.window import leading, safe_boundary


class SecondChanceBudget:
    """Units of known size, evicted by ``gcache.eviction``'s rule once their total passes
    ``budget_bytes``. ``broken`` names a held unit that can no longer hit, other than the one
    being stored (the one whose prefix broke first), and ``is_broken`` tells whether a unit can
    no longer hit: such a unit goes first and never gets a second chance."""

    def __init__(self, budget_bytes: int,
                 on_change: Callable[[bytes, int], None] | None = None,
                 broken: Callable[[bytes], bytes | None] | None = None,
                 is_broken: Callable[[bytes], bool] | None = None) -> None:
        self.budget_bytes = budget_bytes
        self._broken = broken
        self._is_broken = is_broken or (lambda unit: False)
        self.used_bytes = 0
        self.evicted = 0
        self._units: OrderedDict[bytes, int] = OrderedDict()
        self._read: set[bytes] = set()
        self._on_change = on_change        # (unit, +size) when stored, (unit, -size) evicted

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
        if self._on_change:
            self._on_change(unit, size_bytes)
        while self.used_bytes > self.budget_bytes:
            old, reachable = self._victim(unit)
            if earns_second_chance(read=old in self._read, reachable=reachable):
                self._read.discard(old)
                self._units.move_to_end(old)
                continue
            self._read.discard(old)
            size = self._units.pop(old)
            self.used_bytes -= size
            self.evicted += 1
            if self._on_change:
                self._on_change(old, -size)
        return True

    def _victim(self, storing: bytes) -> tuple[bytes, bool]:
        """The unit the rule takes, and whether it can still hit. The first broken unit (other
        than ``storing``) and the oldest are the only candidates the rule could prefer, each a
        span of its own, wholly unreachable or not at all."""
        oldest = next(iter(self._units))
        size = self._units[oldest]
        oldest_broken = self._is_broken(oldest)
        candidates = [Candidate(1, 0, NEVER_WRITTEN, False, size if oldest_broken else 0, size)]
        broken = self._broken(storing) if self._broken else None
        if broken is not None:
            size = self._units[broken]
            candidates.insert(0, Candidate(0, 0, NEVER_WRITTEN, False, size, size))
        chosen = choose_victim(candidates, young_ok=True)
        assert chosen is not None                  # no candidate is young
        if chosen.start == 0:
            assert broken is not None
            return broken, False
        return oldest, not oldest_broken

    def read(self, unit: bytes) -> None:
        """A held unit was read: it earns a second chance."""
        if unit in self._units:
            self._read.add(unit)


class Reachability:
    """The bytes of held units whose prefix is whole: pages whose every earlier page is held,
    tails whose every page is held. Units are ``b"p" + hash`` and ``b"t" + hash``.

    Invariant: ``whole`` is the set of held pages with every ancestor held, and a held child of
    a whole page is whole; so a page that comes or goes walks only the held pages below it.
    """

    def __init__(self, page_bytes: int) -> None:
        self.page_bytes = page_bytes
        self.reachable_bytes = 0
        self._parent: dict[bytes, bytes | None] = {}
        # held children of a page, in the order they were stored: a dict, not a set, so the
        # order units become broken (and so which goes first) is the same in every process
        self._kids: dict[bytes, dict[bytes, None]] = {}
        self._tails: dict[bytes, int] = {}           # held tails and their bytes
        self._whole: set[bytes] = set()
        # held units whose prefix is broken, in the order they became so
        self._broken: OrderedDict[bytes, None] = OrderedDict()

    def learn(self, hashes: list[bytes]) -> None:
        """Record each page's parent (the hash before it), before any of them is stored."""
        for i, h in enumerate(hashes):
            self._parent.setdefault(h, hashes[i - 1] if i else None)

    def change(self, unit: bytes, size_bytes: int) -> None:
        """A unit was stored (``size_bytes`` > 0) or evicted (< 0)."""
        node = unit[1:]
        if unit[:1] == b"t":
            if size_bytes > 0:
                self._tails[node] = size_bytes
            else:
                del self._tails[node]
            if node in self._whole:
                self.reachable_bytes += size_bytes
            elif size_bytes > 0:
                self._broken[unit] = None
            else:
                self._broken.pop(unit, None)
            return
        parent = self._parent[node]
        if size_bytes > 0:
            if parent is not None:
                self._kids.setdefault(parent, {})[node] = None
            if parent is None or parent in self._whole:
                self._walk(node, 1)
            else:
                self._broken[unit] = None
        else:
            if parent is not None:
                self._kids[parent].pop(node, None)
            if node in self._whole:
                self._walk(node, -1)
            self._broken.pop(unit, None)          # gone: nothing left to evict first

    def is_broken(self, unit: bytes) -> bool:
        """Whether a held unit's prefix is broken (it cannot hit)."""
        return unit in self._broken

    def broken_units(self) -> list[bytes]:
        """The held units whose prefix is broken, in the order they became so."""
        return list(self._broken)

    def first_broken(self, spare: bytes) -> bytes | None:
        """The held unit whose prefix broke first, other than ``spare`` (being stored)."""
        for unit in self._broken:
            if unit != spare:
                return unit
        return None

    def _walk(self, node: bytes, sign: int) -> None:
        """Make ``node`` and the held pages below it whole (+1) or no longer whole (-1)."""
        stack = [node]
        while stack:
            page = stack.pop()
            if sign > 0:
                self._whole.add(page)
                self._broken.pop(b"p" + page, None)
                self._broken.pop(b"t" + page, None)
            else:
                self._whole.discard(page)
                self._broken[b"p" + page] = None
                if page in self._tails:
                    self._broken[b"t" + page] = None
            self.reachable_bytes += sign * (self.page_bytes + self._tails.get(page, 0))
            stack.extend(self._kids.get(page, ()))


@dataclass(slots=True)
class ModelOutcome:
    hit_pages: int
    shared_pages: int


class StoreModel:
    """What ``KVStore`` would hold and report, for one layout, policy and budget."""

    def __init__(self, layout: ModelLayout, policy: StorePolicy, budget_bytes: int) -> None:
        self.layout, self.policy = layout, policy
        self.stored_bytes = 0           # every byte ever written (the store's write volume)
        self.held_bytes_seen = 0        # Σ over lookups of the bytes held
        self.unreachable_bytes_seen = 0  # Σ over lookups of the bytes held that cannot hit
        full_layer = policy.full_layer
        self._page_bytes = layout.all_layers_page_bytes() if full_layer \
            else layout.full_page_bytes()
        self._has_pages = full_layer or bool(layout.full_layers)
        self._has_tails = not full_layer and bool(layout.swa_layers)
        # Without paged layers a tail needs no page: every held byte can hit.
        self._reach = Reachability(self._page_bytes) if self._has_pages else None
        self.units = SecondChanceBudget(budget_bytes,
                                        self._reach.change if self._reach else None,
                                        self._reach.first_broken if self._reach else None,
                                        self._reach.is_broken if self._reach else None)
        self._gauge = PressureGauge()

    @property
    def unreachable_share(self) -> float:
        """Bytes held that could not hit over bytes held, summed over every lookup so far."""
        return self.unreachable_bytes_seen / self.held_bytes_seen if self.held_bytes_seen \
            else 0.0

    def request(self, hashes: list[bytes]) -> ModelOutcome:
        """Look a request's full pages up, then save them as the engine would after prefill."""
        n = len(hashes)
        self.held_bytes_seen += self.units.used_bytes
        if self._reach is not None:
            self.unreachable_bytes_seen += self.units.used_bytes - self._reach.reachable_bytes
            self._reach.learn(hashes)
        present = [b"p" + h in self.units for h in hashes] if self._has_pages else None
        shared = leading(present) if present is not None else 0
        tail = (lambda b: b"t" + hashes[b - 1] in self.units) if self._has_tails else None
        hit = safe_boundary(n, present, tail)
        self._read_hit(hashes, hit)
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

    def _read_hit(self, hashes: list[bytes], hit: int) -> None:
        """What loading the hit reads: its pages, and the window tail at its boundary."""
        if self._has_pages:
            for h in hashes[:hit]:
                self.units.read(b"p" + h)
        if self._has_tails and hit:
            self.units.read(b"t" + hashes[hit - 1])

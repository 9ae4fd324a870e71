"""``KVStore``: a model's KV pages in GCache, SWA-masked, matched only where the window is intact.

What is stored (ARCHITECTURE §3): every *paged* layer (full attention) keeps each page as one
object per layer; every SWA layer keeps only *window tails* — the KV of the last ``W`` tokens
before a page boundary, one object per layer — at the boundaries the store policy picks. One
object per (page, layer) is what lets ``load`` hand layer 0 to the engine while later layers are
still in flight, and lets an engine that saves layer by layer put each layer as it is computed.

``probe`` asks the cluster which objects exist (one batch for the pages and one SWA layer of every
tail, one more to confirm the best tail's other layers) and applies the window-safe rule to the
answer; ``match`` is its length in tokens. Nothing else is trusted: a page missing one layer, or a
tail missing one layer, is missing, since servers evict objects independently.

Failures follow the SDK: a dead or slow server is a miss, so a probe reports a shorter hit, a save
reports what it could not store, and a load reports the layers that did not arrive intact
(``LoadHandle.failed_layers``), never raising for them.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gcache.buffer import BufferLike, as_bytes
from gcache.errors import InvalidRequest
from gcache.kv import page_keys
from gcache.kv.layer_buffers import KVSink, KVSource
from gcache.kv.layout import ModelLayout
from gcache.kv.load import Fetch, LayerPlan, LoadHandle
from gcache.kv.metrics import HIT_TOKENS, LOAD_SECONDS, LOOKUP_TOKENS
from gcache.kv.policy import DEFAULT_POLICY, Pressure, PressureGauge, StorePolicy, policy_from_name
from gcache.kv.window import leading, safe_boundary, tail_span

if TYPE_CHECKING:
    from gcache.sdk import Client

TAIL_CANDIDATES_PER_ROUND = 4
# Parent candidates a saved object names (the same page in this many paged layers): with a
# group striped over 2 servers, one of 4 is on the object's own server 15 times in 16.
PARENT_CANDIDATES = 4


@dataclass(frozen=True, slots=True)
class Probe:
    """What the cluster holds of one token sequence's prefix."""

    hashes: tuple[bytes, ...]          # chained digest of every full page
    page_size: int
    hit_pages: int                     # the window-safe boundary
    shared_pages: int                  # leading pages whose every paged layer exists
    present_keys: frozenset[str]       # keys seen to exist (pages, probed tail layers)
    safe_tails: frozenset[int]         # boundaries whose tails were confirmed complete

    @property
    def n_pages(self) -> int:
        return len(self.hashes)

    @property
    def hit_tokens(self) -> int:
        return self.hit_pages * self.page_size


@dataclass(frozen=True, slots=True)
class SavePlan:
    """What a save of one sequence writes, decided once for all its layers: an engine saves
    layer by layer, and the pressure reading may change between layers; tails chosen per layer
    would then differ between layers, and a tail some sliding layer lacks is never confirmed
    (a probe needs every sliding layer's), while it is the costliest object stored."""

    probe: Probe
    tails: tuple[int, ...]             # boundaries (in pages) whose window tails are written


@dataclass(frozen=True, slots=True)
class SaveResult:
    objects_written: int
    bytes_written: int
    objects_failed: int                # puts a server did not take (dead, full): not stored
    tail_boundaries: tuple[int, ...]   # where the policy asked for window tails


class KVStore:
    """Save, match and load one model's KV through a ``gcache.Client`` (or anything with its
    ``batch_put`` / ``batch_exists`` / ``batch_get_into`` / ``fill``)."""

    def __init__(self, client: Client, layout: ModelLayout, *,
                 policy: str | StorePolicy = DEFAULT_POLICY, pressure_poll_s: float = 1.0,
                 max_batch_keys: int = 1024, load_threads: int = 2,
                 group_head_tokens: int = page_keys.GROUP_HEAD_TOKENS) -> None:
        self.client, self.layout = client, layout
        self.policy = policy_from_name(policy)
        self.paged_layers: tuple[int, ...]
        self.tail_layers: tuple[int, ...]
        if self.policy.full_layer:
            self.paged_layers, self.tail_layers = tuple(range(layout.num_layers)), ()
        else:
            self.paged_layers, self.tail_layers = layout.full_layers, layout.swa_layers
        self.root = page_keys.namespace(layout.fingerprint())
        self.head_pages = page_keys.head_pages(layout.page_size, group_head_tokens)
        self.pressure_poll_s = pressure_poll_s
        self.max_batch_keys = max_batch_keys
        self._gauge = PressureGauge()
        self._polled_at = -float("inf")
        self._loader = ThreadPoolExecutor(load_threads, thread_name_prefix="gcache-kv-load")

    def close(self) -> None:
        self._loader.shutdown(wait=True)

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- lookup ---------------------------------------------------------------------------------

    def hashes(self, token_ids: Sequence[int] | np.ndarray) -> list[bytes]:
        return page_keys.page_hashes(token_ids, self.layout.page_size, self.root)

    def key_groups(self, hashes: Sequence[bytes], keys: Sequence[str]) -> list[str]:
        """The placement group of each of ``keys``, page and tail keys of the pages ``hashes``
        (what to pass as ``group`` when touching them directly)."""
        return page_keys.groups_of_keys(keys, hashes, self.head_pages)

    def match(self, token_ids: Sequence[int] | np.ndarray) -> int:
        """The window-safe hit length of ``token_ids`` in tokens (a multiple of the page size)."""
        return self.probe(token_ids).hit_tokens

    def probe(self, token_ids: Sequence[int] | np.ndarray) -> Probe:
        """A lookup of ``token_ids``: counted in ``gcache_kv_*_tokens_total``."""
        found = self._probe(token_ids)
        LOOKUP_TOKENS.inc(len(token_ids))
        HIT_TOKENS.inc(found.hit_tokens)
        return found

    def _probe(self, token_ids: Sequence[int] | np.ndarray) -> Probe:
        hashes = self.hashes(token_ids)
        groups = page_keys.groups_of(hashes, self.head_pages)
        n = len(hashes)
        first_tail_layer = self.tail_layers[:1]
        keys, key_groups = [], []
        for layers, key_of in ((self.paged_layers, page_keys.page_key),
                               (first_tail_layer, page_keys.tail_key)):
            for h, g in zip(hashes, groups):
                keys += [key_of(h, layer) for layer in layers]
                key_groups += [g] * len(layers)
        present = {k for k, ok in zip(keys, self._exists(keys, key_groups)) if ok}
        pages = [all(page_keys.page_key(h, layer) in present for layer in self.paged_layers)
                 for h in hashes] if self.paged_layers else None
        shared = leading(pages) if pages is not None else 0
        safe: set[int] = set()
        if self.tail_layers:
            limit = shared if pages is not None else n
            candidates = [b for b in range(limit, 0, -1)
                          if page_keys.tail_key(hashes[b - 1], self.tail_layers[0]) in present]
            safe = self._confirm_tails(hashes, candidates, groups, present)
        hit = safe_boundary(n, pages, (lambda b: b in safe) if self.tail_layers else None)
        return Probe(tuple(hashes), self.layout.page_size, hit, shared, frozenset(present),
                     frozenset(safe))

    def _confirm_tails(self, hashes: list[bytes], candidates: list[int], groups: list[str],
                       present: set[str]) -> set[int]:
        """The first candidate boundaries (best first) whose every SWA layer exists."""
        for start in range(0, len(candidates), TAIL_CANDIDATES_PER_ROUND):
            round_ = candidates[start:start + TAIL_CANDIDATES_PER_ROUND]
            keys = [page_keys.tail_key(hashes[b - 1], layer)
                    for b in round_ for layer in self.tail_layers[1:]]
            key_groups = [groups[b - 1] for b in round_ for _ in self.tail_layers[1:]]
            found = dict(zip(keys, self._exists(keys, key_groups)))
            present.update(k for k, ok in found.items() if ok)
            whole = {b for b in round_ if all(found[page_keys.tail_key(hashes[b - 1], layer)]
                                             for layer in self.tail_layers[1:])}
            if whole:
                return whole
        return set()

    def _exists(self, keys: list[str], groups: list[str]) -> list[bool]:
        out: list[bool] = []
        for i in range(0, len(keys), self.max_batch_keys):
            out += self.client.batch_exists(keys[i:i + self.max_batch_keys],
                                            group=groups[i:i + self.max_batch_keys])
        return out

    # ---- save -----------------------------------------------------------------------------------

    def plan_save(self, token_ids: Sequence[int] | np.ndarray, *,
                  probe: Probe | None = None) -> SavePlan:
        """The plan of a save of ``token_ids`` (``probe``: one of the same tokens, reused):
        the tails the policy picks under the pressure read now. Pass it to every layer's
        ``save`` of this sequence."""
        probe = probe or self._probe(token_ids)          # a save's, not a lookup: not counted
        tails = self.policy.tail_boundaries(probe.n_pages, shared_pages=probe.shared_pages,
                                            hit_pages=probe.hit_pages,
                                            pressure=self._pressure())
        return SavePlan(probe, tuple(tails))

    def save(self, token_ids: Sequence[int] | np.ndarray, source: KVSource, *,
             probe: Probe | None = None, plan: SavePlan | None = None,
             layers: Iterable[int] | None = None) -> SaveResult:
        """Store the full pages of ``token_ids`` and the window tails the policy picks, skipping
        what the cluster already holds. ``layers`` limits the save to those layers (an engine
        saving layer by layer: give every layer's call the same ``plan``, from ``plan_save``);
        ``probe`` reuses a probe of the same tokens for a save planned here."""
        if plan is not None and probe is not None and plan.probe is not probe:
            raise InvalidRequest("give a save either plan= or probe=, not both: the plan "
                                 "holds its probe")
        plan = plan or self.plan_save(token_ids, probe=probe)
        probe, tails = plan.probe, plan.tails
        if len(token_ids) // self.layout.page_size != probe.n_pages:
            raise InvalidRequest(f"the plan (or probe) is of {probe.n_pages} pages, the tokens "
                                 f"make {len(token_ids) // self.layout.page_size}: plan each "
                                 "sequence's save from its own tokens")
        wanted = self._layers(layers)
        keys: list[str] = []
        values: list[memoryview] = []
        parents: list[list[str]] = []
        groups = page_keys.groups_of(probe.hashes, self.head_pages)
        key_groups: list[str] = []
        page = self.layout.page_size
        paged = [layer for layer in self.paged_layers if layer in wanted]   # keys of these only
        for i, h in enumerate(probe.hashes):
            for layer in paged:
                key = page_keys.page_key(h, layer)
                if key not in probe.present_keys:
                    keys.append(key)
                    key_groups.append(groups[i])
                    parents.append(self._page_parents(probe.hashes, groups, i, layer))
                    values.append(self._read(source, layer, i * page, (i + 1) * page))
        sliding = [layer for layer in self.tail_layers if layer in wanted]
        for b in tails:
            if b in probe.safe_tails:
                continue
            start, stop = tail_span(b, page, self.layout.window)
            for layer in sliding:
                key = page_keys.tail_key(probe.hashes[b - 1], layer)
                if key not in probe.present_keys:
                    value = source.read(layer, start, stop)
                    if value is None:              # the engine no longer holds that window
                        continue
                    keys.append(key)
                    key_groups.append(groups[b - 1])
                    parents.append(self._tail_parents(probe.hashes[b - 1], layer))
                    values.append(self._sized(value, layer, start, stop, writable=False,
                                              what="KV"))
        ok = self._put(keys, values, key_groups, parents)
        return SaveResult(objects_written=sum(ok), objects_failed=len(ok) - sum(ok),
                          bytes_written=sum(len(v) for v, stored in zip(values, ok) if stored),
                          tail_boundaries=tuple(tails))

    def _read(self, source: KVSource, layer: int, start: int, stop: int) -> memoryview:
        return self._sized(source.read(layer, start, stop), layer, start, stop, writable=False,
                           what="KV")

    def _sized(self, buffer: BufferLike, layer: int, start: int, stop: int, *, writable: bool,
               what: str) -> memoryview:
        """``buffer`` as bytes (a memoryview, or a flat view of a CUDA tensor, which the SDK
        copies to and from the device itself), checked to hold exactly tokens
        ``[start, stop)`` of ``layer``."""
        name = f"{what} of layer {layer} tokens [{start}, {stop})"
        # a CUDA tensor's flat view stands in for a memoryview: it slices and measures like one
        view: memoryview = as_bytes(buffer, writable=writable, what=name)
        expected = (stop - start) * self.layout.layer_bytes_per_token(layer)
        if len(view) != expected:
            raise InvalidRequest(f"{name} is {len(view)} bytes; the layout needs {expected}")
        return view

    def _page_parents(self, hashes: Sequence[bytes], groups: list[str], i: int,
                      layer: int) -> list[str]:
        """Candidates for the parent of page ``i`` of ``layer`` (``Client.put``'s ``parent``):
        the previous page of the same layer, then of a few other paged layers (their pages
        come and go together; one of them is likely on this key's server). None across the
        head's edge: the page before it is in another group, on other servers."""
        if i == 0 or groups[i] != groups[i - 1]:
            return []
        return self._parent_keys(hashes[i - 1], layer)

    def _tail_parents(self, boundary_hash: bytes, layer: int) -> list[str]:
        """A window tail at a boundary is of use only with the page that ends there."""
        return self._parent_keys(boundary_hash, layer)

    def _parent_keys(self, page_hash: bytes, layer: int) -> list[str]:
        paged = self.paged_layers
        if not paged:
            return []
        at = bisect.bisect_left(paged, layer) % len(paged)
        return [page_keys.page_key(page_hash, paged[(at + k) % len(paged)])
                for k in range(min(PARENT_CANDIDATES, len(paged)))]

    def _put(self, keys: list[str], values: list[memoryview], groups: list[str],
             parents: list[list[str]]) -> list[bool]:
        ok: list[bool] = []
        step = self.max_batch_keys
        for i in range(0, len(keys), step):
            # page keys name the model and the tokens the KV was computed from
            ok += self.client.batch_put(keys[i:i + step], values[i:i + step],
                                        group=groups[i:i + step], content_addressed=True,
                                        parents=parents[i:i + step])
        return ok

    def _pressure(self) -> Pressure:
        """How full the cluster is and whether it has been evicting lately, from the servers'
        STAT (polled at most every ``pressure_poll_s``; only policies that use it ask)."""
        if not self.policy.reads_pressure:
            return Pressure.EVICTING
        now = time.monotonic()
        if now - self._polled_at >= self.pressure_poll_s:
            self._polled_at = now
            fill = self.client.fill()
            self._gauge.observe(evicted_total=fill.evicted_objects, used_bytes=fill.used_bytes,
                                capacity_bytes=fill.capacity_bytes)
        return self._gauge.next_save()

    # ---- load -----------------------------------------------------------------------------------

    def load(self, token_ids: Sequence[int] | np.ndarray, hit_tokens: int, sink: KVSink, *,
             layers: Iterable[int] | None = None, timeout_s: float | None = None) -> LoadHandle:
        """Start fetching the first ``hit_tokens`` tokens' KV into ``sink``, layer by layer in
        layer order; returns at once. Paged layers get every page, SWA layers the window tail
        before ``hit_tokens``. Raises ``InvalidRequest`` for a length that is not a whole number
        of this sequence's pages."""
        started_s = time.perf_counter()
        hashes = self.hashes(token_ids)
        page = self.layout.page_size
        if hit_tokens % page or not 0 <= hit_tokens <= len(hashes) * page:
            raise InvalidRequest(f"hit_tokens={hit_tokens} must be a multiple of the page size "
                                 f"{page} within the {len(hashes) * page} tokens of full pages")
        b = hit_tokens // page
        groups = page_keys.groups_of(hashes, self.head_pages)
        group_of_key: dict[str, str] = {}
        plan = []
        for layer in sorted(self._layers(layers)):
            if layer in self.tail_layers:
                if b == 0:
                    continue
                start, stop = self.load_span(layer, hit_tokens)
                spans = [(page_keys.tail_key(hashes[b - 1], layer), b - 1, start, stop)]
            else:
                spans = [(page_keys.page_key(hashes[i], layer), i, i * page, (i + 1) * page)
                         for i in range(b)]
            group_of_key.update((key, groups[i]) for key, i, _, _ in spans)
            outs = [self._target(sink, layer, start, stop) for _, _, start, stop in spans]
            plan.append((layer, [key for key, _, _, _ in spans], outs))
        handle = LoadHandle([layer for layer, _, _ in plan], timeout_s=timeout_s)

        def fetch(keys: list[str], outs: list[memoryview]) -> list[bool]:
            return self._get(keys, outs, [group_of_key[key] for key in keys])
        self._loader.submit(self._run_load, handle, plan, fetch, started_s if b else None)
        return handle

    @staticmethod
    def _run_load(handle: LoadHandle, plan: list[LayerPlan], fetch: Fetch,
                  started_s: float | None) -> None:
        """``handle.run`` on a loader thread, observed in ``gcache_kv_load_seconds`` once it
        ends (``started_s`` None: a load of no hit, which is not one)."""
        try:
            handle.run(plan, fetch)
        finally:
            if started_s is not None:
                handle.elapsed_s = time.perf_counter() - started_s
                LOAD_SECONDS.observe(handle.elapsed_s)

    def load_span(self, layer: int, hit_tokens: int) -> tuple[int, int]:
        """The tokens ``[start, stop)`` of ``layer`` that ``load`` fetches for a hit of
        ``hit_tokens``: all of them for a paged layer, the window tail for an SWA one (what an
        engine's staging for the load must hold)."""
        if layer in self.tail_layers:
            return tail_span(hit_tokens // self.layout.page_size, self.layout.page_size,
                             self.layout.window)
        return 0, hit_tokens

    def _target(self, sink: KVSink, layer: int, start: int, stop: int) -> memoryview:
        return self._sized(sink.write_target(layer, start, stop), layer, start, stop,
                           writable=True, what="load target")

    def _get(self, keys: list[str], outs: list[memoryview], groups: list[str]) -> list[bool]:
        filled: list[bool] = []
        step = self.max_batch_keys
        for i in range(0, len(keys), step):
            chunk = outs[i:i + step]
            got = self.client.batch_get_into(keys[i:i + step], chunk, group=groups[i:i + step])
            filled += [n == len(out) for n, out in zip(got, chunk)]
        return filled

    def _layers(self, layers: Iterable[int] | None) -> set[int]:
        if layers is None:
            return set(range(self.layout.num_layers))
        chosen = set(layers)
        bad = sorted(x for x in chosen if not 0 <= x < self.layout.num_layers)
        if bad:
            raise InvalidRequest(f"layers {bad} are outside 0..{self.layout.num_layers - 1}")
        return chosen

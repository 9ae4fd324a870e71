"""Pages named by an engine's own page keys, stored part by part straight from its memory.

Engines such as SGLang hash their pages themselves (a chained SHA-256 per page) and keep them
in a host pool they own. ``EnginePages`` stores such a page under the engine's key, without
recomputing anything: one object per (page, pool, part), where a part is one of the byte ranges
the engine hands out for the page (K and V of a page-first pool, or one per layer of a
layer-first pool). Reads land in the engine's memory and writes leave from it without a copy.

Keys are ``<namespace>.<generation>/<pool>/<page key>/<part>``. The namespace names what makes
bytes interchangeable: the model, the tensor-parallel shard, and each pool's byte format
(layout, dtype, geometry), so two engines share an object exactly when its bytes mean the same
to both. ``clear()`` cannot enumerate a distributed cache, so it moves the namespace to a new
generation, stored in GCache itself: the old objects become unreachable and age out by
eviction, and every process of the namespace picks the generation up within
``generation_refresh_s``. If the generation object is lost (its server died), readers fall back
to the root generation and may see objects from before a clear: still correct KV, since a key
is the hash of its content's whole prefix.

Placement: the caller passes each page's group (``page_keys.head_groups`` of the sequence's
chain, when it knows where the call starts; ARCHITECTURE §3), one group for all pages, or None
to spread pages key by key.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import xxhash

from gcache.buffer import as_bytes, memory_at
from gcache.errors import InvalidRequest
from gcache.kv.window import leading

if TYPE_CHECKING:
    from gcache.sdk import Client

log = logging.getLogger(__name__)

ROOT_GENERATION = "0"
PageGroups = str | None | Sequence[str | None]     # one group for all pages, or one per page


def namespace_digest(fields: Mapping[str, object]) -> str:
    """A short stable digest of ``fields`` (sorted ``name=value`` pairs)."""
    text = "|".join(f"{name}={fields[name]}" for name in sorted(fields))
    return xxhash.xxh3_64_hexdigest(text.encode())


def page_regions(pointers: Sequence[int], sizes: Sequence[int],
                 n_pages: int) -> list[list[memoryview]]:
    """Split an engine's (pointer, size) lists for ``n_pages`` pages into per-page part views."""
    if len(pointers) != len(sizes):
        raise InvalidRequest(f"{len(pointers)} pointers but {len(sizes)} sizes")
    if n_pages <= 0 or len(pointers) % n_pages:
        raise InvalidRequest(f"{len(pointers)} buffers do not split evenly over {n_pages} pages")
    per = len(pointers) // n_pages
    views = [memory_at(p, s, what=f"page buffer {i}") for i, (p, s) in
             enumerate(zip(pointers, sizes))]
    return [views[i * per:(i + 1) * per] for i in range(n_pages)]


class EnginePages:
    """Objects keyed by an engine's page keys, per pool, within one namespace. Thread-safe.

    ``client`` is a ``gcache.sdk.Client`` (or anything with its batch methods). ``label`` is a
    readable prefix for operators (e.g. ``sgl/<model>/tp0of2``); ``namespace`` holds every field
    that changes the meaning of the bytes (it is digested into the key). Pools are added with
    ``add_pool(name, **format_fields)``.
    """

    def __init__(self, client: Client, label: str, namespace: Mapping[str, object], *,
                 generation_refresh_s: float = 1.0) -> None:
        if not label or len(label) > 200:
            raise InvalidRequest(f"label must be 1..200 characters; got {label!r}")
        self.client = client
        self.prefix = f"{label}/{namespace_digest(namespace)}"
        self._pools: dict[str, str] = {}
        self._refresh_s = generation_refresh_s
        self._lock = threading.Lock()
        self._generation = ROOT_GENERATION
        self._generation_read_at = float("-inf")

    @property
    def generation_key(self) -> str:
        return f"{self.prefix}/generation"

    def add_pool(self, name: str, **format_fields: object) -> None:
        """Declare pool ``name`` with the fields that fix its bytes' meaning."""
        if not name or "/" in name:
            raise InvalidRequest(f"pool name must be non-empty and without '/'; got {name!r}")
        self._pools[name] = f"{name}-{namespace_digest(format_fields)}"

    # ---- keys -------------------------------------------------------------------------------

    def generation(self) -> str:
        """The namespace's current generation, re-read at most every ``generation_refresh_s``."""
        now = time.monotonic()
        with self._lock:
            if now - self._generation_read_at < self._refresh_s:
                return self._generation
            self._generation_read_at = now
        stored = self.client.get(self.generation_key)
        with self._lock:
            self._generation = stored.decode() if stored else ROOT_GENERATION
            return self._generation

    def object_key(self, pool: str, page_key: str, part: int, generation: str) -> str:
        if pool not in self._pools:
            raise InvalidRequest(f"unknown pool {pool!r}; declared: {sorted(self._pools)}")
        return f"{self.prefix}.{generation}/{self._pools[pool]}/{page_key}/{part}"

    def _keys(self, pool: str, page_keys: Sequence[str], n_parts: int) -> list[str]:
        gen = self.generation()
        return [self.object_key(pool, k, part, gen) for k in page_keys for part in range(n_parts)]

    @staticmethod
    def _part_groups(group: PageGroups, n_pages: int, n_parts: int) -> list[str | None]:
        """The group of each part of ``n_pages`` pages (the SDK's ``group``, one per key)."""
        if group is None or isinstance(group, str):
            return [group] * (n_pages * n_parts)
        if len(group) != n_pages:
            raise InvalidRequest(f"{len(group)} groups for {n_pages} pages")
        return [g for g in group for _ in range(n_parts)]

    # ---- IO ---------------------------------------------------------------------------------

    def present(self, pool: str, page_keys: Sequence[str], n_parts: int, *,
                group: PageGroups = None) -> list[bool]:
        """Per page: every part of it exists (one batch for all pages)."""
        if not page_keys:
            return []
        found = self.client.batch_exists(self._keys(pool, page_keys, n_parts),
                                         group=self._part_groups(group, len(page_keys), n_parts))
        return [all(found[i * n_parts:(i + 1) * n_parts]) for i in range(len(page_keys))]

    def leading_present(self, pool: str, page_keys: Sequence[str], n_parts: int, *,
                        group: PageGroups = None) -> int:
        """How many pages at the start are present."""
        return leading(self.present(pool, page_keys, n_parts, group=group))

    def write(self, pool: str, page_keys: Sequence[str], parts: Sequence[Sequence[Any]], *,
              group: PageGroups = None, skip_existing: bool = True) -> list[bool]:
        """Store each page's parts; per page, whether all of them are now stored. Pages that
        exist already are not sent again (their bytes are equal by construction of the key)."""
        n_parts = self._check(page_keys, parts)
        if not page_keys:
            return []
        keys = self._keys(pool, page_keys, n_parts)
        groups = self._part_groups(group, len(page_keys), n_parts)
        views = [view for page in parts for view in page]
        stored = [False] * len(keys)
        todo = list(range(len(keys)))
        if skip_existing:
            found = self.client.batch_exists(keys, group=groups)
            todo = [i for i in todo if not found[i]]
            stored = list(found)
        if todo:
            # a page's key is the engine's hash of its tokens: content-addressed
            done = self.client.batch_put([keys[i] for i in todo], [views[i] for i in todo],
                                         group=[groups[i] for i in todo],
                                         content_addressed=True)
            for i, ok in zip(todo, done):
                stored[i] = ok
        return [all(stored[i * n_parts:(i + 1) * n_parts]) for i in range(len(page_keys))]

    def read(self, pool: str, page_keys: Sequence[str], parts: Sequence[Sequence[Any]], *,
             group: PageGroups = None) -> list[bool]:
        """Read each page's parts into the given buffers; per page, whether every part arrived
        whole (a part of another size than its buffer is a miss: it is not this format).
        Parts that could not be read are deleted (see ``_drop``)."""
        n_parts = self._check(page_keys, parts)
        if not page_keys:
            return []
        outs = [as_bytes(view, writable=True, what="page part")
                for page in parts for view in page]
        keys = self._keys(pool, page_keys, n_parts)
        groups = self._part_groups(group, len(page_keys), n_parts)
        got = self.client.batch_get_into(keys, outs, group=groups)
        self._drop([(key, g) for key, g, n in zip(keys, groups, got) if n is None])
        whole = [n is not None and n == len(out) for n, out in zip(got, outs)]
        return [all(whole[i * n_parts:(i + 1) * n_parts]) for i in range(len(page_keys))]

    def _drop(self, parts: list[tuple[str, str | None]]) -> None:
        """Delete parts that failed to read. The engine asks for a page only after it was
        reported present, so a failed part is usually a corrupted value (its checksum did not
        match) or one on an unreachable server; left in place, a corrupted part would block
        the page forever, because writes skip what exists. Deleting it lets the engine's
        next save store the page again. Against a server that just failed the read, each
        delete is an immediate miss (the SDK holds the server suspect), not another timeout;
        ``deleted`` counts the parts actually removed."""
        deleted = sum(self.client.delete(key, group=group) for key, group in parts)
        if parts:
            log.warning("engine_pages.dropped_unreadable parts=%d deleted=%d", len(parts),
                        deleted)

    def clear(self) -> bool:
        """Move the namespace to a fresh generation (see the module docstring)."""
        fresh = os.urandom(8).hex()
        if not self.client.put(self.generation_key, fresh.encode()):
            return False
        with self._lock:
            self._generation, self._generation_read_at = fresh, time.monotonic()
        return True

    @staticmethod
    def _check(page_keys: Sequence[str], parts: Sequence[Sequence[Any]]) -> int:
        if len(page_keys) != len(parts):
            raise InvalidRequest(f"{len(page_keys)} page keys but {len(parts)} part lists")
        counts = {len(p) for p in parts}
        if len(counts) > 1 or 0 in counts:
            raise InvalidRequest(f"every page needs the same non-zero number of parts; got "
                                 f"{sorted(counts)}")
        return counts.pop() if counts else 0

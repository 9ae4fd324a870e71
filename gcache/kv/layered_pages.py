"""Pages stored layer by layer: one object per (page, layer pool, part), many pools per batch.

A store that loads KV layer by layer (SGLang's external cache linker: the forward computes
layer 0 while later layers are still arriving) needs a page's layers as separate objects, and
needs to check and write every layer of many pages at once: a lookup that asked each layer in
turn would pay one round trip per layer before a request could start. ``LayeredPages`` adds
exactly that to ``EnginePages``, whose keys, namespaces, generations and unreadable-part drops
it reuses: each layer of each pool is an ``EnginePages`` pool of its own (declared by the
caller with ``pages.add_pool``), ``present`` asks for every part of every named pool of each
page in one ``batch_exists``, ``write`` stores many pools' pages with one existence check and one
``batch_put``, and ``drop`` deletes a page that failed to load in every layer. Reading one layer
is ``EnginePages.read`` of that layer's pool.

Placement: each page's parts travel with the page's own key as their group (or the caller's
group), so the objects of one page sit on one placement group and a page is checked, written
and read where its layers are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gcache.errors import InvalidRequest
from gcache.kv.engine_pages import EnginePages


@dataclass(frozen=True, slots=True)
class PoolPages:
    """Pages of one (layer) pool to write: ``parts[i]`` are page ``page_keys[i]``'s buffers,
    in part order; ``groups[i]`` its placement group (None: the page key itself)."""

    pool: str
    page_keys: Sequence[str]
    parts: Sequence[Sequence[Any]]
    groups: Sequence[str | None] | None = None


class LayeredPages:
    """Batches over the per-layer pools of one ``EnginePages`` namespace. Thread-safe as
    ``EnginePages`` and the SDK client are."""

    def __init__(self, pages: EnginePages) -> None:
        self.pages = pages
        self.client = pages.client

    @staticmethod
    def _group(page_key: str, group: str | None) -> str:
        return page_key if group is None else group

    def present(self, pools: Sequence[tuple[str, int]], page_keys: Sequence[str], *,
                groups: Sequence[str | None] | None = None) -> dict[str, list[bool]]:
        """Per ``(pool, n_parts)`` and page: all ``n_parts`` parts of that page exist. One
        ``batch_exists`` for every pool and page; an unreachable server's parts are absent."""
        if not pools:
            raise InvalidRequest("present needs at least one (pool, n_parts)")
        if groups is not None and len(groups) != len(page_keys):
            raise InvalidRequest(f"{len(groups)} groups for {len(page_keys)} pages")
        answer = {pool: [True] * len(page_keys) for pool, _ in pools}
        if not page_keys:
            return answer
        gen = self.pages.generation()
        keys: list[str] = []
        key_groups: list[str] = []
        owner: list[tuple[str, int]] = []
        for i, page_key in enumerate(page_keys):
            group = self._group(page_key, None if groups is None else groups[i])
            for pool, n_parts in pools:
                for part in range(n_parts):
                    keys.append(self.pages.object_key(pool, page_key, part, gen))
                    key_groups.append(group)
                    owner.append((pool, i))
        for (pool, i), ok in zip(owner, self.client.batch_exists(keys, group=key_groups)):
            answer[pool][i] = answer[pool][i] and ok
        return answer

    def write(self, batches: Sequence[PoolPages], *, skip_existing: bool = True) -> list[bool]:
        """Store every batch's pages; per batch, whether all its pages are now stored. Parts
        that exist already are not sent again (a page key names its content)."""
        gen = self.pages.generation()
        keys: list[str] = []
        key_groups: list[str] = []
        views: list[Any] = []
        owner: list[int] = []
        for b, batch in enumerate(batches):
            if len(batch.parts) != len(batch.page_keys):
                raise InvalidRequest(f"pool {batch.pool}: {len(batch.page_keys)} page keys but "
                                     f"{len(batch.parts)} part lists")
            if batch.groups is not None and len(batch.groups) != len(batch.page_keys):
                raise InvalidRequest(f"pool {batch.pool}: {len(batch.groups)} groups for "
                                     f"{len(batch.page_keys)} pages")
            for i, (page_key, parts) in enumerate(zip(batch.page_keys, batch.parts)):
                group = self._group(page_key, None if batch.groups is None else batch.groups[i])
                if not parts:
                    raise InvalidRequest(f"pool {batch.pool}: page {page_key} has no parts")
                for part, view in enumerate(parts):
                    keys.append(self.pages.object_key(batch.pool, page_key, part, gen))
                    key_groups.append(group)
                    views.append(view)
                    owner.append(b)
        stored = [False] * len(keys)
        todo = list(range(len(keys)))
        if keys and skip_existing:
            stored = list(self.client.batch_exists(keys, group=key_groups))
            todo = [i for i in todo if not stored[i]]
        if todo:
            done = self.client.batch_put([keys[i] for i in todo], [views[i] for i in todo],
                                         group=[key_groups[i] for i in todo],
                                         content_addressed=True)
            for i, ok in zip(todo, done):
                stored[i] = ok
        whole = [True] * len(batches)
        for b, ok in zip(owner, stored):
            whole[b] = whole[b] and ok
        return whole

    def read(self, pool: str, page_keys: Sequence[str], parts: Sequence[Sequence[Any]], *,
             groups: Sequence[str | None] | None = None) -> list[bool]:
        """``EnginePages.read`` of one layer pool, each page placed as ``present`` and
        ``write`` place it; per page, whether every part arrived whole."""
        if groups is not None and len(groups) != len(page_keys):
            raise InvalidRequest(f"{len(groups)} groups for {len(page_keys)} pages")
        placed = [self._group(k, None if groups is None else groups[i])
                  for i, k in enumerate(page_keys)]
        return self.pages.read(pool, page_keys, parts, group=placed)

    def drop(self, pools: Sequence[tuple[str, int]], page_keys: Sequence[str], *,
             groups: Sequence[str | None] | None = None) -> int:
        """Delete every part of every ``(pool, n_parts)`` of these pages; how many deletes
        were answered. A page one of whose layers could not be read is in an unknown state in
        the others (a layer load stops at its first failed layer); left in place, its stored
        layers would make the engine's next save skip them while the page stays unreadable."""
        gen = self.pages.generation()
        dropped = 0
        for i, page_key in enumerate(page_keys):
            group = self._group(page_key, None if groups is None else groups[i])
            for pool, n_parts in pools:
                for part in range(n_parts):
                    key = self.pages.object_key(pool, page_key, part, gen)
                    dropped += bool(self.client.delete(key, group=group))
        return dropped


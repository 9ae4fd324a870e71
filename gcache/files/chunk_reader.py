"""Reading a version's chunks into the caller's memory, each checked against its digest.

A chunk is read from this host's read cache first when there is one (``FileStore(host_cache=)``),
then from each copy in turn for what is still missing; what was read from other servers is
copied into the host cache; what no copy had whole is ``MissingRanges`` (never wrong bytes).
Chunks move in batches of at most ``BATCH_BYTES``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import xxhash

from gcache.files.file_keys import chunk_key, host_key, replica_group, replica_key
from gcache.files.manifest import Manifest, MissingRanges
from gcache.sdk import Client

BATCH_BYTES = 64 << 20            # bytes one batch of chunk puts or gets moves at most


class ChunkReader:
    def __init__(self, client: Client, host_cache: Client | None) -> None:
        self.client, self.host_cache = client, host_cache
        self.host_server = host_cache.stats()["servers"][0] if host_cache is not None else None

    def read_chunks(self, manifest: Manifest, indexes: range, out: memoryview,
                     base: int) -> None:
        """Chunks ``indexes`` of ``manifest`` into ``out``, whose first byte is file offset
        ``base``; each checked against its digest. ``MissingRanges`` for those not read."""
        items = []
        for i in indexes:
            start, length = manifest.chunk_span(i)
            items.append((i, out[start - base:start - base + length]))
        cacheable: list[tuple[int, memoryview]] = []
        if self.host_cache is not None:
            cacheable = [(i, v) for i, v in items
                         if self.client.owner(chunk_key(manifest.chunks[i])) != self.host_server]
            missed = self._read_host(manifest, cacheable)
            hit = {i for i, _ in cacheable} - {i for i, _ in missed}
            items = [(i, v) for i, v in items if i not in hit]
            cacheable = missed
        for copy in range(manifest.replicas):   # each copy read only for what is still missing
            items = self._read_copy(manifest, copy, items)
            if not items:
                break
        if cacheable:
            lost = {i for i, _ in items}
            self._fill_host(manifest, [(i, v) for i, v in cacheable if i not in lost])
        if items:
            raise MissingRanges(manifest, merged([manifest.chunk_span(i) for i, _ in items]))

    def _read_host(self, manifest: Manifest,
                   items: list[tuple[int, memoryview]]) -> list[tuple[int, memoryview]]:
        """Chunks ``items`` from the host cache; those it did not have whole."""
        assert self.host_cache is not None
        missing = []
        for batch in batches(items, lambda item: len(item[1])):
            got = self.host_cache.batch_get_into([host_key(manifest.chunks[i]) for i, _ in batch],
                                                 [view for _, view in batch])
            for (i, view), n in zip(batch, got):
                if n != len(view) or xxhash.xxh3_128_hexdigest(view) != manifest.chunks[i]:
                    missing.append((i, view))
        return missing

    def _fill_host(self, manifest: Manifest, items: list[tuple[int, memoryview]]) -> None:
        """Copy chunks just read (and checked) into the host cache; best effort: a full or
        absent host server only costs the next read the network."""
        assert self.host_cache is not None
        for batch in batches(items, lambda item: len(item[1])):
            self.host_cache.batch_put([host_key(manifest.chunks[i]) for i, _ in batch],
                                      [view for _, view in batch], content_addressed=True)

    def _read_copy(self, manifest: Manifest, copy: int,
                   items: list[tuple[int, memoryview]]) -> list[tuple[int, memoryview]]:
        """Read copy ``copy`` of the chunks ``items`` (index, destination); those not read."""
        missing = []
        for batch in batches(items, lambda item: len(item[1])):
            if copy == 0:
                keys, groups = [chunk_key(manifest.chunks[i]) for i, _ in batch], None
            else:
                keys = [replica_key(manifest.chunks[i], copy) for i, _ in batch]
                groups = [replica_group(manifest.chunks[i], copy, manifest.placements[i][copy - 1])
                          for i, _ in batch]
            got = self.client.batch_get_into(keys, [view for _, view in batch], group=groups)
            for (i, view), n in zip(batch, got):
                if n != len(view) or xxhash.xxh3_128_hexdigest(view) != manifest.chunks[i]:
                    missing.append((i, view))
        return missing


def batches(items: Sequence[Any], size: Any) -> list[list[Any]]:
    out: list[list[Any]] = [[]]
    held = 0
    for item in items:
        if out[-1] and held + size(item) > BATCH_BYTES:
            out.append([])
            held = 0
        out[-1].append(item)
        held += size(item)
    return [batch for batch in out if batch]


def merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, length in sorted(spans):
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((start, length))
    return out

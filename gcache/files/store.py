"""``FileStore``: files in GCache as content-addressed chunks behind a manifest.

A file is chunks and a manifest, both content addressed, and a name pointing at the manifest
(``file_keys``). Each chunk is placed by its own key, so a file's chunks spread over the
cluster's servers and a read draws on all of them.

A put writes the chunks the cluster does not hold yet, then the manifest, then the name: a
reader who resolves the name sees a version whose every chunk was stored. A reader resolves the
name once and reads that version's chunks by digest, checking each against the manifest: it
gets one version's bytes or ``MissingRanges`` naming the byte ranges whose chunks are gone,
never a mix of two versions.

Every part of a file (chunk, manifest, name) is put pinned (``Client.put(pinned=True)``): its
server keeps it in memory, never evicted by KV traffic, within the server's pin budget
(``gcache-server --pin-share``, half the hot tier by default; past it a put is refused and
``put_file`` raises ``FileNotStored``). So a file's memory comes back only by ``delete``, which
removes the name, every version of it, and the chunks no other file's manifest names, or by
``prune``, which drops the earlier versions only: a push of a new version leaves the old one
readable by readers who resolved it, until a prune. Servers list their pinned keys
(``Client.list_pinned``): that is how ``list`` finds names and ``delete`` other manifests. A
delete racing a push of other files sharing chunks with it may take a chunk the push found
present and did not store again: that file's reads then raise ``MissingRanges`` for it (never
wrong bytes) until it is pushed again.

The default chunk, 16 MiB less 64 KiB, fits one 16 MiB arena segment (the server's default)
with its record header and key (a whole 16 MiB takes two segments, half empty).

``replicas=N`` puts N copies of each chunk on N distinct servers (the manifest records where)
and a read takes the first whole copy: a file survives the loss of N-1 of its servers.

A host cache (``FileStore(host_cache=host_cache_client(client))``) keeps the chunks this host
read from other servers in its own server's shared memory.

Directories (a name per file plus an index) are ``gcache.files.directory``; the keys of a
file's parts are ``file_keys``, the read of a version's chunks ``chunk_reader``.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Sequence
from typing import Any

import xxhash

from gcache.buffer import BufferLike, as_memoryview
from gcache.errors import GCacheError, InvalidRequest
from gcache.files.chunk_reader import ChunkReader, batches
from gcache.files.file_keys import (
    MANIFEST_PREFIX,
    NAME_PREFIX,
    base_of,
    chunk_copies,
    chunk_key,
    manifest_key,
    name_key,
    replica_group,
    replica_key,
)
from gcache.files.manifest import Manifest
from gcache.sdk import Client

DEFAULT_CHUNK_SIZE = (16 << 20) - (64 << 10)
PLACEMENT_ATTEMPTS = 256          # per extra copy; with n servers each try is new with p>=1/n
MAX_SMALL_COPIES = 4              # copies of a name or manifest a reader looks for at most


class FileNotStored(GCacheError):
    """A put could not store every chunk (servers full or down): the name was not changed."""


class FileStore:
    """``host_cache``: a ``Client`` of this host's own server only (``host_cache_client``):
    chunks are read there first, and chunks read from other servers are copied there, so a
    file read twice on one host crosses the network once. Chunks that server owns anyway are
    not copied."""

    def __init__(self, client: Client, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 replicas: int = 1, host_cache: Client | None = None) -> None:
        if chunk_size < 1:
            raise InvalidRequest(f"chunk_size {chunk_size} must be at least 1 byte")
        if replicas < 1:
            raise InvalidRequest(f"replicas {replicas} must be at least 1")
        self.client, self.chunk_size, self.replicas = client, chunk_size, replicas
        self.host_cache = host_cache
        self.reader = ChunkReader(client, host_cache)

    # ---- write ----------------------------------------------------------------------------------

    def put_file(self, name: str, source: str | os.PathLike[str] | Any, *,
                 metadata: dict[str, Any] | None = None, replicas: int | None = None) -> Manifest:
        """Store ``source`` (a file's path, or a bytes-like buffer) as ``name``'s new version,
        each chunk on ``replicas`` distinct servers (default: the store's). Raises
        ``FileNotStored`` when a chunk could not be stored."""
        key = name_key(name)
        copies = self.replicas if replicas is None else replicas
        if copies < 1:
            raise InvalidRequest(f"replicas {copies} must be at least 1")
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size == 0:
                    return self._put_view(name, key, memoryview(b""), metadata, copies)
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    view = memoryview(mapped)
                    try:
                        return self._put_view(name, key, view, metadata, copies)
                    finally:
                        view.release()
        return self._put_view(name, key, as_memoryview(source, writable=False, what="source"),
                              metadata, copies)

    def _put_view(self, name: str, key: str, data: memoryview,
                  metadata: dict[str, Any] | None, replicas: int) -> Manifest:
        data = data.cast("B")
        whole = xxhash.xxh3_128()
        spans = [(i, min(self.chunk_size, len(data) - i))
                 for i in range(0, len(data), self.chunk_size)]
        digests = []
        for start, length in spans:
            piece = data[start:start + length]
            whole.update(piece)
            digests.append(xxhash.xxh3_128_hexdigest(piece))
        if replicas > 1:
            servers = len(self.client.stats()["servers"])
            if replicas > min(servers, MAX_SMALL_COPIES):
                raise InvalidRequest(f"replicas={replicas} needs as many servers (and at most "
                                     f"{MAX_SMALL_COPIES}); the cluster has {servers}")
        placements = tuple(self._place(d, replicas) for d in digests) if replicas > 1 else ()
        copies: list[tuple[str, str | None, int]] = [(chunk_key(d), None, i)
                                                     for i, d in enumerate(digests)]
        for i, attempts in enumerate(placements):
            copies += [(replica_key(digests[i], r), replica_group(digests[i], r, a), i)
                       for r, a in enumerate(attempts, start=1)]
        held = self.client.batch_exists([k for k, _, _ in copies],
                                        group=[g for _, g, _ in copies]) if copies else []
        unique: dict[str, tuple[str | None, int]] = {}  # one put per distinct missing copy
        for (k, group, i), ok in zip(copies, held):
            if not ok:
                unique.setdefault(k, (group, i))
        failed = self._put_chunks([(k, group, data[spans[i][0]:spans[i][0] + spans[i][1]])
                                   for k, (group, i) in unique.items()])
        if failed:
            raise FileNotStored(f"{name}: {len(failed)} of {len(unique)} new chunks could not "
                                "be stored (servers down, full, or past their pin budget); "
                                "the name was not changed")
        manifest = Manifest(name, len(data), whole.hexdigest(), self.chunk_size,
                            tuple(digests), dict(metadata or {}), replicas, placements)
        raw = manifest.to_bytes()
        digest = xxhash.xxh3_128_hexdigest(raw)
        manifests = list(self._small_copies(manifest_key(digest), replicas))
        stored = all(self.client.put(k, raw, group=g, content_addressed=True, pinned=True)
                     for k, g in manifests)
        names = list(self._small_copies(key, MAX_SMALL_COPIES))
        if not stored or len(manifests) < replicas or \
                not all(self.client.put(k, digest.encode(), group=g, pinned=True)
                        for k, g in names[:replicas]):
            raise FileNotStored(f"{name}: its manifest or name could not be stored "
                                f"{replicas} times")
        for k, g in names[replicas:]:        # copies of an earlier put with more replicas
            self.client.delete(k, group=g)
        return manifest

    def _small_copies(self, key: str, copies: int) -> Iterator[tuple[str, str | None]]:
        """(key, placement group) of up to ``copies`` copies of a small value (a name, a
        manifest) on distinct servers: the key itself, then the first placement of each extra
        copy whose owner differs from the earlier copies'. Every client finds the same ones
        under the same map, so a reader needs no record of them; fewer when servers run out.
        Lazy: a reader whose first copy answers searches no placement."""
        yield key, None
        owners = {self.client.owner(key)}
        for copy in range(1, copies):
            for attempt in range(PLACEMENT_ATTEMPTS):
                extra, group = f"{key}/r{copy}", f"{key}/r{copy}/{attempt}"
                owner = self.client.owner(extra, group=group)
                if owner is not None and owner not in owners:
                    owners.add(owner)
                    yield extra, group
                    break
            else:
                return

    def _get_small(self, key: str) -> bytes | None:
        """The first copy of a small value that answers (``_small_copies``)."""
        for k, g in self._small_copies(key, MAX_SMALL_COPIES):
            value = self.client.get(k, group=g)
            if value is not None:
                return value
        return None

    def _place(self, digest: str, replicas: int) -> tuple[int, ...]:
        """The placement attempt of each extra copy of chunk ``digest``: the first whose owner
        no earlier copy has."""
        owners = {self.client.owner(chunk_key(digest))}
        attempts = []
        for copy in range(1, replicas):
            for attempt in range(PLACEMENT_ATTEMPTS):
                owner = self.client.owner(replica_key(digest, copy),
                                          group=replica_group(digest, copy, attempt))
                if owner is not None and owner not in owners:
                    owners.add(owner)
                    attempts.append(attempt)
                    break
            else:
                raise FileNotStored(f"no server distinct from {sorted(map(str, owners))} found "
                                    f"for copy {copy} of chunk {digest}")
        return tuple(attempts)

    def _put_chunks(self, items: Sequence[tuple[str, str | None, memoryview]]) -> list[str]:
        failed: list[str] = []
        for batch in batches(items, lambda item: len(item[2])):
            keys = [k for k, _, _ in batch]
            done = self.client.batch_put(keys, [v for _, _, v in batch],
                                         group=[g for _, g, _ in batch], content_addressed=True,
                                         pinned=True)
            failed += [k for k, ok in zip(keys, done) if not ok]
        return failed

    def delete(self, name: str) -> bool:
        """Remove ``name``: its name, every version's manifest and the chunks no other file
        names, every copy; True when it existed."""
        return self.delete_many([name]) == 1

    def delete_many(self, names: Sequence[str]) -> int:
        """``delete`` for each of ``names`` with one look at the cluster's manifests; how
        many existed. The names go first (readers stop finding them), then the chunks, then
        the manifests: a delete cut short is finished by deleting the name again."""
        doomed = set(names)
        keys = [name_key(name) for name in doomed]
        manifests = self._all_manifests()
        found = {m.name for m in manifests.values() if m.name in doomed}
        for name, key in zip(doomed, keys, strict=True):
            if [self.client.delete(k, group=g)
                    for k, g in self._small_copies(key, MAX_SMALL_COPIES)].count(True):
                found.add(name)
        self._drop_versions({d: m for d, m in manifests.items() if m.name in doomed}, manifests)
        return len(found)

    def prune(self, prefix: str) -> int:
        """Drop the earlier versions of the file ``prefix`` and of every file under
        ``prefix/`` (of every file, for ``""``): their manifests and the chunks no version
        kept names (every copy), which a push of a new version leaves pinned. How many
        versions were dropped.

        A reader that resolved an earlier version gets ``MissingRanges`` for its dropped
        chunks from then on. Not while the same names are pushed: a version whose name was
        not yet switched to it counts as an earlier one."""
        manifests = self._all_manifests()
        under = prefix.rstrip("/") + "/"
        names = {m.name for m in manifests.values()
                 if not prefix or m.name == prefix or m.name.startswith(under)}
        pointers = self._get_smalls([name_key(name) for name in sorted(names)])
        current = {p.decode(errors="replace") for p in pointers if p is not None}
        doomed = {d: m for d, m in manifests.items() if m.name in names and d not in current}
        self._drop_versions(doomed, manifests)
        return len(doomed)

    def _drop_versions(self, doomed: dict[str, Manifest], every: dict[str, Manifest]) -> None:
        """Delete the manifests ``doomed`` (by digest) and each copy of their chunks that no
        other manifest of ``every`` names (a version with fewer replicas may share a chunk
        and not its extra copies): the chunks first, so a delete cut short leaves a manifest
        to find them by."""
        kept = {copy for d, m in every.items() if d not in doomed
                for i in range(len(m.chunks)) for copy in chunk_copies(m, i)}
        for digest, manifest in doomed.items():
            for i in range(len(manifest.chunks)):
                for k, g in chunk_copies(manifest, i):
                    if (k, g) not in kept:
                        kept.add((k, g))          # once, though several versions name it
                        self.client.delete(k, group=g)
            for k, g in self._small_copies(manifest_key(digest), MAX_SMALL_COPIES):
                self.client.delete(k, group=g)

    # ---- read -----------------------------------------------------------------------------------

    def stat(self, name: str) -> Manifest | None:
        """The manifest of ``name``'s current version; None when there is none (or it is gone)."""
        pointer = self._get_small(name_key(name))
        if pointer is None:
            return None
        raw = self._get_small(manifest_key(pointer.decode(errors="replace")))
        if raw is None:
            return None
        manifest = Manifest.from_bytes(raw)
        if manifest.name != name:
            raise InvalidRequest(f"the manifest named by {name!r} is of {manifest.name!r}")
        return manifest

    def get_file(self, file: str | Manifest, dest: str | os.PathLike[str] | Any) -> Manifest:
        """Read ``file`` (a name, or a manifest from ``stat``: that version) whole into
        ``dest``: a path (written beside it, then renamed into place, so a failed read leaves
        no partial file) or a writable buffer of at least the file's size. Raises
        ``FileNotFoundError`` for an unknown name and ``MissingRanges``."""
        manifest = file if isinstance(file, Manifest) else self._manifest(file)
        name = manifest.name
        if not isinstance(dest, (str, os.PathLike)):
            out = as_memoryview(dest, writable=True, what="dest").cast("B")
            if len(out) < manifest.size:
                raise InvalidRequest(f"dest holds {len(out)} bytes; {name} is {manifest.size}")
            self.reader.read_chunks(manifest, range(len(manifest.chunks)), out, 0)
            return manifest
        partial = f"{os.fspath(dest)}.gcache-partial"
        try:
            with open(partial, "w+b") as fh:
                fh.truncate(manifest.size)
                if manifest.size:
                    with mmap.mmap(fh.fileno(), manifest.size) as mapped:
                        view = memoryview(mapped)
                        try:
                            self.reader.read_chunks(manifest, range(len(manifest.chunks)), view, 0)
                        finally:
                            view.release()
            os.replace(partial, dest)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        return manifest

    def read_range(self, file: str | Manifest, offset: int, length: int, out: BufferLike) -> int:
        """Read ``length`` bytes of ``file`` from ``offset`` into ``out``; the bytes read (fewer
        at the end of the file). ``file`` is a name (its current version) or a manifest from
        ``stat`` (that version: a reader of many ranges passes it, so they are of one version).
        Raises ``MissingRanges`` when a chunk it needs is gone."""
        if offset < 0 or length < 0:
            raise InvalidRequest(f"offset {offset} and length {length} must be >= 0")
        manifest = file if isinstance(file, Manifest) else self._manifest(file)
        length = max(0, min(length, manifest.size - offset))
        target = as_memoryview(out, writable=True, what="out").cast("B")
        if len(target) < length:
            raise InvalidRequest(f"out holds {len(target)} bytes; {length} were asked for")
        if length == 0:
            return 0
        first, last = offset // manifest.chunk_size, (offset + length - 1) // manifest.chunk_size
        span_start = first * manifest.chunk_size
        span_end = min(manifest.size, (last + 1) * manifest.chunk_size)
        if span_start == offset and span_end == offset + length:
            self.reader.read_chunks(manifest, range(first, last + 1), target, span_start)
        else:                             # partial chunks at the ends: read whole, then copy
            scratch = bytearray(span_end - span_start)
            self.reader.read_chunks(manifest, range(first, last + 1), memoryview(scratch),
                                    span_start)
            target[:length] = scratch[offset - span_start:offset - span_start + length]
        return length

    def _manifest(self, name: str) -> Manifest:
        manifest = self.stat(name)
        if manifest is None:
            raise FileNotFoundError(f"no file {name!r} in GCache")
        return manifest

    # ---- listing --------------------------------------------------------------------------------

    def manifests(self, prefix: str = "") -> list[Manifest]:
        """The current manifest of each name under ``prefix``, sorted by name."""
        bases = sorted({base_of(key, NAME_PREFIX) for key in self._listed(NAME_PREFIX)})
        pointers = self._get_smalls([NAME_PREFIX + base for base in bases])
        digests = {p.decode(errors="replace") for p in pointers if p is not None}
        raws = self._get_smalls([manifest_key(d) for d in sorted(digests)])
        current = {}
        for raw in raws:
            if raw is not None:
                manifest = Manifest.from_bytes(raw)
                if manifest.name.startswith(prefix):
                    current[manifest.name] = manifest
        return [current[name] for name in sorted(current)]

    def _all_manifests(self) -> dict[str, Manifest]:
        """Every manifest the servers hold (current and earlier versions), by digest."""
        digests = sorted({base_of(key, MANIFEST_PREFIX) for key in self._listed(MANIFEST_PREFIX)})
        return {d: Manifest.from_bytes(raw)
                for d, raw in zip(digests, self._get_smalls([manifest_key(d) for d in digests]),
                                  strict=True) if raw is not None}

    def _listed(self, prefix: str) -> list[str]:
        return [key.decode(errors="replace") for key in self.client.list_pinned(prefix)]

    def _get_smalls(self, keys: Sequence[str]) -> list[bytes | None]:
        """``_get_small`` of each of ``keys``: the first copies in one batch, the extra copies
        only for those it missed."""
        got = self.client.batch_get(list(keys)) if keys else []
        return [value if value is not None else self._get_small(key)
                for key, value in zip(keys, got, strict=True)]

    # Last in the class: below it, ``list`` in an annotation would name this method.
    def list(self, prefix: str = "") -> list[str]:
        """The names of the files stored under ``prefix``, sorted (a directory's files and its
        index alike); names whose every copy is on servers that do not answer are missing."""
        return [m.name for m in self.manifests(prefix)]


def host_cache_client(client: Client) -> Client | None:
    """A ``Client`` of the first server ``client`` reaches over shared memory (this host's),
    with the same token and timeout, for ``FileStore(host_cache=)``; None when there is none."""
    client.server_stats()                 # a STAT each: every route is known after it
    local = client.stats()["shm_servers"]
    if not local:
        return None
    config = client.config
    return Client([local[0]], token=config.token, transport="shm", timeout_s=config.timeout_s)

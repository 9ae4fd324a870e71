"""A file as GCache stores it: its manifest, and the error that names the ranges a read lacks.

The manifest names a file's bytes exactly: its size, the xxh3-128 digest of the whole, the chunk
size, and each chunk's digest, which is also the chunk's key (content addressing: equal bytes
are one object, and a key can never hold other bytes). ``metadata`` carries what a reader may
want before the bytes (a safetensors header). The manifest is itself stored under its own
digest, and a file's name points at the manifest of its current version: a reader resolves the
name once and reads that version's chunks only, so it gets one version or an error, never a mix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gcache.documents import decode_document, encode_document
from gcache.errors import GCacheError, InvalidRequest

FORMAT = "gcache.files/1"


@dataclass(frozen=True)
class Manifest:
    name: str
    size: int
    digest: str                        # xxh3-128 hex of the whole file
    chunk_size: int
    chunks: tuple[str, ...]            # xxh3-128 hex of each chunk, in order
    metadata: dict[str, Any] = field(default_factory=dict)
    # Copies of each chunk on distinct servers (``FileStore(replicas=)``): for replicas > 1,
    # per chunk the placement attempt of each extra copy, as the put found distinct owners.
    replicas: int = 1
    placements: tuple[tuple[int, ...], ...] = ()

    def chunk_span(self, index: int) -> tuple[int, int]:
        """(offset, length) of chunk ``index`` in the file."""
        start = index * self.chunk_size
        return start, min(self.chunk_size, self.size - start)

    def to_bytes(self) -> bytes:
        return encode_document(FORMAT, {
            "name": self.name, "size": self.size, "digest": self.digest,
            "chunk_size": self.chunk_size, "chunks": list(self.chunks), "metadata": self.metadata,
            "replicas": self.replicas, "placements": [list(p) for p in self.placements]})

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        """Raises ``InvalidRequest`` naming what is wrong with a value that is not a manifest."""
        doc = decode_document(raw, FORMAT, "file manifest")
        try:
            manifest = cls(str(doc["name"]), int(doc["size"]), str(doc["digest"]),
                           int(doc["chunk_size"]), tuple(str(c) for c in doc["chunks"]),
                           dict(doc["metadata"]), int(doc.get("replicas", 1)),
                           tuple(tuple(int(a) for a in p) for p in doc.get("placements", ())))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRequest(f"not a file manifest: {type(exc).__name__}: {exc}") from exc
        expected = -(-manifest.size // manifest.chunk_size) if manifest.chunk_size > 0 else -1
        if manifest.size < 0 or len(manifest.chunks) != expected:
            raise InvalidRequest(f"manifest of {manifest.name!r}: {len(manifest.chunks)} chunks "
                                 f"for {manifest.size} bytes in chunks of {manifest.chunk_size}")
        if manifest.replicas < 1 or (manifest.replicas > 1 and (
                len(manifest.placements) != len(manifest.chunks) or
                any(len(p) != manifest.replicas - 1 for p in manifest.placements))):
            raise InvalidRequest(f"manifest of {manifest.name!r}: placements do not match "
                                 f"{manifest.replicas} replicas of {len(manifest.chunks)} chunks")
        return manifest


class MissingRanges(GCacheError):
    """A read found chunks of a file gone (a server lost, or evicted): ``ranges`` are the
    (offset, length) byte ranges of the file that cannot be read now, merged and in order."""

    def __init__(self, manifest: Manifest, ranges: list[tuple[int, int]]) -> None:
        self.manifest, self.ranges = manifest, ranges
        shown = ", ".join(f"[{o}, {o + n})" for o, n in ranges[:8])
        more = f" and {len(ranges) - 8} more" if len(ranges) > 8 else ""
        super().__init__(f"{manifest.name}: {sum(n for _, n in ranges)} of {manifest.size} "
                         f"bytes are gone: {shown}{more}")

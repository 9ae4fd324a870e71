"""The keys of a file's parts in GCache, and where each copy of a chunk is placed.

``file/c/<digest>`` a chunk (extra copies ``file/c/<digest>/r<copy>``, each placed by a group
the manifest records), ``file/m/<digest>`` a manifest, ``file/n/<hash of the name>`` the name's
current manifest, ``file/h/<digest>`` a chunk's copy in a host's read cache. Digests are of the
content, so equal bytes have one key and no put ever gives such a key other bytes.
"""

from __future__ import annotations

import xxhash

from gcache.errors import InvalidRequest
from gcache.files.manifest import Manifest

NAME_PREFIX, MANIFEST_PREFIX = "file/n/", "file/m/"


def chunk_key(digest: str) -> str:
    return f"file/c/{digest}"


def replica_key(digest: str, copy: int) -> str:
    """Extra copy ``copy`` (1, 2, ...) of a chunk."""
    return f"file/c/{digest}/r{copy}"


def replica_group(digest: str, copy: int, attempt: int) -> str:
    """The placement group of extra copy ``copy`` at placement ``attempt``: attempts go on
    until the copy's owner differs from every earlier copy's, and the manifest records it."""
    return f"file/c/{digest}/r{copy}/{attempt}"


def chunk_copies(manifest: Manifest, index: int) -> list[tuple[str, str | None]]:
    """(key, group) of each copy of ``manifest``'s chunk ``index``: the chunk, then the extra
    copies where this version placed them."""
    chunk = manifest.chunks[index]
    extra = manifest.placements[index] if manifest.placements else ()
    return [(chunk_key(chunk), None)] + [(replica_key(chunk, copy),
                                          replica_group(chunk, copy, attempt))
                                         for copy, attempt in enumerate(extra, start=1)]


def manifest_key(digest: str) -> str:
    return f"{MANIFEST_PREFIX}{digest}"


def name_key(name: str) -> str:
    if not name:
        raise InvalidRequest("a file name is empty")
    return NAME_PREFIX + xxhash.xxh3_128_hexdigest(name.encode())


def host_key(digest: str) -> str:
    """A chunk's copy in this host's read cache (``FileStore(host_cache=)``)."""
    return f"file/h/{digest}"


def base_of(key: str, prefix: str) -> str:
    """The digest in a listed key of a name or manifest, or of one of its extra copies
    (``<prefix><digest>/r<copy>``)."""
    return key[len(prefix):].split("/", 1)[0]

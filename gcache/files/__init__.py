"""``gcache.files``: files beside KV (model weights): content-addressed chunks behind a manifest.

``FileStore`` puts, reads, range-reads, stats and deletes files; ``Manifest`` is what a file is.
It sits where ``gcache.kv`` does (ARCHITECTURE §2): over the SDK and the top-level modules.
"""

from gcache.files.manifest import Manifest, MissingRanges
from gcache.files.store import DEFAULT_CHUNK_SIZE, FileStore, host_cache_client

__all__ = ["DEFAULT_CHUNK_SIZE", "FileStore", "Manifest", "MissingRanges", "host_cache_client"]

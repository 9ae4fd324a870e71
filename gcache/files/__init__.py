"""``gcache.files``: files beside KV (model weights): content-addressed chunks behind a manifest.

``FileStore`` puts, reads, range-reads, stats and deletes files; ``Manifest`` is what a file is;
directories and safetensors read plans are what the vLLM model loader (a connector) uses, so
connectors may import this package's public names as they do ``gcache.kv``'s.
It sits where ``gcache.kv`` does (ARCHITECTURE §2): over the SDK and the top-level modules.
"""

from gcache.files.directory import (
    DirectoryChanged,
    DirectoryEntry,
    content_digest,
    directory_file,
    directory_index,
    push_directory,
    remove_directory,
)
from gcache.files.manifest import Manifest, MissingRanges
from gcache.files.safetensors import TensorSpan, read_header, read_segments
from gcache.files.store import DEFAULT_CHUNK_SIZE, FileStore, host_cache_client

__all__ = ["DEFAULT_CHUNK_SIZE", "DirectoryChanged", "DirectoryEntry", "FileStore", "Manifest",
           "MissingRanges", "TensorSpan", "content_digest", "directory_file", "directory_index",
           "host_cache_client", "push_directory", "read_header", "read_segments",
           "remove_directory"]

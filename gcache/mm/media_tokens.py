"""Media-aware token ids for page keys.

A multimodal prompt carries one placeholder token id per position an image (audio clip, video
frame) fills; two prompts with the same text and different images have the same token ids, but
not the same KV. ``media_token_ids`` returns the ids with each media item's placeholder run
replaced by ids derived from the item's content hash and the position within it, so the page
keys that ``gcache.kv`` chains over them differ exactly where the media differ. SGLang's radix
tree does the same with its pad values; vLLM mixes the hashes into its block hashes instead.

The derived ids have bit 62 set and bit 63 clear: non-negative int64, above any vocabulary, so
they never equal a real token id. Every connector and the router compute keys through this one
function, so they agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import xxhash

from gcache.errors import InvalidRequest

_MEDIA_BIT = np.int64(1 << 62)
_LOW_BITS = np.int64((1 << 62) - 1)


class MediaSpan(NamedTuple):
    """A media item's placeholder run in a prompt: ``length`` token positions from
    ``offset``, filled by the item whose content hash is ``media_hash``."""

    offset: int
    length: int
    media_hash: str


def media_token_ids(token_ids: Sequence[int] | np.ndarray,
                    media: Sequence[MediaSpan]) -> np.ndarray:
    """``token_ids`` (as little-endian int64, a copy) with every media span's positions
    replaced by ids derived from its hash: position ``j`` of the item hashes as
    ``xxh3_64(media_hash) + j``. Spans past the end of ``token_ids`` are cut to it (a prompt
    being extended token by token). Raises ``InvalidRequest`` for a negative offset or
    length."""
    tokens = np.array(token_ids, dtype="<i8")
    for span in media:
        if span.offset < 0 or span.length < 0:
            raise InvalidRequest(f"media span {span} has a negative offset or length")
        stop = min(len(tokens), span.offset + span.length)
        if stop <= span.offset:
            continue
        base = np.int64(xxhash.xxh3_64_intdigest(span.media_hash.encode()) & ((1 << 62) - 1))
        positions = np.arange(stop - span.offset, dtype="<i8")
        tokens[span.offset:stop] = ((base + positions) & _LOW_BITS) | _MEDIA_BIT
    return tokens

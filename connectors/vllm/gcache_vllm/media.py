"""The token ids a request's KV is keyed by: its own, with each media item's placeholder run
replaced by ids derived from the item's hash (``gcache.mm.media_token_ids``), so that the same
text with another image never matches, and the same image in another prompt does. vLLM does the
same for its own prefix cache by mixing ``mm_features`` identifiers into its block hashes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gcache.mm import MediaSpan, media_token_ids


def key_tokens(tokens: Sequence[int], mm_features: Sequence[Any] | None) -> list[int]:
    """``tokens`` (a request's prompt, or all its tokens) as its KV keys must hash them."""
    if not mm_features:
        return list(tokens)
    spans = [MediaSpan(f.mm_position.offset, f.mm_position.length, f.identifier)
             for f in mm_features]
    return [int(t) for t in media_token_ids(tokens, spans)]

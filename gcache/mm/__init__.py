"""``gcache.mm``: multimodal sharing over the SDK (ARCHITECTURE §2, beside ``gcache.kv``).

``EncoderCache`` keeps encoder outputs (an image's or a frame's embeddings) once for the whole
cluster, keyed by the media's content hash and everything that changes the output; reads go
straight into the engine's tensor. ``media_token_ids`` makes KV page keys media-aware: the
placeholder tokens of a media item hash as that item, so equal text with another image never
shares KV, and the same image in two prompts does. The connectors use only the names below.
"""

from gcache.mm.encoder_cache import EncoderCache, EncoderOutput
from gcache.mm.media_tokens import MediaSpan, media_token_ids

__all__ = ["EncoderCache", "EncoderOutput", "MediaSpan", "media_token_ids"]

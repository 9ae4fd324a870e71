"""Page keys: chained hashes of page token ids, namespaced by model layout and rank.

``h_i = xxh3_128(h_{i-1} ‖ tokens[iP:(i+1)P])`` with ``h_{-1}`` the namespace digest (model,
layout fingerprint, tensor-parallel rank and size; ARCHITECTURE §3). ``h_i`` names the whole
prefix through page i, so equal keys mean equal KV, and two sequences share a key exactly while
their prefixes agree. Only full pages get hashes: a partial page is never stored.

Object keys are short ASCII strings: ``kv/<h_i>/f<layer>`` holds page i of a paged layer and
``kv/<h_{b-1}>/w<layer>`` the window tail of an SWA layer before boundary b (b pages). The
placement group of every key of one prefix tree is its first page's hash, so the tree stays on
one small set of servers and a shared system prompt is stored once.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xxhash

from gcache.errors import InvalidRequest

KEY_FORMAT_VERSION = b"gcache.kv/1"


def namespace(fingerprint: str) -> bytes:
    """The root digest ``h_{-1}`` for a layout fingerprint (see ``ModelLayout.fingerprint``)."""
    return xxhash.xxh3_128_digest(KEY_FORMAT_VERSION + b"|" + fingerprint.encode())


def as_token_array(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as little-endian int64, the bytes that get hashed. Raises ``InvalidRequest``
    for anything that is not a flat sequence of non-negative integers."""
    try:
        tokens = np.asarray(token_ids)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"token_ids cannot be read as integers: {exc}") from exc
    if tokens.ndim != 1:
        raise InvalidRequest(f"token_ids must be one-dimensional; got shape {tokens.shape}")
    if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
        raise InvalidRequest(f"token_ids must be integers; got dtype {tokens.dtype}")
    if tokens.size and int(tokens.min()) < 0:
        raise InvalidRequest(f"token_ids must be non-negative; found {int(tokens.min())}")
    return tokens.astype("<i8", copy=False)


def page_hashes(token_ids: Sequence[int] | np.ndarray, page_size: int, root: bytes) -> list[bytes]:
    """16-byte chained digests of every full page of ``token_ids``."""
    tokens = as_token_array(token_ids)
    data = memoryview(tokens.tobytes())
    step = page_size * 8
    out: list[bytes] = []
    prev = root
    for start in range(0, (len(tokens) // page_size) * step, step):
        prev = xxhash.xxh3_128_digest(prev + data[start:start + step])
        out.append(prev)
    return out


def page_key(page_hash: bytes, layer: int) -> str:
    """Key of one page of one paged layer."""
    return f"kv/{page_hash.hex()}/f{layer}"


def tail_key(boundary_hash: bytes, layer: int) -> str:
    """Key of one SWA layer's window tail before the boundary whose last page hash is given."""
    return f"kv/{boundary_hash.hex()}/w{layer}"


def group_of(hashes: Sequence[bytes]) -> str | None:
    """Placement group of a prefix tree: its first page's hash."""
    return hashes[0].hex() if hashes else None

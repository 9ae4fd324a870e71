"""Page keys: chained hashes of page token ids, namespaced by model layout and rank.

``h_i = xxh3_128(h_{i-1} ‖ tokens[iP:(i+1)P])`` with ``h_{-1}`` the namespace digest (model,
layout fingerprint, tensor-parallel rank and size; ARCHITECTURE §3). ``h_i`` names the whole
prefix through page i, so equal keys mean equal KV, and two sequences share a key exactly while
their prefixes agree. Only full pages get hashes: a partial page is never stored.

Object keys are short ASCII strings: ``kv/<h_i>/f<layer>`` holds page i of a paged layer and
``kv/<h_{b-1}>/w<layer>`` the window tail of an SWA layer before boundary b (b pages).

Placement groups (``groups_of``): the pages within the first ``head_tokens`` tokens (the head,
where a shared system prompt lives) take the first page's hash as their group, so the head
stays on ``group_width`` servers; every deeper page takes the hash of the first page past the
head, so each conversation's own part goes to servers of its own. Grouping a whole tree by its
first page (the rule before) put nearly the whole cache of a workload with one system prompt on
``group_width`` servers whatever the cluster size (``bench/placement.py``: 4.0× the mean on the
busiest of 8 servers in the conversation trace; 1.16× with this rule). A page's group depends on
its own prefix only, so every sequence through it agrees. A head shorter than the shared
prompt sends every sequence's deep pages to one group again: ``head_tokens`` should cover the
deployment's longest shared prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

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


GROUP_HEAD_TOKENS = 1024


def head_pages(page_size: int, head_tokens: int = GROUP_HEAD_TOKENS) -> int:
    """How many leading pages form the head (at least one)."""
    if page_size < 1 or head_tokens < 0:
        raise InvalidRequest(f"page_size must be positive and head_tokens non-negative; got "
                             f"{page_size} and {head_tokens}")
    return max(1, head_tokens // page_size)


def groups_of(hashes: Sequence[bytes], head: int) -> list[str]:
    """Placement group of each page (module docstring): the first page's hash for the ``head``
    leading pages, the hash of page ``head`` for it and every page after it."""
    return head_groups([h.hex() for h in hashes], head)


def head_groups(chain: Sequence[str], head: int) -> list[str]:
    """``groups_of`` for a chain of page names from the root (an engine's own page keys)."""
    if not chain:
        return []
    if len(chain) <= head:
        return [chain[0]] * len(chain)
    return [chain[0]] * head + [chain[head]] * (len(chain) - head)


def groups_of_keys(keys: Sequence[str], hashes: Sequence[bytes], head: int) -> list[str]:
    """The group of each object key of the pages ``hashes`` (``page_key`` / ``tail_key``
    keys: the page hash is their second field)."""
    by_hash = dict(zip((h.hex() for h in hashes), groups_of(hashes, head)))
    try:
        return [by_hash[key.split("/")[1]] for key in keys]
    except (IndexError, KeyError) as exc:
        raise InvalidRequest(f"a key is not a page or tail key of these pages: {exc}") from exc

"""Mooncake-format request traces, turned into token ids.

A trace line is a JSON object with ``input_length`` (tokens) and ``hash_ids`` (one id per block
of ``block_size`` tokens; equal ids mean an equal, reusable block). Traces carry no text, so each
block's tokens are drawn from a generator seeded by its id: equal ids give equal tokens, hence
equal page keys, and the prefix structure of the trace is reproduced exactly. The last block of a
request is cut to ``input_length``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gcache.errors import ConfigError

BLOCK_SIZE = 512          # tokens per hash id in the Mooncake FAST'25 traces
VOCAB = 151_000           # token ids are drawn from [0, VOCAB)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    index: int
    timestamp_ms: int
    input_length: int
    hash_ids: tuple[int, ...]
    output_length: int = 0       # tokens generated (the routing simulator's decode work)


def read_trace(path: str, *, limit: int | None = None,
               block_size: int = BLOCK_SIZE) -> list[TraceRequest]:
    """Requests of a Mooncake-format JSONL trace, at most ``limit``. Raises ``ConfigError``
    naming the line for a malformed request."""
    out: list[TraceRequest] = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError("trace", path, f"cannot be opened: {exc.strerror}") from exc
    with f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if line.strip():
                out.append(_parse(line, lineno, len(out), path, block_size))
    if not out:
        raise ConfigError("trace", path, "holds no requests")
    return out


def _parse(line: str, lineno: int, index: int, path: str, block_size: int) -> TraceRequest:
    try:
        obj = json.loads(line)
        length, ids = int(obj["input_length"]), tuple(int(h) for h in obj["hash_ids"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError("trace", f"{path}:{lineno}",
                          f"needs input_length and hash_ids ({exc})") from exc
    blocks = -(-length // block_size)
    if length < 1 or len(ids) < blocks:
        raise ConfigError("trace", f"{path}:{lineno}", f"input_length {length} needs {blocks} "
                          f"hash_ids of {block_size} tokens; got {len(ids)}")
    try:
        output = int(obj.get("output_length", 0))
    except (ValueError, TypeError) as exc:
        raise ConfigError("trace", f"{path}:{lineno}", f"output_length: {exc}") from exc
    return TraceRequest(index, int(obj.get("timestamp", 0)), length, ids[:blocks], output)


def block_tokens(hash_id: int, block_size: int = BLOCK_SIZE) -> np.ndarray:
    """The deterministic tokens of one trace block."""
    return np.random.default_rng(hash_id).integers(0, VOCAB, block_size, dtype=np.int64)


def request_tokens(request: TraceRequest, block_size: int = BLOCK_SIZE) -> np.ndarray:
    """All input tokens of a request: its blocks' tokens, cut to ``input_length``."""
    parts = [block_tokens(h, block_size) for h in request.hash_ids]
    return np.concatenate(parts)[:request.input_length]


def iter_tokens(requests: list[TraceRequest],
                block_size: int = BLOCK_SIZE) -> Iterator[tuple[TraceRequest, np.ndarray]]:
    for request in requests:
        yield request, request_tokens(request, block_size)


def conversations(requests: list[TraceRequest], *, min_turns: int = 3,
                  limit: int | None = None) -> list[TraceRequest]:
    """The requests of the first ``limit`` conversations with at least ``min_turns`` turns, in
    trace order. A request continues a conversation when its blocks start with all but the last
    block of an earlier request of it, at least two blocks (a turn resends the previous prompt,
    whose last block was partial and is now extended; one shared block is a system prompt, not a
    conversation). Traces interleave thousands of sessions, so a window of consecutive requests
    holds few second turns: this gathers the trace's reuse."""
    heads: dict[tuple[int, ...], int] = {}
    session_of: list[int] = []
    for request in requests:
        ids = request.hash_ids
        session = next((heads[ids[:k]] for k in range(len(ids), 1, -1) if ids[:k] in heads),
                       request.index)
        session_of.append(session)
        if len(ids) > 2:
            heads.setdefault(ids[:-1], session)
    turns = Counter(session_of)
    kept = set([s for s in dict.fromkeys(session_of) if turns[s] >= min_turns][:limit])
    return [r for r, s in zip(requests, session_of) if s in kept]

"""Rebuilding the hot tier's index from an arena left by a previous server process.

A restarted ``gcache-server`` with the same ``--shm-name`` and size finds its arena intact in
/dev/shm. This module walks it span by span (``SEGMENT`` headers) and record by record, and keeps:
- COMMITTED records whose value still hashes to its checksum (anything else is dropped and
  counted; a flipped byte costs one value, never a wrong one);
- for each key only its newest record by sequence number; a newer TOMBSTONE deletes it.
PENDING records (writes cut off by the crash) are skipped, so a write that was not committed is
never visible. A walk stops at the first record that is not valid or older than its span's claim:
beyond that lie leftovers of the span's previous use.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gcache.keys import checksum
from gcache.server.arena import (RECORD, RECORD_MAGIC, SEGMENT, SEGMENT_HEADER_BYTES,
                                 SEGMENT_MAGIC, STATE_COMMITTED, STATE_TOMBSTONE, Arena,
                                 record_size, value_offset)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Found:
    """A committed value found in the arena."""

    key: bytes
    seq: int
    record: int
    value: int
    length: int
    checksum: int
    head: int          # index of the span's first segment
    group: int = 0     # xxh3_64 of the placement group; 0 for none


@dataclass(slots=True)
class Recovered:
    values: dict[bytes, Found] = field(default_factory=dict)
    spans: list[tuple[int, int, int, int, list[bytes]]] = field(default_factory=list)
    max_seq: int = 0
    dropped_corrupt: int = 0
    dropped_pending: int = 0


def scan(arena: Arena) -> Recovered:
    """Read every span of ``arena`` and resolve each key to its newest committed value."""
    out = Recovered()
    newest: dict[bytes, tuple[int, Found | None]] = {}       # key -> (seq, value or tombstone)
    index, count, size = 0, len(arena.segments), arena.segment_size
    while index < count:
        magic, span, claim_seq, age = SEGMENT.unpack_from(arena.view, index * size)
        if magic != SEGMENT_MAGIC or not 1 <= span <= count - index:
            index += 1
            continue
        fill, keys = _walk(arena, index, span, claim_seq, newest, out)
        out.spans.append((index, span, age, fill, keys))
        index += span
    for key, (seq, found) in newest.items():
        out.max_seq = max(out.max_seq, seq)
        if found is not None:
            out.values[key] = found
    return out


def _walk(arena: Arena, head: int, span: int, claim_seq: int,
          newest: dict[bytes, tuple[int, Found | None]], out: Recovered) -> tuple[int, list[bytes]]:
    """Records of one span, newest-per-key into ``newest``; returns the span's fill and keys."""
    view, start = arena.view, head * arena.segment_size
    limit, pos, keys = start + span * arena.segment_size, start + SEGMENT_HEADER_BYTES, []
    while pos + RECORD.size <= limit:
        magic, state, _, key_len, length, stored, seq, group = RECORD.unpack_from(view, pos)
        end = pos + record_size(key_len, length)
        if magic != RECORD_MAGIC or seq <= claim_seq or key_len == 0 or end > limit:
            break
        key = bytes(view[pos + RECORD.size:pos + RECORD.size + key_len])
        keys.append(key)
        out.max_seq = max(out.max_seq, seq)
        if state == STATE_COMMITTED:
            value = value_offset(pos, key_len)
            if checksum(view[value:value + length]) == stored:
                _keep(newest, key, seq,
                      Found(key, seq, pos, value, length, stored, head, group))
            else:
                out.dropped_corrupt += 1
                log.error("recovery.checksum_mismatch bytes=%d offset=%d", length, value)
        elif state == STATE_TOMBSTONE:
            _keep(newest, key, seq, None)
        else:
            out.dropped_pending += 1
        pos = end
    return pos - start, keys


def _keep(newest: dict[bytes, tuple[int, Found | None]], key: bytes, seq: int,
          found: Found | None) -> None:
    if key not in newest or newest[key][0] < seq:
        newest[key] = (seq, found)

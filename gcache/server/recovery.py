"""Rebuilding the hot tier's index from an arena left by a previous server process.

A restarted ``gcache-server`` with the same ``--shm-name`` and size finds its arena intact in
/dev/shm. This module walks it span by span (``SEGMENT`` headers) and record by record, and
points the tier's ``RecordTable`` at what it keeps:
- COMMITTED records whose value still hashes to its checksum (anything else is dropped and
  counted; a flipped byte costs one value, never a wrong one);
- for each key only its newest record by sequence number; a newer TOMBSTONE deletes it, and a
  SUPERSEDED record (an older version, flipped when its key was written again) is never taken.
PENDING records (writes cut off by the crash) are skipped, so a write that was not committed is
never visible. A record whose header does not pass its check (a flipped byte in a key, a length,
a sequence number) is dropped and counted, and the walk resumes at the next aligned position that
holds a valid record newer than the span's claim: one bad header costs one value, not the rest of
its span. Records older than the claim are leftovers of the span's previous use and are never
taken, so the end of a span's records is simply where no newer valid record follows.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass, field

import numpy as np

from gcache.keys import checksum
from gcache.server.arena import (
    ALIGN,
    RECORD,
    RECORD_MAGIC,
    SEGMENT_HEADER_BYTES,
    STATE_COMMITTED,
    STATE_PENDING,
    STATE_SUPERSEDED,
    STATE_TOMBSTONE,
    Arena,
    header_check,
    parent_len,
    read_segment_header,
    record_size,
    value_offset,
)
from gcache.server.record_table import RecordTable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Recovered:
    spans: list[tuple[int, int, int, int, array[int]]] = field(default_factory=list)
    max_seq: int = 0
    objects: int = 0
    value_bytes: int = 0
    dropped_corrupt: int = 0
    dropped_pending: int = 0
    dropped_headers: int = 0        # records whose header failed its check
    pinned: list[int] = field(default_factory=list)   # current pinned records (``PINNED_BIT``)
    parents: bool = False           # a committed record names a parent (``FLAG_PARENT``)


def scan(arena: Arena, table: RecordTable) -> Recovered:
    """Read every span of ``arena`` and point ``table`` at each key's newest committed record.

    A tombstone takes its key's slot like a value while the walk goes on (a value found later
    in the walk but older than the delete must not win) and is taken out at the end; nothing
    but the table holds a key, so memory stays the index's own however many records there are.
    """
    out = Recovered()
    tombstones: list[int] = []
    index, count, size = 0, len(arena.segments), arena.segment_size
    while index < count:
        header = read_segment_header(arena.view, index * size, arena.secret)
        if header is None or not 1 <= header[0] <= count - index:
            index += 1
            continue
        span, claim_seq, age = header
        out.max_seq = max(out.max_seq, claim_seq)
        fill, hashes = _walk(arena, index, span, claim_seq, table, tombstones, out)
        out.spans.append((index, span, age, fill, hashes))
        index += span
    for record in tombstones:
        key = arena.read_record(record).key
        if table.get(key) == record:
            table.remove(key)
    out.pinned = [record for record in out.pinned
                  if table.get(arena.read_record(record).key) == record]
    out.objects = len(table)
    out.value_bytes = arena.sum_lengths(table.records())
    return out


def _walk(arena: Arena, head: int, span: int, claim_seq: int, table: RecordTable,
          tombstones: list[int], out: Recovered) -> tuple[int, array[int]]:
    """Records of one span, newest-per-key into ``table``; returns the span's fill and the
    hashes of the keys committed in it."""
    view, start = arena.view, head * arena.segment_size
    limit, hashes = start + span * arena.segment_size, array("Q")
    pos = fill = start + SEGMENT_HEADER_BYTES
    while pos + RECORD.size <= limit:
        record = _read_header(view, pos, limit, claim_seq, arena.secret)
        if record is None:
            found = _next_record(view, pos + ALIGN, limit, claim_seq, arena.secret)
            if found is not None or _looks_like_ours(view, pos, claim_seq):
                out.dropped_headers += 1          # not the end of the span: a damaged header
                log.error("recovery.bad_header offset=%d", pos)
            if found is None:
                break
            pos = found
            continue
        state, key, names_len, length, stored, seq, end = record
        out.max_seq = max(out.max_seq, seq)
        if state == STATE_COMMITTED:
            value = value_offset(pos, names_len)
            if checksum(view[value:value + length]) == stored:
                hash_ = table.hash(key)
                hashes.append(hash_)
                _keep(arena, table, key, hash_, pos, seq)
                out.parents = out.parents or names_len > len(key)
                if arena.is_pinned(pos):
                    out.pinned.append(pos)        # current or not: told at the end
            else:
                out.dropped_corrupt += 1
                log.error("recovery.checksum_mismatch bytes=%d offset=%d", length, value)
        elif state == STATE_TOMBSTONE:
            if _keep(arena, table, key, table.hash(key), pos, seq):
                tombstones.append(pos)
        elif state == STATE_PENDING:
            out.dropped_pending += 1
        pos = fill = end
    return fill - start, hashes


# The states a record's check may have been computed for, by the state it is in: a PENDING
# record may carry either (COMMIT writes the committed check before it flips the state), a
# SUPERSEDED one was flipped from COMMITTED.
_CHECKED_AS = {STATE_PENDING: (STATE_PENDING, STATE_COMMITTED),
               STATE_COMMITTED: (STATE_COMMITTED,), STATE_TOMBSTONE: (STATE_TOMBSTONE,),
               STATE_SUPERSEDED: (STATE_COMMITTED,)}


def _read_header(view: memoryview, pos: int, limit: int, claim_seq: int,
                 secret: bytes) -> tuple[int, bytes, int, int, int, int, int] | None:
    """(state, key, key and parent bytes, length, checksum, seq, end) of a valid record at
    ``pos`` newer than the span's claim, or None. A PENDING record may carry the check of
    either state: COMMIT writes the committed check before it flips the state."""
    magic, state, read, key_len, length, stored, seq, group, check = RECORD.unpack_from(view,
                                                                                       pos)
    names_len = key_len + parent_len(read)
    end = pos + record_size(names_len, length)
    if magic != RECORD_MAGIC or seq <= claim_seq or key_len == 0 or end > limit:
        return None
    states = _CHECKED_AS.get(state)
    if states is None:
        return None
    start = pos + RECORD.size
    key, parent = bytes(view[start:start + key_len]), view[start + key_len:start + names_len]
    for checked_as in states:
        if header_check(secret, checked_as, key, length, stored, seq, group, parent) == check:
            return state, key, names_len, length, stored, seq, end
    return None


def _looks_like_ours(view: memoryview, pos: int, claim_seq: int) -> bool:
    """A header that was written in this span's life (rather than a leftover or the end)."""
    magic, *_, seq, _group, _check = RECORD.unpack_from(view, pos)
    ours: bool = magic == RECORD_MAGIC and seq > claim_seq
    return ours


def _next_record(view: memoryview, pos: int, limit: int, claim_seq: int,
                 secret: bytes) -> int | None:
    """The next aligned offset from ``pos`` holding a valid record newer than the claim."""
    if pos + RECORD.size > limit:
        return None
    words = np.frombuffer(view, dtype="<u4", count=(limit - pos) // 4, offset=pos)
    for step in np.flatnonzero(words[::ALIGN // 4] == RECORD_MAGIC):
        candidate = pos + int(step) * ALIGN
        if candidate + RECORD.size <= limit and \
                _read_header(view, candidate, limit, claim_seq, secret) is not None:
            return candidate
    return None


def _keep(arena: Arena, table: RecordTable, key: bytes, hash_: int, record: int,
          seq: int) -> bool:
    """Point ``key`` at ``record`` unless a newer record of it was found already (one probe
    when the key is new, as most are)."""
    known = table.put(key, record, hash_)
    if known >= 0 and arena.record_seq(known) >= seq:
        table.put(key, known, hash_)
        return False
    return True

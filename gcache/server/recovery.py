"""Rebuilding the hot tier's index from an arena left by a previous server process, of this
release or an earlier one.

A restarted ``gcache-server`` with the same ``--shm-name`` and size finds its arena intact. This
module walks it span by span (span headers) and record by record, and points the index at:
- COMMITTED records whose value still hashes to its checksum (anything else is dropped and
  counted; a flipped byte costs one value, never a wrong one);
- for each key only its newest record by sequence number; a newer TOMBSTONE deletes it, and a
  SUPERSEDED record is never taken. A committed record that loses to a newer one is marked
  SUPERSEDED on the way, so at most one record per key reads as current afterwards.
PENDING records (writes cut off by the crash) are skipped. A record whose header fails its check
is dropped and counted, and the walk resumes at the next aligned position holding a valid record
newer than the span's claim: one bad header costs one value, not the rest of its span. Records
older than the claim are leftovers of the span's previous use, so the end of a span's records is
where no newer valid record follows.

Upgrades keep the hot tier (``record``'s versions). Version 3 records read as they are (their
layout is today's); the SUPERSEDED ones are restamped so their state is covered by their check.
A format 2 span (``GSEG`` header, ``GOB2`` records: a shorter header, no check, no secret) is
migrated in place: its committed values, each verified against its checksum, and its tombstones
are rewritten in today's format at the start of the same span with their own sequence numbers;
a value that no longer fits (today's header is larger) is dropped and counted. Only an arena
without a key file is format 2: where one exists, a later server has used the arena, and format
2 spans left in it are stale (their values may have been replaced or deleted since).
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass, field

from gcache.keys import checksum
from gcache.record_layout import SPAN_HEADER_BYTES, record_size, value_offset
from gcache.server import record
from gcache.server.arena import Arena
from gcache.server.index import Index
from gcache.server.keep import Keep
from gcache.server.span_header import read_span_header, read_span_header_v2, write_span_header
from gcache.server.tenant_keys import owner_of

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Recovered:
    spans: list[tuple[int, int, int, int, array[int]]] = field(default_factory=list)
    max_seq: int = 0
    objects: int = 0
    dropped_corrupt: int = 0
    dropped_pending: int = 0
    dropped_headers: int = 0        # records whose header failed its check
    pinned: list[int] = field(default_factory=list)   # current kept records (``PINNED_BIT``)
    parents: bool = False           # a committed record names a parent (``FLAG_PARENT``)
    migrated: int = 0               # records of an earlier format rewritten or restamped


def scan(arena: Arena, index: Index) -> Recovered:
    """Read every span of ``arena`` and point ``index`` at each key's newest committed record.

    A tombstone takes its key's slot like a value while the walk goes on (a value found later
    in the walk but older than the delete must not win) and is taken out at the end; nothing
    but the table holds a key, so memory stays the index's own however many records there are.
    """
    out = Recovered()
    tombstones: list[int] = []
    at, count, size = 0, len(arena.segments), arena.segment_size
    while at < count:
        header = read_span_header(arena.view, at * size, arena.secret)
        if header is None and not arena.had_secret:
            legacy = read_span_header_v2(arena.view, at * size)
            if legacy is not None and 1 <= legacy[0] <= count - at:
                header = _migrate_v2(arena, at, *legacy, out)
        if header is None or not 1 <= header[0] <= count - at:
            at += 1
            continue
        span, claim_seq, age = header
        out.max_seq = max(out.max_seq, claim_seq)
        fill, hashes = _walk(arena, at, span, claim_seq, index, tombstones, out)
        out.spans.append((at, span, age, fill, hashes))
        at += span
    view = arena.view
    for offset in tombstones:
        key = record.key_of(view, offset)
        if index.get(key) == offset:
            index.table.remove(key)
    out.pinned = [o for o in out.pinned if index.get(record.key_of(view, o)) == o]
    out.objects = len(index)
    index.value_bytes = record.sum_lengths(view, index.records())
    return out


def restore(arena: Arena, index: Index, keep: Keep) -> Recovered:
    """``scan``, then the arena takes the spans found, each span its owner (from a key it
    holds: a span has one) and ``keep`` the kept values; logs what was found."""
    found = scan(arena, index)
    arena.restore(found.spans, found.max_seq)
    for start, *_ in found.spans:
        live = index.find_span(arena.segments[start])
        if live:
            arena.set_owner(arena.segments[start], owner_of(record.key_of(arena.view, live[0])))
    for offset in found.pinned:
        keep.keep(record.key_of(arena.view, offset), offset, arena.segment_of(offset))
    log.info("tier.recovered objects=%d spans=%d corrupt=%d bad_headers=%d uncommitted=%d "
             "migrated=%d", found.objects, len(found.spans), found.dropped_corrupt,
             found.dropped_headers, found.dropped_pending, found.migrated)
    return found


def _walk(arena: Arena, head: int, span: int, claim_seq: int, index: Index,
          tombstones: list[int], out: Recovered) -> tuple[int, array[int]]:
    """Records of one span, newest-per-key into ``index``; returns the span's fill and the
    hashes of the keys committed in it."""
    view, secret, start = arena.view, arena.secret, head * arena.segment_size
    limit, hashes = start + span * arena.segment_size, array("Q")
    pos = fill = start + SPAN_HEADER_BYTES
    while pos + record.RECORD.size <= limit:
        parsed = record.parse(view, pos, limit, claim_seq, secret)
        if parsed is None:
            found = record.next_valid(view, pos + 64, limit, claim_seq, secret)
            if found is not None or record.looks_like_ours(view, pos, claim_seq):
                out.dropped_headers += 1          # not the end of the span: a damaged header
                log.error("recovery.bad_header offset=%d", pos)
            if found is None:
                break
            pos = found
            continue
        out.max_seq = max(out.max_seq, parsed.seq)
        if parsed.magic != record.RECORD_MAGIC and parsed.state == record.STATE_SUPERSEDED:
            record.restamp(view, pos, secret, parsed)
            out.migrated += 1
        if parsed.state == record.STATE_COMMITTED:
            value = value_offset(pos, parsed.names_len)
            if checksum(view[value:value + parsed.length]) == parsed.checksum:
                hash_ = index.hash(parsed.key)
                hashes.append(hash_)
                _keep(arena, index, parsed.key, hash_, pos, parsed.seq)
                out.parents = out.parents or parsed.names_len > len(parsed.key)
                if record.is_pinned(view, pos):
                    out.pinned.append(pos)        # current or not: told at the end
            else:
                out.dropped_corrupt += 1
                log.error("recovery.checksum_mismatch bytes=%d offset=%d", parsed.length, value)
        elif parsed.state == record.STATE_TOMBSTONE:
            if _keep(arena, index, parsed.key, index.hash(parsed.key), pos, parsed.seq):
                tombstones.append(pos)
        elif parsed.state == record.STATE_PENDING:
            out.dropped_pending += 1
        pos = fill = parsed.end
    return fill - start, hashes


def _keep(arena: Arena, index: Index, key: bytes, hash_: int, offset: int, seq: int) -> bool:
    """Point ``key`` at ``offset`` unless a newer record of it was found already (one probe
    when the key is new, as most are); the committed record that loses is superseded."""
    view = arena.view
    known = index.table.put(key, offset, hash_)
    if known < 0:
        return True
    loser = offset if record.seq_of(view, known) >= seq else known
    if loser == offset:
        index.table.put(key, known, hash_)
    if record.read(view, loser).state == record.STATE_COMMITTED:
        record.supersede(view, loser, arena.secret)
    return loser != offset


def _migrate_v2(arena: Arena, at: int, span: int, claim_seq: int, age: int,
                out: Recovered) -> tuple[int, int, int]:
    """Rewrite a format 2 span in today's format, in place (see the module docstring); returns
    its new header (segments, claim seq, age)."""
    view, size = arena.view, arena.segment_size
    start, limit = at * size, (at + span) * size
    kept: list[tuple[record.Parsed, int, bytes]] = []
    pos = start + SPAN_HEADER_BYTES
    while pos + record.RECORD_V2.size <= limit:
        parsed = record.parse_v2(view, pos, limit, claim_seq)
        if parsed is None:
            break
        if parsed.state == record.STATE_COMMITTED:
            value = record.value_v2(pos, parsed.names_len)
            data = bytes(view[value:value + parsed.length])
            if checksum(data) == parsed.checksum:
                kept.append((parsed, record.group_v2(view, pos), data))
            else:
                out.dropped_corrupt += 1
        elif parsed.state == record.STATE_TOMBSTONE:
            kept.append((parsed, 0, b""))
        else:
            out.dropped_pending += 1
        pos = parsed.end
    # Today's records must be newer than the claim; format 2 claims shared the first record's
    # sequence number.
    claim_seq = max(0, min([p.seq for p, _, _ in kept], default=claim_seq + 1) - 1)
    write_span_header(view, start, arena.secret, span=span, claim_seq=claim_seq, age=age)
    pos = start + SPAN_HEADER_BYTES
    for parsed, group, data in kept:
        end = pos + record_size(len(parsed.key), len(data))
        if end > limit:
            out.dropped_corrupt += 1
            log.warning("recovery.migration_dropped bytes=%d: no room left in its span",
                        len(data))
            continue
        value = value_offset(pos, len(parsed.key))
        view[value:value + len(data)] = data
        record.write(view, pos, arena.secret, state=parsed.state, key=parsed.key,
                     length=len(data), checksum=parsed.checksum, seq=parsed.seq, group=group)
        out.migrated += 1
        pos = end
    if pos + record.RECORD.size <= limit:
        view[pos:pos + record.RECORD.size] = bytes(record.RECORD.size)   # the walk ends here
    return span, claim_seq, age

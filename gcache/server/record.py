"""The hot tier's record format: every record header, key and parent is encoded and decoded here.

A record is a header (``RECORD``), the key, the parent key (the object this one's use depends on,
``FLAG_PARENT``; empty for none), then, aligned, the value (sizes: ``gcache.record_layout``).
Header fields: magic (the record's format version), state, a spare byte, key length, value
length, xxh3_64 of the value, sequence number, placement-group hash (0: none), check.

Rules, and why:
- **The magic is the format version**, per record: a release reads every version it lists in
  ``READABLE`` and writes ``RECORD_MAGIC``; records of an older version stay readable beside new
  ones, so an upgrade keeps the hot tier (``recovery``).
- **The check covers every field but the spare byte, and the state too.** It is BLAKE2b keyed
  with the arena's secret (a header forged inside a stored value never passes) over the state the
  record is in or is about to reach, the other fields, the key and the parent. A flipped bit in a
  key or a length makes the record unreadable instead of another key's value, and a flipped state
  byte never turns an overwritten (SUPERSEDED) value back into a current one: moving a record to
  another state rewrites its check (version 3 records left SUPERSEDED unchecked; recovery
  restamps them).
- **The spare byte is outside the check**: ``READ_BIT`` (leased since written), ``PINNED_BIT``
  (put pinned) and, in its top six bits, the parent key's length (which the check covers through
  the parent's bytes and length). Marking a record read rewrites nothing, and a flipped bit there
  can only keep a value in memory or let it go, never change what it reads as.
- A PENDING record may carry the check of COMMITTED: COMMIT writes the final check, then flips
  the state, so a crash between the two leaves an unacknowledged but complete value.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

import numpy as np

from gcache.record_layout import ALIGN, RECORD_HEADER_BYTES, record_size, value_offset

RECORD = struct.Struct("<IBBHQQQQQ")
assert RECORD.size == RECORD_HEADER_BYTES
# Version 2 (b"GOB2"): no check and no parent, a 40-byte header; read only to migrate it.
RECORD_V2 = struct.Struct("<IBBHQQQQ")
MAGIC_V2 = 0x32424F47
MAGIC_V3 = 0x33424F47                # b"GOB3": SUPERSEDED records keep their COMMITTED check
MAGIC_V4 = 0x34424F47                # b"GOB4": every state is checked as itself
RECORD_MAGIC = MAGIC_V4
VERSIONS = {MAGIC_V3: 3, MAGIC_V4: 4}
_CHECKED = struct.Struct("<BHQQQQ")  # state, key_len, length, checksum, seq, group
_PERSON = {MAGIC_V3: b"gcache-record", MAGIC_V4: b"gcache-record-v4"}
STATE_PENDING, STATE_COMMITTED, STATE_TOMBSTONE = 1, 2, 3
# A committed record whose key was written again, moved or deleted since: its value bytes stay
# for readers holding a lease, but at most one record per key is COMMITTED, so a restart never
# takes an older version for the current one.
STATE_SUPERSEDED = 4
READ_BIT, PINNED_BIT = 0x01, 0x02
PARENT_SHIFT = 2                     # the spare byte's bits from here: the parent key's length
_WORD = struct.Struct("<Q")          # a record's length (at 8) or sequence number (at 24)
_STATE_AT, _SPARE_AT, _KEY_LEN_AT, _CHECK_AT = 4, 5, 6, 40

# The states a record's check may have been computed for, by the state it is in and its version.
_CHECKED_AS = {
    MAGIC_V4: {STATE_PENDING: (STATE_PENDING, STATE_COMMITTED),
               STATE_COMMITTED: (STATE_COMMITTED,), STATE_TOMBSTONE: (STATE_TOMBSTONE,),
               STATE_SUPERSEDED: (STATE_SUPERSEDED,)},
    MAGIC_V3: {STATE_PENDING: (STATE_PENDING, STATE_COMMITTED),
               STATE_COMMITTED: (STATE_COMMITTED,), STATE_TOMBSTONE: (STATE_TOMBSTONE,),
               STATE_SUPERSEDED: (STATE_COMMITTED,)},
}


class RecordFields(NamedTuple):     # a tuple: a frozen dataclass took 1.5 us to build
    key: bytes
    length: int
    checksum: int
    seq: int
    group: int
    state: int
    read: bool           # leased since it was written (``mark_read``)
    parent: bytes = b""  # the key this one's use depends on; b"" for none
    pinned: bool = False


class Parsed(NamedTuple):
    """A record recovery can trust: its header passed its check."""

    magic: int
    state: int
    key: bytes
    names_len: int       # key and parent bytes
    length: int
    checksum: int
    seq: int
    end: int             # offset just past the record


def header_check(secret: bytes, state: int, key: bytes | memoryview, length: int, checksum: int,
                 seq: int, group: int, parent: bytes | memoryview = b"", *,
                 magic: int = RECORD_MAGIC) -> int:
    """The keyed hash (BLAKE2b, 8 bytes) of a record's fields, key and parent, for ``state``."""
    hasher = hashlib.blake2b(_CHECKED.pack(state, len(key), length, checksum, seq, group),
                             digest_size=8, key=secret, person=_PERSON[magic])
    hasher.update(key)
    if parent:                  # its length too: the spare byte holding it is not checked else
        hasher.update(bytes((len(parent),)))
        hasher.update(parent)
    return int.from_bytes(hasher.digest(), "little")


def write(view: memoryview, offset: int, secret: bytes, *, state: int, key: bytes, length: int,
          checksum: int, seq: int, group: int = 0, final_state: int | None = None,
          pinned: bool = False, parent: bytes = b"") -> None:
    """Write a record's header, key and parent (``record_size`` of both is reserved).
    ``final_state``: the state ``set_state`` will flip it to and its check covers (default
    ``state``). ``pinned``: the value is kept in memory against eviction (``PINNED_BIT``)."""
    check = header_check(secret, state if final_state is None else final_state, key, length,
                         checksum, seq, group, parent)
    spare = (PINNED_BIT if pinned else 0) | len(parent) << PARENT_SHIFT
    RECORD.pack_into(view, offset, RECORD_MAGIC, state, spare, len(key), length, checksum, seq,
                     group, check)
    start = offset + RECORD.size
    view[start:start + len(key)] = key
    view[start + len(key):start + len(key) + len(parent)] = parent


def commit_state(view: memoryview, offset: int) -> None:
    """Flip a PENDING record written with ``final_state=STATE_COMMITTED`` to COMMITTED."""
    view[offset + _STATE_AT] = STATE_COMMITTED


def supersede(view: memoryview, offset: int, secret: bytes) -> None:
    """Mark a committed record SUPERSEDED, its check rewritten for that state first: a torn
    rewrite leaves a record that fails its check (which recovery drops, as it would drop a
    superseded one), never one that reads as COMMITTED again."""
    _, _, spare, key_len, length, checksum, seq, group, _ = RECORD.unpack_from(view, offset)
    start = offset + RECORD.size
    check = header_check(secret, STATE_SUPERSEDED, view[start:start + key_len], length,
                         checksum, seq, group,
                         view[start + key_len:start + key_len + _parent_len(spare)])
    _WORD.pack_into(view, offset + _CHECK_AT, check)
    struct.pack_into("<I", view, offset, RECORD_MAGIC)   # a version 3 record is version 4 now
    view[offset + _STATE_AT] = STATE_SUPERSEDED


def mark_read(view: memoryview, offset: int) -> None:
    """Note that the record was leased: one read since it was (re-)appended earns it a second
    chance in memory."""
    view[offset + _SPARE_AT] |= READ_BIT


def is_read(view: memoryview, offset: int) -> bool:
    return bool(view[offset + _SPARE_AT] & READ_BIT)


def is_pinned(view: memoryview, offset: int) -> bool:
    return bool(view[offset + _SPARE_AT] & PINNED_BIT)


def _parent_len(spare: int) -> int:
    return spare >> PARENT_SHIFT


def _key_len(view: memoryview, offset: int) -> int:
    return int(view[offset + _KEY_LEN_AT]) | int(view[offset + _KEY_LEN_AT + 1]) << 8


def holds_key(view: memoryview, offset: int, key: bytes) -> bool:
    """Whether the record at ``offset`` is ``key``'s."""
    key_len = _key_len(view, offset)
    return key_len == len(key) and view[offset + RECORD.size:offset + RECORD.size + key_len] == key


def key_of(view: memoryview, offset: int) -> bytes:
    start = offset + RECORD.size
    return bytes(view[start:start + _key_len(view, offset)])


def parent_of(view: memoryview, offset: int) -> bytes:
    """The parent key of the record at ``offset`` (b"" for none)."""
    n = _parent_len(view[offset + _SPARE_AT])
    if not n:
        return b""
    start = offset + RECORD.size + _key_len(view, offset)
    return bytes(view[start:start + n])


def length_of(view: memoryview, offset: int) -> int:
    length: int = _WORD.unpack_from(view, offset + 8)[0]
    return length


def seq_of(view: memoryview, offset: int) -> int:
    seq: int = _WORD.unpack_from(view, offset + 24)[0]
    return seq


def value_at(view: memoryview, offset: int) -> int:
    """Where the value of the record at ``offset`` starts."""
    return value_offset(offset, _key_len(view, offset) + _parent_len(view[offset + _SPARE_AT]))


def extent(view: memoryview, offset: int) -> tuple[int, int, int]:
    """(value offset, length, checksum) of the record at ``offset``, in one header read."""
    _, _, spare, key_len, length, checksum, *_ = RECORD.unpack_from(view, offset)
    return value_offset(offset, key_len + _parent_len(spare)), length, checksum


def read(view: memoryview, offset: int) -> RecordFields:
    _, state, spare, key_len, length, checksum, seq, group, _ = RECORD.unpack_from(view, offset)
    start = offset + RECORD.size
    names = bytes(view[start:start + key_len + _parent_len(spare)])
    return RecordFields(names[:key_len], length, checksum, seq, group, state,
                        bool(spare & READ_BIT), names[key_len:], bool(spare & PINNED_BIT))


def sum_lengths(view: memoryview, offsets: list[int]) -> int:
    """The sum of these records' lengths, in one gather (records are ``ALIGN``-aligned, so each
    length is one aligned 8-byte word)."""
    if not offsets:
        return 0
    words = np.frombuffer(view, dtype="<u8")
    try:
        return int(words[(np.asarray(offsets, dtype=np.int64) + 8) // 8].sum())
    finally:
        del words                 # no export of the mapping left behind: close() unmaps


# ---- recovery ------------------------------------------------------------------------------


def parse(view: memoryview, pos: int, limit: int, claim_seq: int,
          secret: bytes) -> Parsed | None:
    """The record at ``pos`` when it is valid (a readable version, a check that passes for its
    state) and newer than its span's claim, or None."""
    magic, state, spare, key_len, length, stored, seq, group, check = RECORD.unpack_from(view,
                                                                                       pos)
    names_len = key_len + _parent_len(spare)
    end = pos + record_size(names_len, length)
    states = _CHECKED_AS.get(magic, {}).get(state)
    if states is None or seq <= claim_seq or key_len == 0 or end > limit:
        return None
    start = pos + RECORD.size
    key, parent = bytes(view[start:start + key_len]), view[start + key_len:start + names_len]
    for checked_as in states:
        if header_check(secret, checked_as, key, length, stored, seq, group, parent,
                        magic=magic) == check:
            return Parsed(magic, state, key, names_len, length, stored, seq, end)
    return None


def looks_like_ours(view: memoryview, pos: int, claim_seq: int) -> bool:
    """A header written in this span's life (rather than a leftover or the end), valid or not."""
    magic, *_, seq, _group, _check = RECORD.unpack_from(view, pos)
    ours: bool = magic in VERSIONS and seq > claim_seq
    return ours


def next_valid(view: memoryview, pos: int, limit: int, claim_seq: int,
               secret: bytes) -> int | None:
    """The next aligned offset from ``pos`` holding a valid record newer than the claim."""
    if pos + RECORD.size > limit:
        return None
    words = np.frombuffer(view, dtype="<u4", count=(limit - pos) // 4, offset=pos)
    try:
        candidates = np.flatnonzero(np.isin(words[::ALIGN // 4], list(VERSIONS)))
    finally:
        del words
    for step in candidates:
        candidate = pos + int(step) * ALIGN
        if candidate + RECORD.size <= limit and \
                parse(view, candidate, limit, claim_seq, secret) is not None:
            return candidate
    return None


def restamp(view: memoryview, offset: int, secret: bytes, parsed: Parsed) -> None:
    """Bring a valid version 3 SUPERSEDED record to version 4 (its check then covers its
    state); other version 3 records read the same in both versions and stay as they are."""
    if parsed.magic == MAGIC_V3 and parsed.state == STATE_SUPERSEDED:
        supersede(view, offset, secret)


def parse_v2(view: memoryview, pos: int, limit: int, claim_seq: int) -> Parsed | None:
    """A version 2 record at ``pos`` (no check: only its magic, its sequence number against
    the span's claim, and later its value's checksum vouch for it), or None. Version 2 claims
    did not take a sequence number of their own, so the first record may carry the claim's."""
    magic, state, _, key_len, length, stored, seq, _group = RECORD_V2.unpack_from(view, pos)
    names_len = key_len
    end = pos + record_size(names_len, length, header_bytes=RECORD_V2.size)
    if magic != MAGIC_V2 or seq < claim_seq or key_len == 0 or end > limit or \
            state not in (STATE_PENDING, STATE_COMMITTED, STATE_TOMBSTONE):
        return None
    start = pos + RECORD_V2.size
    return Parsed(magic, state, bytes(view[start:start + key_len]), names_len, length, stored,
                  seq, end)


def group_v2(view: memoryview, pos: int) -> int:
    group: int = RECORD_V2.unpack_from(view, pos)[7]
    return group


def value_v2(pos: int, names_len: int) -> int:
    """Where a version 2 record's value starts."""
    return value_offset(pos, names_len, header_bytes=RECORD_V2.size)

"""The span header: what a claimed span of the arena says about itself, so a restart finds it.

Every claimed span starts with a header (``SPAN_HEADER_BYTES``) holding two copies of: magic, the
span's length in segments, the record sequence number its claim consumed (every record written
in the span later is newer, every leftover of its previous use older), its age (claim order) and
a check, BLAKE2b keyed with the arena's secret. Two checked copies: one flipped byte cannot lose
the span. Format 2 spans (``GSEG``: one copy, no check) are read only to migrate them.
"""

from __future__ import annotations

import hashlib
import struct

SPAN = struct.Struct("<IIQQQ")       # magic, segments, claim record seq, age, check
SPAN_MAGIC = 0x32475347              # b"GSG2"
SPAN_V2 = struct.Struct("<IIQQ")     # b"GSEG" (format 2): one copy, no check
SPAN_MAGIC_V2 = 0x47455347
_SPAN_CHECKED = struct.Struct("<IQQ")


def _span_check(secret: bytes, span: int, claim_seq: int, age: int) -> int:
    digest = hashlib.blake2b(_SPAN_CHECKED.pack(span, claim_seq, age), digest_size=8,
                             key=secret, person=b"gcache-span").digest()
    return int.from_bytes(digest, "little")


def write_span_header(view: memoryview, offset: int, secret: bytes, *, span: int,
                      claim_seq: int, age: int) -> None:
    """Two checked copies of a span's header, so one flipped byte cannot lose the span."""
    check = _span_check(secret, span, claim_seq, age)
    for copy in (0, SPAN.size):
        SPAN.pack_into(view, offset + copy, SPAN_MAGIC, span, claim_seq, age, check)


def read_span_header(view: memoryview, offset: int, secret: bytes) -> tuple[int, int, int] | None:
    """(segments, claim seq, age) from the first copy that passes its check, or None."""
    for copy in (0, SPAN.size):
        magic, span, claim_seq, age, check = SPAN.unpack_from(view, offset + copy)
        if magic == SPAN_MAGIC and check == _span_check(secret, span, claim_seq, age):
            return span, claim_seq, age
    return None


def read_span_header_v2(view: memoryview, offset: int) -> tuple[int, int, int] | None:
    """(segments, claim seq, age) of a format 2 span, or None."""
    magic, span, claim_seq, age = SPAN_V2.unpack_from(view, offset)
    return (span, claim_seq, age) if magic == SPAN_MAGIC_V2 else None

"""How much arena room a stored value takes: the sizes of the hot tier's record layout.

A record is a fixed header, the key, the parent key (empty for none), padding to ``ALIGN``, then
the value, padded to ``ALIGN`` again; a span starts with a ``SPAN_HEADER_BYTES`` header. The
encoding of those headers belongs to the server (``gcache.server.record``, ``arena``); only the
arithmetic lives here, below both the server and the offline tools that size arenas the way the
server fills them (``gcache replay`` enlarges an arena by exactly the record overhead of its
objects), so that neither has to import the other.
"""

from __future__ import annotations

ALIGN = 64                    # records and values start at multiples of this
RECORD_HEADER_BYTES = 48      # the fixed part of a record (``gcache.server.record.RECORD``)
SPAN_HEADER_BYTES = 64        # a span's header (``gcache.server.arena``), before its records


def align(n_bytes: int) -> int:
    """``n_bytes`` rounded up to a multiple of ``ALIGN``."""
    return (n_bytes + ALIGN - 1) & ~(ALIGN - 1)


def record_size(names_len: int, length: int, *, header_bytes: int = RECORD_HEADER_BYTES) -> int:
    """Bytes a record occupies whose key and parent key take ``names_len`` bytes together and
    whose value takes ``length`` (``header_bytes``: another format's fixed header)."""
    return align(align(header_bytes + names_len) + length)


def value_offset(record_offset: int, names_len: int, *,
                 header_bytes: int = RECORD_HEADER_BYTES) -> int:
    """Where the value of the record at ``record_offset`` starts."""
    return record_offset + align(header_bytes + names_len)


def span_segments(n_bytes: int, segment_bytes: int) -> int:
    """Segments a claim of ``n_bytes`` of records takes (the span header included)."""
    return -(-(SPAN_HEADER_BYTES + n_bytes) // segment_bytes)

"""What a well-formed request looks like, checked before anything of it beyond the header is read.

Pure: a header in, ``Refused`` out. A refused request cannot be skipped safely (its payload may
be huge or lie about its size), so the handler answers with ``Refused.status`` and closes the
connection. Checks that need the server's state (unknown handles, space) are the handler's.
"""

from __future__ import annotations

from gcache.frame import (
    FLAG_CHECKSUM_TRAILS,
    FLAG_IN_PLACE,
    FLAG_TENANT,
    HANDLE,
    LIST_PAGE_MAX,
    TRAILER,
    Header,
    Op,
    Status,
)
from gcache.keys import MAX_KEY_BYTES
from gcache.tenant_token import NAME_MAX_BYTES

KEYED = frozenset({Op.PUT, Op.GET, Op.ALLOC, Op.LEASE, Op.DELETE})
NO_PAYLOAD = frozenset({Op.GET, Op.ALLOC, Op.COMMIT, Op.LEASE, Op.READ, Op.DELETE, Op.STAT,
                        Op.HELLO})
AUTH_PROOF_BYTES = 32                 # HMAC-SHA256
KEY_LIST_ENTRY_MAX = 2 + MAX_KEY_BYTES


class Refused(Exception):
    """Reply with ``status`` and close: the stream can no longer be trusted."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def check_request(h: Header, *, max_value_size: int) -> None:
    """Raise Refused, naming the rule, for a request whose header breaks one."""
    if h.op in KEYED and h.key_len == 0:
        raise Refused(Status.BAD_REQUEST, f"{h.op.name} needs a key of 1..{MAX_KEY_BYTES} bytes")
    if h.op in NO_PAYLOAD and h.payload_len:
        raise Refused(Status.BAD_REQUEST, f"{h.op.name} carries no payload, got {h.payload_len}")
    trailer = TRAILER.size if h.op == Op.PUT and h.flags & FLAG_CHECKSUM_TRAILS else 0
    if trailer and h.payload_len <= trailer:
        raise Refused(Status.BAD_REQUEST, f"PUT with a trailing checksum carries "
                      f"{h.payload_len} bytes; needs a value and {trailer} more")
    if h.op in (Op.PUT, Op.WRITE) and h.payload_len > max_value_size + trailer:
        raise Refused(Status.TOO_LARGE, f"payload of {h.payload_len} bytes exceeds "
                      f"max_value_size {max_value_size}")
    if h.op == Op.AUTH and h.flags & FLAG_TENANT and \
            not AUTH_PROOF_BYTES < h.payload_len <= AUTH_PROOF_BYTES + NAME_MAX_BYTES:
        raise Refused(Status.BAD_REQUEST, f"a tenant's AUTH carries {h.payload_len} bytes; "
                      f"the proof is {AUTH_PROOF_BYTES}, then a name of 1..{NAME_MAX_BYTES}")
    if h.op == Op.AUTH and not h.flags & FLAG_TENANT and h.payload_len != AUTH_PROOF_BYTES:
        raise Refused(Status.BAD_REQUEST, f"AUTH carries {h.payload_len} bytes; the proof is "
                      f"{AUTH_PROOF_BYTES}")
    if h.op == Op.LIST and (h.payload_len > MAX_KEY_BYTES or not 1 <= h.count <= LIST_PAGE_MAX):
        raise Refused(Status.BAD_REQUEST, f"LIST of {h.count} keys after a {h.payload_len}-byte "
                      f"key: needs 1..{LIST_PAGE_MAX} keys after one of at most "
                      f"{MAX_KEY_BYTES} bytes")
    if h.op == Op.WRITE and h.flags & FLAG_IN_PLACE and h.payload_len:
        raise Refused(Status.BAD_REQUEST, "an in-place WRITE carries no payload")
    if h.op == Op.RELEASE and h.payload_len != h.count * HANDLE.size:
        raise Refused(Status.BAD_REQUEST, f"RELEASE of {h.count} handles carries "
                      f"{h.payload_len} bytes; needs {h.count * HANDLE.size}")
    if h.op in (Op.EXISTS, Op.BATCH_GET, Op.BATCH_LEASE, Op.PREFETCH) and \
            h.payload_len > h.count * KEY_LIST_ENTRY_MAX:
        raise Refused(Status.BAD_REQUEST, f"{h.count} keys cannot take {h.payload_len} bytes")

"""The data-plane frame codec: a fixed 64-byte little-endian header, then key, then payload.

Every request gets exactly one reply frame with the same ``request_id``, so a client may pipeline
requests (send several, then read the replies in order). ``docs/protocol.md`` documents each
opcode field by field; it and this module change together. Decoding validates everything a peer
controls (magic, version, opcode, key length, declared payload) before a byte of payload is read,
so a hostile header costs the server 64 bytes, never an allocation.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Sequence
from typing import NamedTuple

from gcache.errors import ProtocolError
from gcache.keys import MAX_KEY_BYTES

MAGIC = 0x564B4347  # b"GCKV" read as a little-endian u32
# 2: the placement group's hash got its own field (version 1 carried it in ``handle``)
VERSION = 2
HEADER = struct.Struct("<IBBBBIHHQQQQQQ")  # magic, version, then Header's fields in order
HEADER_SIZE = HEADER.size  # 64
TRAILER = struct.Struct("<Q")
# PUT flag: the value's xxh3_64 follows the value as an 8-byte trailer (counted in payload_len)
# instead of riding in the header, so a sender can hash each slice just before sending it.
FLAG_CHECKSUM_TRAILS = 0x01
# RELEASE / WRITE flag: send no reply (shared-memory clients notify off the critical path).
FLAG_NO_REPLY = 0x02
# WRITE flag: no payload; [offset, offset + length) of the extent was already written in place
# by a same-host client, and the server may hash it now instead of at COMMIT.
FLAG_IN_PLACE = 0x04
# PUT / BATCH_PUT / ALLOC flag: the key names its value (a KV page's key is a hash of what the
# value was computed from), so no put can give it another value: a server that was out of the
# map keeps it (``gcache.server.mutable_keys``).
FLAG_CONTENT_ADDRESSED = 0x08
# PUT / BATCH_PUT / ALLOC flag: a file's part (``gcache.files``): once committed the value stays
# in memory, never evicted nor demoted by KV traffic, until it is deleted or put again, within
# the server's pin budget (past it the put is NO_SPACE). LIST lists these keys.
FLAG_PINNED = 0x10
# PUT / BATCH_PUT / ALLOC flag: each key names its prefix parent, the object that must be held
# for this one to be of any use (a KV page's previous page, a window tail's page): the key field
# of each key is ``key || parent || u8 len(parent)`` (``with_parent``), parent 0..PARENT_MAX
# bytes, none when 0. The server keeps the parent in the record and, when it reclaims memory,
# gives no second chance to a value whose parent it no longer holds (``docs/protocol.md``).
# Servers that take it say ``"parents": true`` in HELLO; a client sends it to no other.
FLAG_PARENT = 0x20
PARENT_MAX = 63          # a parent's bytes fit the 6 spare bits of the record's read byte
# AUTH flag: the connection proves a tenant (``gcache.tenant_token``): the payload is the
# 32-byte proof then the tenant's name, and every key it sends is that tenant's.
FLAG_TENANT = 0x40


def with_parent(key: bytes, parent: bytes) -> bytes:
    """The key field of a ``FLAG_PARENT`` request for ``key`` whose parent is ``parent``."""
    if len(parent) > PARENT_MAX:
        raise ProtocolError(f"a parent key is {len(parent)} bytes; at most {PARENT_MAX}")
    return key + parent + bytes((len(parent),))


def split_parent(field: bytes) -> tuple[bytes, bytes]:
    """(key, parent) from a ``FLAG_PARENT`` key field; raises ProtocolError naming what is
    wrong."""
    n = field[-1] if field else 0
    if not field or n > PARENT_MAX or n + 2 > len(field):
        raise ProtocolError(f"a FLAG_PARENT key field of {len(field)} bytes declares a "
                            f"{n}-byte parent; it must end with the parent's length "
                            f"(0..{PARENT_MAX}) after a key of at least one byte")
    return field[:len(field) - 1 - n], field[len(field) - 1 - n:-1]


class Op(enum.IntEnum):
    PUT = 1          # key + value in one frame (the small-value fast path)
    GET = 2          # key -> value in one reply
    ALLOC = 3        # key, length -> handle of a server-allocated extent
    WRITE = 4        # handle, offset, payload -> bytes written into the extent
    COMMIT = 5       # handle, checksum -> value visible
    LEASE = 6        # key -> handle pinning the value, its length and checksum
    READ = 7         # handle, offset, length -> payload
    RELEASE = 8      # handle -> lease dropped
    EXISTS = 9       # count keys -> count presence bytes
    DELETE = 10      # key -> OK or NOT_FOUND
    STAT = 11        # -> JSON payload of server statistics
    BATCH_GET = 12   # count keys -> entry table, then the values
    BATCH_PUT = 13   # entry table, keys, values -> count status bytes
    HELLO = 14       # -> JSON server facts; on a Unix socket also the arena's descriptor
    BATCH_LEASE = 15 # count keys -> lease table (status, handle, offset, length, checksum)
    AUTH = 16        # payload HMAC-SHA256(token, nonce || AUTH_CONTEXT) -> as HELLO's reply;
                     # FLAG_TENANT: a tenant's proof, then its name
    LIST = 17        # key prefix, payload the last key of the previous page, count the most
                     # keys -> the pinned keys after it, in order (``encode_keys``), and count
    PREFETCH = 18    # count keys -> count ``Prefetched`` bytes: each key brought from the cold
                     # tier into memory ahead of a read, nothing returned (``gcache.prefetched``)


class Status(enum.IntEnum):
    OK = 0
    NOT_FOUND = 1
    BAD_REQUEST = 2
    NO_SPACE = 3
    CHECKSUM_MISMATCH = 4
    TOO_LARGE = 5
    UNKNOWN_HANDLE = 6
    INTERNAL = 7
    AUTH_REQUIRED = 8   # HELLO reply: payload is the nonce to answer with AUTH
    AUTH_FAILED = 9     # wrong token; the connection is closed


class Header(NamedTuple):
    """A frame header. A NamedTuple rather than a dataclass: a frame is built and parsed on
    every request, and tuple construction is several times cheaper than a frozen dataclass's."""

    op: Op
    request_id: int = 0
    status: Status = Status.OK
    flags: int = 0
    key_len: int = 0
    # Shadows tuple.count, which mypy calls an incompatible override: the wire names the field
    # so, and nothing calls tuple.count on a Header.
    count: int = 0  # type: ignore[assignment]  # entries in a batch
    payload_len: int = 0    # bytes after the key
    handle: int = 0         # extent or lease handle
    offset: int = 0         # byte offset inside an extent (or the arena, for same-host clients)
    length: int = 0         # value length (ALLOC, LEASE reply, READ request)
    checksum: int = 0       # xxh3_64 of the whole value
    group: int = 0          # xxh3_64 of the placement group a put's keys belong to; 0: none

    def pack(self) -> bytes:
        # Wire order puts flags and status before request_id; fields from key_len on match.
        return HEADER.pack(MAGIC, VERSION, self.op, self.flags, self.status, self.request_id,
                           *self[4:])


_OPS = {int(op): op for op in Op}
_STATUSES = {int(status): status for status in Status}


def unpack_header(data: bytes | bytearray | memoryview, *, max_payload: int) -> Header:
    """Decode and validate a header. Raises ProtocolError naming the bad field."""
    if len(data) != HEADER_SIZE:
        raise ProtocolError(f"header is {len(data)} bytes; must be {HEADER_SIZE}")
    magic, version, op, flags, status, *rest = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"magic is {magic:#010x}; must be {MAGIC:#010x}")
    if version != VERSION:
        raise ProtocolError(f"version is {version}; this peer speaks {VERSION}")
    op_enum, status_enum = _OPS.get(op), _STATUSES.get(status)
    if op_enum is None or status_enum is None:
        raise ProtocolError(f"unknown opcode {op} or status {status}")
    header = Header(op_enum, rest[0], status_enum, flags, *rest[1:])
    if header.key_len > MAX_KEY_BYTES:
        raise ProtocolError(f"key_len is {header.key_len}; limit is {MAX_KEY_BYTES}")
    if header.payload_len > max_payload:
        raise ProtocolError(f"payload_len is {header.payload_len}; limit is {max_payload}")
    return header


AUTH_CONTEXT = b"gcache-data-plane-v1"


def auth_proof(token: str, nonce: bytes) -> bytes:
    """The AUTH payload: proves knowledge of the cluster token without sending it."""
    return hmac.new(token.encode(), nonce + AUTH_CONTEXT, hashlib.sha256).digest()


# ---- batch payloads -------------------------------------------------------------------------

_KEY_LEN = struct.Struct("<H")
GET_ENTRY = struct.Struct("<BQQ")     # status, length, checksum (BATCH_GET reply table)
PUT_ENTRY = struct.Struct("<HQQ")     # key_len, length, checksum (BATCH_PUT request table)
LEASE_ENTRY = struct.Struct("<BQQQQ")  # status, handle, offset, length, checksum (BATCH_LEASE)
HANDLE = struct.Struct("<Q")          # one handle in a batched RELEASE
LIST_PAGE_MAX = 1024                  # keys one LIST reply carries at most (1 MiB at most)


def encode_keys(keys: Sequence[bytes]) -> bytes:
    """Keys as ``u16 length + bytes`` each (EXISTS and BATCH_GET payloads)."""
    return b"".join(_KEY_LEN.pack(len(k)) + k for k in keys)


def decode_keys(payload: bytes | bytearray | memoryview, count: int) -> list[bytes]:
    """Inverse of ``encode_keys``; raises ProtocolError if the payload does not hold ``count``."""
    keys: list[bytes] = []
    pos, view = 0, memoryview(payload)
    for _ in range(count):
        if pos + 2 > len(view):
            raise ProtocolError(f"key list ends after {len(keys)} of {count} keys")
        (n,) = _KEY_LEN.unpack_from(view, pos)
        pos += 2
        if n == 0 or n > MAX_KEY_BYTES or pos + n > len(view):
            raise ProtocolError(f"key {len(keys)} declares {n} bytes; must be 1..{MAX_KEY_BYTES}"
                                " and inside the payload")
        keys.append(bytes(view[pos:pos + n]))
        pos += n
    if pos != len(view):
        raise ProtocolError(f"key list has {len(view) - pos} trailing bytes")
    return keys

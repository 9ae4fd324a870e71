"""The client side of the data-plane protocol: one function per exchange, over one connection.

Each function sends its request frames and reads exactly the replies they produce, so the
connection is back in sync when it returns; on any exception the caller must close the
connection (it may be mid-frame). Values move straight from the caller's buffer to the socket
and from the socket into the caller's ``out``: no copy of ours, except ``get`` which has to
hand back ``bytes``.

Path choice over TCP: a put is one PUT frame and a read one GET, whatever the size, each sent
or streamed back in ``io_size`` IOs: one round trip. On one ordered stream the split
ALLOC/WRITE/COMMIT and LEASE/READ/RELEASE exchanges cost extra round trips and per-slice
replies for nothing (measured: 3.2 against 3.9 GB/s for 4 MiB puts); they exist for the paths
where the client touches the server's memory itself (shared memory, RDMA) or spreads one
value's slices over several connections, and are tested over TCP at the wire level.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from gcache.errors import InvalidRequest, ProtocolError
from gcache.frame import (
    FLAG_CHECKSUM_TRAILS,
    GET_ENTRY,
    HEADER_SIZE,
    LIST_PAGE_MAX,
    PUT_ENTRY,
    TRAILER,
    Header,
    Op,
    Status,
    decode_keys,
    encode_keys,
    unpack_header,
)
from gcache.keys import HASH_PIECE, MAX_KEY_BYTES, checksum_stream
from gcache.outcomes import raise_for_status, raise_unless_answer
from gcache.prefetched import WIRE, Prefetched
from gcache.sdk.receive_buffers import RECEIVE_BUFFERS
from gcache.transport.stream import StreamConnection

_MAX_REPLY_PAYLOAD = 1 << 42        # a batch reply's whole payload; each part is checked too
MAX_STAT_BYTES = 16 << 20           # a STAT reply's JSON


class RequestFields(TypedDict, total=False):
    """The ``Header`` fields a request sets besides its op, id, key and payload."""

    flags: int
    count: int
    handle: int
    offset: int
    length: int
    checksum: int
    group: int


class HeaderFields(RequestFields, total=False):
    payload_len: int      # set by the caller only where it streams the payload itself


@dataclass(frozen=True, slots=True)
class ReadResult:
    """A value read into ``data`` (the caller's ``out`` or a fresh buffer); ``checksum_ok``
    False means the bytes did not hash to the stored checksum and must not be used."""

    data: Any
    length: int
    checksum_ok: bool


class Channel:
    """One connection plus the request ids and timeout used on it.

    A server's word is checked before the SDK acts on it: a reply that announces more than
    ``max_value_size`` for one value, or more than a small reply can hold, is a ProtocolError
    (a miss) before anything is allocated for it.
    """

    __slots__ = ("_next_id", "conn", "max_value_size", "timeout_s")

    def __init__(self, conn: StreamConnection, *, timeout_s: float,
                 max_value_size: int = 1 << 30) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self.max_value_size = max_value_size
        self._next_id = 0

    def header(self, op: Op, *, key: bytes = b"", **fields: Unpack[HeaderFields]) -> Header:
        """A request header with the next request id (for callers that stream the payload)."""
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        return Header(op, self._next_id, key_len=len(key), **fields)

    def request(self, op: Op, *, key: bytes = b"", payload: Sequence[bytes | memoryview] = (),
                **fields: Unpack[RequestFields]) -> Header:
        header = self.header(op, key=key, payload_len=sum(len(p) for p in payload), **fields)
        self.conn.send((header.pack(), key, *payload), timeout_s=self.timeout_s)
        return header

    def reply(self, request: Header) -> Header:
        raw = self.conn.recv_exact(HEADER_SIZE, timeout_s=self.timeout_s)
        header = unpack_header(raw, max_payload=_MAX_REPLY_PAYLOAD)
        if header.request_id != request.request_id or header.op != request.op:
            raise ProtocolError(f"reply {header.op.name}#{header.request_id} does not answer "
                                f"{request.op.name}#{request.request_id}")
        return header

    def payload(self, header: Header, *, limit: int | None = None) -> bytearray:
        """The reply's payload, refused (ProtocolError) when it is over ``limit`` bytes
        (default ``max_value_size``)."""
        limit = self.max_value_size if limit is None else limit
        if header.payload_len > limit:
            raise ProtocolError(f"{header.op.name} reply announces {header.payload_len} bytes; "
                                f"at most {limit} expected")
        return self.conn.recv_exact(header.payload_len, timeout_s=self.timeout_s)

    def check_value_length(self, length: int) -> None:
        if length > self.max_value_size:
            raise ProtocolError(f"server announced a {length}-byte value; max_value_size is "
                                f"{self.max_value_size}")


def put(ch: Channel, key: bytes, value: memoryview, *, io_size: int, group: int = 0,
        flags: int = 0) -> Status:
    """Store ``value``; returns OK, NO_SPACE or CHECKSUM_MISMATCH. Raises transport errors.

    One PUT frame whose checksum trails the value: each piece (``HASH_PIECE``, at most
    ``io_size``) is hashed just before it is sent, so the send finds it in cache and the server
    receives and hashes one piece while the next is hashed here; neither side makes a second
    pass over the value. (Hashing a whole ``io_size`` slice before sending any of it held the
    server idle meanwhile: 1 MiB puts at 3.1-3.6 GB/s against 4.3-4.4 in 256 KiB pieces.)
    """
    request = ch.header(Op.PUT, key=key, payload_len=len(value) + TRAILER.size,
                        flags=FLAG_CHECKSUM_TRAILS | flags, group=group)
    hasher = checksum_stream()
    step = min(io_size, HASH_PIECE)
    first = value[:step]
    hasher.update(first)
    ch.conn.send((request.pack(), key, first), timeout_s=ch.timeout_s)
    for off in range(step, len(value), step):
        piece = value[off:off + step]
        hasher.update(piece)
        ch.conn.send((piece,), timeout_s=ch.timeout_s)
    ch.conn.send((TRAILER.pack(hasher.intdigest()),), timeout_s=ch.timeout_s)
    reply = ch.reply(request)
    raise_unless_answer(reply, "PUT")
    return reply.status


def get_length(ch: Channel, key: bytes) -> tuple[Header, Header]:
    """Send GET and read the reply header; the value (``payload_len`` bytes) follows an OK.
    NO_SPACE (on disk, no room in memory now) is an answer, not a failure."""
    request = ch.request(Op.GET, key=key)
    reply = ch.reply(request)
    raise_unless_answer(reply, "GET")
    return request, reply


def read_value(ch: Channel, key: bytes, out: memoryview | None, *,
               verify: bool) -> ReadResult | Status | None:
    """GET ``key`` into ``out`` (or a new buffer); None when absent, NO_SPACE when it is on the
    server's disk with no room in memory to bring it up now. Raises InvalidRequest for an
    ``out`` smaller than the value (the connection is then mid-reply: close it)."""
    _, reply = get_length(ch, key)
    if reply.status == Status.NO_SPACE:
        return Status.NO_SPACE
    if reply.status == Status.NOT_FOUND:
        return None
    ch.check_value_length(reply.payload_len)
    if out is not None:
        check_fits(len(out), reply.payload_len, "out")
    return _recv_value(ch, out, reply.payload_len, reply.checksum, verify=verify)


def _recv_value(ch: Channel, out: memoryview | None, length: int, stored: int, *,
                verify: bool) -> ReadResult:
    """Receive a value that follows on the wire into ``out`` (or a new buffer), hashing it."""
    target = RECEIVE_BUFFERS.take(length) if out is None else out
    hasher = checksum_stream() if verify else None
    ch.conn.recv_into(target[:length], timeout_s=ch.timeout_s, hasher=hasher)
    return ReadResult(target, length, hasher is None or hasher.intdigest() == stored)


def exists(ch: Channel, keys: Sequence[bytes]) -> list[bool]:
    reply = ch.reply(ch.request(Op.EXISTS, payload=(encode_keys(keys),), count=len(keys)))
    raise_for_status(reply, "EXISTS")
    present = ch.payload(reply, limit=len(keys))
    if len(present) != len(keys):
        raise ProtocolError(f"EXISTS answered {len(present)} flags for {len(keys)} keys")
    return [flag == 1 for flag in present]


def prefetch(ch: Channel, keys: Sequence[bytes]) -> list[Prefetched]:
    """PREFETCH: what the server did with each key (``gcache.prefetched``)."""
    reply = ch.reply(ch.request(Op.PREFETCH, payload=(encode_keys(keys),), count=len(keys)))
    raise_for_status(reply, "PREFETCH")
    states = ch.payload(reply, limit=len(keys))
    if len(states) != len(keys) or any(s not in WIRE for s in states):
        raise ProtocolError(f"PREFETCH answered {bytes(states)[:16]!r} for {len(keys)} keys")
    return [Prefetched(s) for s in states]


def delete(ch: Channel, key: bytes) -> bool:
    reply = ch.reply(ch.request(Op.DELETE, key=key))
    raise_for_status(reply, "DELETE")
    return reply.status == Status.OK


def list_pinned(ch: Channel, prefix: bytes, after: bytes) -> list[bytes]:
    """One page (``LIST_PAGE_MAX`` keys at most) of the server's pinned keys under ``prefix``
    that sort after ``after``; a shorter page is the last."""
    reply = ch.reply(ch.request(Op.LIST, key=prefix, payload=(after,), count=LIST_PAGE_MAX))
    raise_for_status(reply, "LIST")
    if reply.count > LIST_PAGE_MAX:
        raise ProtocolError(f"LIST answered {reply.count} keys; at most {LIST_PAGE_MAX} asked")
    keys = decode_keys(ch.payload(reply, limit=LIST_PAGE_MAX * (2 + MAX_KEY_BYTES)), reply.count)
    if any(not k.startswith(prefix) or k <= after for k in keys) or keys != sorted(keys):
        raise ProtocolError("LIST answered keys out of order or outside the prefix")
    return keys


def stat(ch: Channel) -> dict[str, Any]:
    reply = ch.reply(ch.request(Op.STAT))
    raise_for_status(reply, "STAT")
    try:
        stats = json.loads(bytes(ch.payload(reply, limit=MAX_STAT_BYTES)))
    except ValueError as exc:
        raise ProtocolError(f"STAT reply is not JSON: {exc}") from None
    if not isinstance(stats, dict):
        raise ProtocolError("STAT reply is not a JSON object")
    return stats


def batch_put(ch: Channel, keys: Sequence[bytes], values: Sequence[memoryview],
              checksums: Sequence[int], *, group: int = 0, flags: int = 0) -> list[Status]:
    table = b"".join(PUT_ENTRY.pack(len(k), len(v), c)
                     for k, v, c in zip(keys, values, checksums))
    reply = ch.reply(ch.request(Op.BATCH_PUT, payload=(table, b"".join(keys), *values),
                                count=len(keys), group=group, flags=flags))
    raise_for_status(reply, "BATCH_PUT")
    statuses = ch.payload(reply, limit=len(keys))
    if len(statuses) != len(keys):
        raise ProtocolError(f"BATCH_PUT answered {len(statuses)} statuses for {len(keys)} keys")
    try:
        return [Status(s) for s in statuses]
    except ValueError as exc:
        raise ProtocolError(f"BATCH_PUT answered an unknown status: {exc}") from None


def batch_read_values(ch: Channel, keys: Sequence[bytes], outs: Sequence[memoryview] | None, *,
                      verify: bool) -> list[ReadResult | Status | None]:
    """One BATCH_GET; each present value lands in its ``out`` (or a new buffer); None for an
    absent key, NO_SPACE for one the server could not bring up from disk now. Raises
    InvalidRequest, before reading any value, when an ``out`` is too small."""
    reply = ch.reply(ch.request(Op.BATCH_GET, payload=(encode_keys(keys),), count=len(keys)))
    raise_for_status(reply, "BATCH_GET")
    raw = ch.conn.recv_exact(len(keys) * GET_ENTRY.size, timeout_s=ch.timeout_s)
    table = [GET_ENTRY.unpack_from(raw, i * GET_ENTRY.size) for i in range(len(keys))]
    for status, length, _ in table:
        if status == Status.OK:
            ch.check_value_length(length)
    expected = len(raw) + sum(length for status, length, _ in table if status == Status.OK)
    if expected != reply.payload_len:
        raise ProtocolError(f"BATCH_GET table adds up to {expected} bytes, frame says "
                            f"{reply.payload_len}")
    if outs is not None:
        for n, (status, length, _) in enumerate(table):
            if status == Status.OK:
                check_fits(len(outs[n]), length, f"outs[{n}]")
    results: list[ReadResult | Status | None] = []
    for n, (status, length, stored) in enumerate(table):
        if status != Status.OK:
            results.append(Status.NO_SPACE if status == Status.NO_SPACE else None)
            continue
        results.append(_recv_value(ch, None if outs is None else outs[n], length, stored,
                                   verify=verify))
    return results


def check_fits(size: int, length: int, what: str) -> None:
    """Raise InvalidRequest when a destination of ``size`` bytes cannot hold ``length``."""
    if size < length:
        raise InvalidRequest(f"{what} is {size} bytes; the value is {length} bytes")

"""The client side of same-host exchanges: small frames on the Unix socket, values copied once
between the caller's buffer and the server's mapped arena.

Read: LEASE -> copy out of the mapping (hashing as it goes) -> RELEASE without a reply, so the
release costs a send, not a round trip. Write: ALLOC -> copy in (hashing), announcing each chunk
with a no-reply in-place WRITE so the server hashes it meanwhile -> COMMIT, whose reply says
whether the server's own hash of the arena bytes matched ours. Batches lease with one request
per server, and allocate and commit with a bounded pipeline of requests; their copies are
separate steps so that the client can run them on its IO threads in parallel.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gcache.buffer import is_cuda_tensor
from gcache.errors import IOTimeout, ProtocolError
from gcache.frame import (FLAG_IN_PLACE, FLAG_NO_REPLY, HANDLE, LEASE_ENTRY, Op, Status,
                          encode_keys, raise_for_status)
from gcache.keys import checksum_stream
from gcache.sdk.protocol import Channel, ReadResult, check_fits, raise_for_status_except_space
from gcache.transport.cuda import cuda_nbytes, read_into_cuda, write_from_cuda
from gcache.transport.shm import COPY_CHUNK, ArenaMapping


PIPELINE_WINDOW = 32     # requests in flight on one connection before reading a reply


@dataclass(frozen=True, slots=True)
class Extent:
    """Where a leased or allocated value lives in the arena; ``write_by_s`` (monotonic) is
    when an allocated extent stops being safe to write (``ArenaMapping.write_window_s``)."""

    handle: int
    offset: int
    length: int
    checksum: int = 0
    write_by_s: float = math.inf


class WriteWindowPassed(IOTimeout):
    """The server's TTL for an allocated extent is (nearly) over: writing on could land in
    memory it has handed to another value."""


def check_window(extent: Extent) -> None:
    if time.monotonic() > extent.write_by_s:
        raise WriteWindowPassed(f"{extent.length}-byte write outlived its lease window")


def size_of(target: Any) -> int:
    """Bytes in a buffer view or a CUDA tensor."""
    return cuda_nbytes(target) if is_cuda_tensor(target) else len(target)


def copy_out(mapping: ArenaMapping, extent: Extent, out: Any, *, verify: bool) -> bool:
    """Copy a leased value into ``out``; False when its checksum does not hold."""
    hasher = checksum_stream() if verify else None
    if is_cuda_tensor(out):
        read_into_cuda(mapping, extent.offset, extent.length, out, hasher)
    else:
        mapping.read_into(extent.offset, out[:extent.length], hasher)
    return hasher is None or hasher.intdigest() == extent.checksum


def copy_in(mapping: ArenaMapping, extent: Extent, value: Any) -> int:
    """Copy ``value`` into an allocated extent; returns its checksum. Raises
    WriteWindowPassed, before each chunk, once the extent's write window is over."""
    hasher = checksum_stream()
    if is_cuda_tensor(value):
        check_window(extent)
        write_from_cuda(mapping, extent.offset, value, hasher)
        return hasher.intdigest()
    for start in range(0, extent.length, COPY_CHUNK):
        check_window(extent)
        mapping.write_from(extent.offset + start, value[start:start + COPY_CHUNK], hasher)
    return hasher.intdigest()


def release(ch: Channel, handles: Sequence[int]) -> None:
    """Drop leases without waiting for (or getting) a reply."""
    if len(handles) == 1:
        ch.request(Op.RELEASE, handle=handles[0], flags=FLAG_NO_REPLY)
    elif handles:
        payload = b"".join(HANDLE.pack(h) for h in handles)
        ch.request(Op.RELEASE, payload=(payload,), count=len(handles), flags=FLAG_NO_REPLY)


def read_value(ch: Channel, key: bytes, out: Any, *, verify: bool) -> ReadResult | Status | None:
    """LEASE, copy, RELEASE. None when absent, NO_SPACE when the server could not bring it up
    from disk now; InvalidRequest for a too-small ``out``."""
    assert ch.mapping is not None
    reply = ch.reply(ch.request(Op.LEASE, key=key))
    if reply.status == Status.NO_SPACE:
        return Status.NO_SPACE
    raise_for_status(reply, "LEASE")
    if reply.status == Status.NOT_FOUND:
        return None
    extent = Extent(reply.handle, reply.offset, reply.length, reply.checksum)
    try:
        ch.check_value_length(extent.length)
        target = memoryview(bytearray(extent.length)) if out is None else out
        check_fits(size_of(target), extent.length, "out")
        ok = copy_out(ch.mapping, extent, target, verify=verify)
    finally:
        release(ch, [extent.handle])
    return ReadResult(target, extent.length, ok)


def write_value(ch: Channel, key: bytes, value: Any, *, group: int = 0) -> Status:
    """ALLOC, copy, COMMIT; returns OK, NO_SPACE or CHECKSUM_MISMATCH.

    After each copied chunk an in-place WRITE notice (no reply) lets the server hash that chunk
    while the next one is copied, so COMMIT finds its hash nearly done instead of re-reading
    the whole value.
    """
    assert ch.mapping is not None
    size, asked_s = size_of(value), time.monotonic()
    alloc = ch.reply(ch.request(Op.ALLOC, key=key, length=size, handle=group))
    raise_for_status_except_space(alloc, "ALLOC")
    if alloc.status != Status.OK:
        return alloc.status
    extent = _allocated(ch, alloc.handle, alloc.offset, alloc.length, size, asked_s)
    if is_cuda_tensor(value):
        digest = copy_in(ch.mapping, extent, value)
        _notify_written(ch, alloc.handle, 0, alloc.length)
    else:
        hasher = checksum_stream()
        for start in range(0, alloc.length, COPY_CHUNK):
            check_window(extent)
            piece = value[start:start + COPY_CHUNK]
            ch.mapping.write_from(alloc.offset + start, piece, hasher)
            _notify_written(ch, alloc.handle, start, len(piece))
        digest = hasher.intdigest()
    reply = ch.reply(ch.request(Op.COMMIT, handle=alloc.handle, checksum=digest))
    raise_for_status_except_space(reply, "COMMIT")
    return reply.status


def _allocated(ch: Channel, handle: int, offset: int, length: int, asked: int,
               asked_s: float) -> Extent:
    """The extent an ALLOC reply names, with its write window counted from ``asked_s``, when
    the request was sent (the server's TTL starts later, never earlier); ProtocolError when the
    server answered another length than asked for."""
    if length != asked:
        raise ProtocolError(f"ALLOC of {asked} bytes answered with {length}")
    assert ch.mapping is not None
    return Extent(handle, offset, length, write_by_s=asked_s + ch.mapping.write_window_s)


def _notify_written(ch: Channel, handle: int, offset: int, length: int) -> None:
    ch.request(Op.WRITE, handle=handle, offset=offset, length=length,
               flags=FLAG_IN_PLACE | FLAG_NO_REPLY)


def lease_many(ch: Channel, keys: Sequence[bytes]) -> list[Extent | Status | None]:
    """One BATCH_LEASE; None for each absent key, NO_SPACE for each the server could not bring
    up from disk now."""
    reply = ch.reply(ch.request(Op.BATCH_LEASE, payload=(encode_keys(keys),), count=len(keys)))
    raise_for_status(reply, "BATCH_LEASE")
    raw = ch.payload(reply, limit=len(keys) * LEASE_ENTRY.size)
    if len(raw) != len(keys) * LEASE_ENTRY.size:
        raise ProtocolError(f"BATCH_LEASE answered {len(raw)} bytes for {len(keys)} keys")
    extents: list[Extent | Status | None] = []
    for i in range(len(keys)):
        status, handle, offset, length, csum = LEASE_ENTRY.unpack_from(raw, i * LEASE_ENTRY.size)
        if status == Status.OK:
            ch.check_value_length(length)
            extents.append(Extent(handle, offset, length, csum))
        else:
            extents.append(Status.NO_SPACE if status == Status.NO_SPACE else None)
    return extents


def alloc_many(ch: Channel, keys: Sequence[bytes], sizes: Sequence[int], *,
               group: int = 0) -> list[Extent | None]:
    """Pipelined ALLOCs; None where the server had no space."""
    extents: list[Extent | None] = []
    asked_s = time.monotonic()
    for n, reply in enumerate(_pipelined(ch, [dict(key=k, length=size, handle=group)
                                              for k, size in zip(keys, sizes)], Op.ALLOC)):
        raise_for_status_except_space(reply, "ALLOC")
        ok = reply.status == Status.OK
        extents.append(_allocated(ch, reply.handle, reply.offset, reply.length, sizes[n],
                                  asked_s) if ok else None)
    return extents


def commit_many(ch: Channel, handles: Sequence[int], digests: Sequence[int]) -> list[Status]:
    """Pipelined COMMITs, in order."""
    statuses = []
    for reply in _pipelined(ch, [dict(handle=h, checksum=d) for h, d in zip(handles, digests)],
                            Op.COMMIT):
        raise_for_status_except_space(reply, "COMMIT")
        statuses.append(reply.status)
    return statuses


def _pipelined(ch: Channel, requests: list[dict], op: Op) -> Iterator:
    """Send ``requests`` at most ``PIPELINE_WINDOW`` ahead of the replies read, yielding the
    replies in order. Unbounded pipelining deadlocks: a Unix socket's buffer is charged per
    message, so a few hundred small frames fill it while the server, blocked sending replies
    nobody reads yet, stops reading."""
    pending: deque = deque()
    for fields in requests:
        pending.append(ch.request(op, **fields))
        if len(pending) >= PIPELINE_WINDOW:
            yield ch.reply(pending.popleft())
    while pending:
        yield ch.reply(pending.popleft())

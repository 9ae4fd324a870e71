"""The frames of the exchanges where the client moves a value's bytes itself (shared memory,
NIXL): LEASE / BATCH_LEASE and RELEASE around a read, ALLOC, in-place WRITE notices and
COMMIT around a write, on the link's control connection; and ``LeasedExchange``, those
exchanges' common part. Only the bytes' path (``copy_out`` / ``copy_in``) differs between
those transports; the frames and their rules do not.

Batches lease with one request per server and allocate and commit with a bounded pipeline of
requests. RELEASE never waits for a reply: it costs a send, not a round trip.

A copy out of an arena is not hashed again by default (``ClientConfig.verify_arena_reads``):
the server hashed those bytes when they were committed, and while the lease holds they cannot
change. What stands in for the hash is checking that the lease did hold through the copy
(``copy_held``): the server is still there, and the copy ended within the lease window.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from gcache.buffer import BufferLike, is_cuda_tensor, nbytes
from gcache.errors import ConnectionLost, IOTimeout, ProtocolError
from gcache.frame import (
    FLAG_IN_PLACE,
    FLAG_NO_REPLY,
    HANDLE,
    LEASE_ENTRY,
    Header,
    Op,
    Status,
    encode_keys,
)
from gcache.keys import checksum
from gcache.outcomes import raise_for_status, raise_unless_answer
from gcache.sdk.ahead_hash import AheadHash
from gcache.sdk.protocol import Channel, ReadResult, RequestFields, check_fits
from gcache.sdk.receive_buffers import RECEIVE_BUFFERS
from gcache.transport.stream import StreamConnection

PIPELINE_WINDOW = 32     # requests in flight on one connection before reading a reply


@dataclass(frozen=True, slots=True)
class Extent:
    """Where a leased or allocated value lives in the arena; ``until_s`` (monotonic) is when
    the extent stops being safe to read or write: half the server's lease TTL after the LEASE
    or ALLOC was sent, after which the server may hand its memory to another value."""

    handle: int
    offset: int
    length: int
    checksum: int = 0
    until_s: float = math.inf


class WriteWindowPassed(IOTimeout):
    """The server's TTL for an allocated extent is (nearly) over: writing on could land in
    memory it has handed to another value."""


def check_window(extent: Extent) -> None:
    if time.monotonic() > extent.until_s:
        raise WriteWindowPassed(f"{extent.length}-byte write outlived its lease window")


def copy_held(conn: StreamConnection, extent: Extent, out: BufferLike) -> bool:
    """Whether an unhashed copy of a leased value landed the value's bytes: raises
    ConnectionLost when the server is gone (it may have died during the copy, and a server
    restarted on the same arena may have given the extent to a new value), and hashes what
    landed when the copy ended past the lease window (the TTL may have dropped the lease)."""
    if conn.peer_closed():
        raise ConnectionLost(f"{conn.peer} closed while a {extent.length}-byte value was copied")
    if time.monotonic() <= extent.until_s:
        return True
    if is_cuda_tensor(out):
        from gcache.transport.cuda import cuda_digest
        return cuda_digest(out, extent.length) == extent.checksum
    return checksum(memoryview(out).cast("B")[:extent.length]) == extent.checksum


class CopiesOut(Protocol):
    """The part of an ``Exchange`` that ``copied`` drives (that module imports this one)."""

    def copy_out(self, extent: Extent, out: BufferLike, *, verify: bool) -> bool: ...


def copied(exchange: CopiesOut, conn: StreamConnection, extent: Extent, out: BufferLike, *,
           verify: bool) -> bool:
    """``exchange.copy_out`` of a leased value; unhashed, it holds only if ``copy_held``."""
    ok = exchange.copy_out(extent, out, verify=verify)
    return copy_held(conn, extent, out) if ok and not verify else ok


def lease(ch: Channel, key: bytes, *, window_s: float) -> Extent | Status | None:
    """One LEASE: the value's extent, None when absent, NO_SPACE when it is on the server's
    disk with no room in memory to bring it up now."""
    asked_s = time.monotonic()
    reply = ch.reply(ch.request(Op.LEASE, key=key))
    raise_unless_answer(reply, "LEASE")
    if reply.status == Status.NO_SPACE:
        return Status.NO_SPACE
    if reply.status == Status.NOT_FOUND:
        return None
    ch.check_value_length(reply.length)
    return Extent(reply.handle, reply.offset, reply.length, reply.checksum, asked_s + window_s)


def lease_many(ch: Channel, keys: Sequence[bytes], *,
               window_s: float) -> list[Extent | Status | None]:
    """One BATCH_LEASE; None for each absent key, NO_SPACE for each the server could not bring
    up from disk now."""
    until_s = time.monotonic() + window_s
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
            extents.append(Extent(handle, offset, length, csum, until_s))
        else:
            extents.append(Status.NO_SPACE if status == Status.NO_SPACE else None)
    return extents


def release(ch: Channel, handles: Sequence[int]) -> None:
    """Drop leases without waiting for (or getting) a reply."""
    if len(handles) == 1:
        ch.request(Op.RELEASE, handle=handles[0], flags=FLAG_NO_REPLY)
    elif handles:
        payload = b"".join(HANDLE.pack(h) for h in handles)
        ch.request(Op.RELEASE, payload=(payload,), count=len(handles), flags=FLAG_NO_REPLY)


def written(ch: Channel, handle: int, offset: int, length: int) -> None:
    """Tell the server (no reply) that ``length`` bytes at ``offset`` of an allocated extent
    have landed, so it hashes them while the rest is written and COMMIT finds its hash nearly
    done instead of re-reading the whole value."""
    ch.request(Op.WRITE, handle=handle, offset=offset, length=length,
               flags=FLAG_IN_PLACE | FLAG_NO_REPLY)


def alloc(ch: Channel, key: bytes, size: int, *, group: int, window_s: float,
          flags: int = 0, meanwhile: Callable[[], None] | None = None) -> Extent | Status:
    """One ALLOC (``flags``: the put's); the extent to write, or NO_SPACE. ``meanwhile`` runs
    between sending the request and reading its reply, so its work costs no time of its own
    while the server allocates."""
    asked_s = time.monotonic()
    request = ch.request(Op.ALLOC, key=key, length=size, group=group, flags=flags)
    if meanwhile is not None:
        meanwhile()
    reply = ch.reply(request)
    raise_unless_answer(reply, "ALLOC")
    if reply.status != Status.OK:
        return reply.status
    return _allocated(reply.handle, reply.offset, reply.length, size, asked_s + window_s)


def alloc_many(ch: Channel, keys: Sequence[bytes], sizes: Sequence[int], *, group: int,
               window_s: float, flags: int = 0) -> list[Extent | Status]:
    """Pipelined ALLOCs; NO_SPACE where the server had no room."""
    extents: list[Extent | Status] = []
    until_s = time.monotonic() + window_s
    requests: list[_Request] = [{"key": k, "length": size, "group": group, "flags": flags}
                                for k, size in zip(keys, sizes)]
    for n, reply in enumerate(_pipelined(ch, requests, Op.ALLOC)):
        raise_unless_answer(reply, "ALLOC")
        extents.append(_allocated(reply.handle, reply.offset, reply.length, sizes[n], until_s)
                       if reply.status == Status.OK else Status.NO_SPACE)
    return extents


def _allocated(handle: int, offset: int, length: int, asked: int, until_s: float) -> Extent:
    """The extent an ALLOC reply names, writable until ``until_s`` (counted from when the
    request was sent: the server's TTL starts later, never earlier); ProtocolError when the
    server answered another length than asked for."""
    if length != asked:
        raise ProtocolError(f"ALLOC of {asked} bytes answered with {length}")
    return Extent(handle, offset, length, until_s=until_s)


def commit(ch: Channel, handle: int, digest: int) -> Status:
    """COMMIT: OK, NO_SPACE or CHECKSUM_MISMATCH (the server's hash of the arena bytes)."""
    reply = ch.reply(ch.request(Op.COMMIT, handle=handle, checksum=digest))
    raise_unless_answer(reply, "COMMIT")
    return reply.status


def commit_many(ch: Channel, handles: Sequence[int], digests: Sequence[int]) -> list[Status]:
    """Pipelined COMMITs, in order. UNKNOWN_HANDLE is that handle's answer (its write window
    passed and the server dropped the write), not a failure of the link: the replies after it
    are read, so the other handles' commits count (they were lost with the whole batch)."""
    statuses = []
    requests: list[_Request] = [{"handle": h, "checksum": d} for h, d in zip(handles, digests)]
    for reply in _pipelined(ch, requests, Op.COMMIT):
        if reply.status != Status.UNKNOWN_HANDLE:
            raise_unless_answer(reply, "COMMIT")
        statuses.append(reply.status)
    return statuses


class _Request(RequestFields, total=False):
    """One pipelined request's keyword arguments to ``Channel.request``."""

    key: bytes


def _pipelined(ch: Channel, requests: list[_Request], op: Op) -> Iterator[Header]:
    """Send ``requests`` at most ``PIPELINE_WINDOW`` ahead of the replies read, yielding the
    replies in order. Unbounded pipelining deadlocks: a socket's buffer is charged per
    message, so a few hundred small frames fill it while the server, blocked sending replies
    nobody reads yet, stops reading."""
    pending: deque[Header] = deque()
    for fields in requests:
        pending.append(ch.request(op, **fields))
        if len(pending) >= PIPELINE_WINDOW:
            yield ch.reply(pending.popleft())
    while pending:
        yield ch.reply(pending.popleft())


class LeasedExchange(ABC):
    """An ``Exchange`` over leases: subclasses move the bytes and set ``lease_window_s``."""

    lease_window_s: float
    reads_arena = True

    @abstractmethod
    def copy_out(self, extent: Extent, out: BufferLike, *, verify: bool) -> bool:
        """One leased value into ``out``; False when its checksum does not hold."""

    @abstractmethod
    def copy_in(self, extent: Extent, value: BufferLike,
                landed: Callable[[int, int], None] | None = None, *,
                ahead: AheadHash | None = None) -> int:
        """One value into its allocated extent; its checksum (finishing ``ahead``, the hash
        the caller began, where given). ``landed(start, size)`` is called as each piece has
        landed."""

    def read(self, ch: Channel, key: bytes, out: BufferLike, *,
             verify: bool) -> ReadResult | Status | None:
        """LEASE, copy, RELEASE."""
        extent = lease(ch, key, window_s=self.lease_window_s)
        if not isinstance(extent, Extent):
            return extent
        try:
            target = RECEIVE_BUFFERS.take(extent.length) if out is None else out
            check_fits(nbytes(target), extent.length, "out")
            ok = copied(self, ch.conn, extent, target, verify=verify)
        finally:
            release(ch, [extent.handle])
        return ReadResult(target, extent.length, ok)

    def write(self, ch: Channel, key: bytes, value: BufferLike, *, group: int,
              flags: int = 0) -> Status:
        """ALLOC, copy, COMMIT. A host value is hashed while the ALLOC is in flight, up to
        its reply (``AheadHash``), and the copy hashes the rest as it goes (a GPU value is
        hashed on its device during the copy). Each piece that has landed is announced with a
        no-reply in-place WRITE, so the server hashes it while the next one is copied and
        COMMIT finds its hash of the arena bytes nearly done; COMMIT compares it with ours: a
        value that changed between our hash and the copy is CHECKSUM_MISMATCH, not stored."""
        ahead = None if is_cuda_tensor(value) else AheadHash(value)
        extent = alloc(ch, key, nbytes(value), group=group, window_s=self.lease_window_s,
                       flags=flags,
                       meanwhile=None if ahead is None else lambda: ahead.until(ch.conn.readable))
        if not isinstance(extent, Extent):
            return extent
        digest = self.copy_in(extent, value,
                              lambda start, size: written(ch, extent.handle, start, size),
                              ahead=ahead)
        return commit(ch, extent.handle, digest)

    def start_reads(self, ch: Channel, keys: Sequence[bytes], outs: Sequence[BufferLike] | None, *,
                    verify: bool) -> list[Extent | Status | None]:
        return lease_many(ch, keys, window_s=self.lease_window_s)

    def end_reads(self, ch: Channel, handles: Sequence[int]) -> None:
        release(ch, handles)

    def start_writes(self, ch: Channel, keys: Sequence[bytes], values: Sequence[BufferLike], *,
                     group: int, flags: int = 0) -> list[Extent | Status]:
        return alloc_many(ch, keys, [nbytes(v) for v in values], group=group, flags=flags,
                          window_s=self.lease_window_s)

    def end_writes(self, ch: Channel, handles: Sequence[int],
                   digests: Sequence[int]) -> list[Status]:
        return commit_many(ch, handles, digests)

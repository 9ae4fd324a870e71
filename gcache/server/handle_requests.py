"""Serving one connection's requests on a handle it holds: WRITE (bytes over the socket, or
written in place by a same-host client and hashed here), READ (a range of a leased value) and
RELEASE (one lease or many).

A handle works only on the connection that obtained it (``conn_holds``): one this connection
does not hold is UNKNOWN_HANDLE, and a WRITE's payload is still consumed so that the stream
stays in sync.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gcache.errors import InvalidRequest
from gcache.frame import FLAG_IN_PLACE, FLAG_NO_REPLY, HANDLE, Header, Status
from gcache.keys import Hasher
from gcache.server.metrics import BYTES_IN
from gcache.server.tier_protocol import Write

if TYPE_CHECKING:
    from gcache.server.handler import ConnectionHandler

log = logging.getLogger(__name__)


def write(handler: ConnectionHandler, h: Header) -> None:
    write = handler.holds.write(h.handle)
    if h.flags & FLAG_IN_PLACE:
        _written_in_place(handler, h, write)
        return
    try:
        if write is None:
            raise InvalidRequest(f"handle {h.handle} is not a write in flight")
        in_time = handler.receive(write, h.offset, h.payload_len)
    except InvalidRequest:
        handler.drain(h.payload_len)
        handler.reply(h, Status.UNKNOWN_HANDLE)
        return
    BYTES_IN.inc(h.payload_len)
    if not in_time:
        log.warning("write.expired peer=%s bytes=%d", handler.conn.peer, h.payload_len)
        handler.holds.drop_write(h.handle)
    handler.reply(h, Status.OK if in_time else Status.UNKNOWN_HANDLE)


def _written_in_place(handler: ConnectionHandler, h: Header, write: Write | None) -> None:
    """A same-host client wrote these bytes itself: hash them now, while it copies on."""
    def hash_them(view: memoryview, hasher: Hasher | None) -> None:
        if hasher is not None:
            hasher.update(view)
    status = Status.UNKNOWN_HANDLE                     # COMMIT will say so too
    try:
        if write is not None:
            write.receive(h.offset, h.length, hash_them)
            BYTES_IN.inc(h.length)
            status = Status.OK
    except InvalidRequest:
        pass
    if not h.flags & FLAG_NO_REPLY:
        handler.reply(h, status)


def read(handler: ConnectionHandler, h: Header) -> None:
    lease = handler.holds.lease(h.handle)
    if lease is None:
        handler.reply(h, Status.UNKNOWN_HANDLE)
        return
    if h.length > handler.config.io_size or h.offset + h.length > lease.entry.length:
        handler.reply(h, Status.BAD_REQUEST)
        return
    try:
        view = lease.view(h.offset, h.length)
    except InvalidRequest:                  # reaped since
        handler.holds.drop_lease(h.handle)
        handler.reply(h, Status.UNKNOWN_HANDLE)
        return
    try:
        handler.reply(h, Status.OK, payload=(view,), offset=h.offset, length=h.length)
    finally:
        view.release()


def release(handler: ConnectionHandler, h: Header) -> None:
    if h.count:
        raw = handler.recv_bytes(h.payload_len)
        handles = [HANDLE.unpack_from(raw, i * HANDLE.size)[0] for i in range(h.count)]
    else:
        handles = [h.handle]
    released = 0
    for handle in handles:
        lease = handler.holds.drop_lease(handle)   # released now, or expired already
        if lease is not None:
            released += lease.release()
    if not h.flags & FLAG_NO_REPLY:
        handler.reply(h, Status.OK if released == len(handles) else Status.UNKNOWN_HANDLE,
                   count=released)

"""Serving one connection's requests over lists of keys: BATCH_GET, BATCH_PUT, BATCH_LEASE,
EXISTS, and LIST (a page of pinned keys).

A batch is answered in one reply whose table has an entry per key, in order. Small values take
the tier's batch path when it has one (``tier_protocol.Batches``): a BATCH_GET copies values up
to one IO in all out under the tier's lock (no lease to take and give back per key), and a
BATCH_PUT of at most one IO of values is received whole and stored together; the rest, and
what only the disk holds, go value by value through leases and writes, as single requests do.
Every key is scoped by the connection's tenant (``tenant_keys``) as it is read, and a LIST
answers only keys of the connection's own scope, as that scope sees them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gcache.errors import NoSpace
from gcache.frame import (
    FLAG_CONTENT_ADDRESSED,
    FLAG_PARENT,
    FLAG_PINNED,
    GET_ENTRY,
    LEASE_ENTRY,
    PUT_ENTRY,
    Header,
    Status,
    encode_keys,
    split_parent,
)
from gcache.keys import MAX_KEY_BYTES, Hasher, checksum
from gcache.server.metrics import BYTES_IN, BYTES_OUT
from gcache.server.request_rules import Refused
from gcache.server.tier_protocol import Batches, Copied, Lease, Listing, Stored

if TYPE_CHECKING:
    from gcache.server.handler import ConnectionHandler

log = logging.getLogger(__name__)

STORED_STATUS = {Stored.OK: Status.OK, Stored.MISMATCH: Status.CHECKSUM_MISMATCH,
                 Stored.NO_SPACE: Status.NO_SPACE}


def batch_get(handler: ConnectionHandler, h: Header) -> None:
    keys = handler.read_keys(h)
    shown = [i for i, k in enumerate(keys) if not handler.mutable.hidden(k)]
    results: list[Copied | Lease | Status] = [Status.NOT_FOUND] * len(keys)
    left = list(range(len(shown)))
    if isinstance(handler.tier, Batches):
        copies, left = handler.tier.read_many([keys[i] for i in shown],
                                              budget_bytes=handler.config.io_size)
        for i, copy in zip(shown, copies, strict=True):
            if copy is not None:
                results[i] = copy
        hits = len(shown) - copies.count(None)
        handler.counted["hits"] += hits
        handler.counted["misses"] += len(keys) - hits - len(left)
    else:
        handler.counted["misses"] += len(keys) - len(shown)
    held: list[Lease] = []
    try:
        for j in left:
            results[shown[j]] = leased = handler.lease_or_status(keys[shown[j]], expires=False)
            if not isinstance(leased, Status):
                held.append(leased)
        table, values = bytearray(), list[bytes | memoryview]()
        for result in results:
            if isinstance(result, Status):
                table += GET_ENTRY.pack(result, 0, 0)
            elif isinstance(result, Copied):
                table += GET_ENTRY.pack(Status.OK, len(result.value), result.checksum)
                values.append(result.value)
            else:
                table += GET_ENTRY.pack(Status.OK, result.entry.length, result.entry.checksum)
                values.append(result.view())
        sent = sum(len(value) for value in values)
        try:
            handler.reply(h, Status.OK, payload=(bytes(table), *values), count=len(keys))
        finally:
            for value in values:
                if isinstance(value, memoryview):
                    value.release()
        BYTES_OUT.inc(sent)
    finally:
        for lease in held:
            handler.holds.give_back(lease)


def batch_put(handler: ConnectionHandler, h: Header) -> None:
    table_len = h.count * PUT_ENTRY.size
    if table_len > h.payload_len:
        raise Refused(Status.BAD_REQUEST, f"{h.count} entries need a {table_len}-byte table")
    table = handler.recv_bytes(table_len)
    entries = [PUT_ENTRY.unpack_from(table, i * PUT_ENTRY.size) for i in range(h.count)]
    keys_len, values_len = sum(e[0] for e in entries), sum(e[1] for e in entries)
    if (any(not 1 <= e[0] <= MAX_KEY_BYTES or e[1] == 0 or e[1] > handler.config.max_value_size
            for e in entries)
            or table_len + keys_len + values_len != h.payload_len):
        raise Refused(Status.BAD_REQUEST, "BATCH_PUT table does not match its payload or limits")
    keys_blob = handler.recv_bytes(keys_len)
    keys, pos = [], 0
    for key_len, _, _ in entries:
        keys.append(bytes(keys_blob[pos:pos + key_len]))
        pos += key_len
    parents: list[bytes] | None = None
    if h.flags & FLAG_PARENT:
        split = [split_parent(k) for k in keys]
        keys, parents = [k for k, _ in split], [p for _, p in split]
    keys = [handler.scope.inner(k) for k in keys]
    if values_len <= handler.config.io_size:
        statuses = _put_received(handler, h, keys, entries, values_len, parents)
    else:
        statuses = bytes(handler.recv_value(key, length, expected, h.group, h.flags,
                                            parents[i] if parents else b"")
                         for i, (key, (_, length, expected))
                         in enumerate(zip(keys, entries, strict=True)))
    BYTES_IN.inc(values_len)
    handler.counted["puts"] += statuses.count(Status.OK)
    handler.counted["refusals"] += statuses.count(Status.NO_SPACE)
    handler.reply(h, Status.OK, payload=(statuses,), count=h.count)


def _put_received(handler: ConnectionHandler, h: Header, keys: list[bytes],
                  entries: list[tuple[int, int, int]], values_len: int,
                  parents: list[bytes] | None) -> bytes:
    """A batch of small values (one IO's worth at most, as a peer may send anyway): one
    receive for them all, then the tier stores them together (``Batches.put_many``), or one by
    one through a write each when it has no batch path."""
    values = memoryview(handler.recv_bytes(values_len))
    content_addressed = bool(h.flags & FLAG_CONTENT_ADDRESSED)
    items, pos = [], 0
    for key, (_, length, expected) in zip(keys, entries, strict=True):
        handler.mutable.written(key, content_addressed=content_addressed, group=h.group)
        items.append((key, values[pos:pos + length], expected))
        pos += length
    pinned = bool(h.flags & FLAG_PINNED)
    tier = handler.tier
    if isinstance(tier, Batches):
        stored = tier.put_many(items, group=h.group, pinned=pinned, parents=parents)
    else:
        stored = [_put_one(handler, key, value, expected, h.group, pinned,
                           parents[i] if parents else b"")
                  for i, (key, value, expected) in enumerate(items)]
    failed = [s for s in stored if s is not Stored.OK]
    if failed:
        log.warning("batch_put.refused peer=%s values=%d checksum_mismatch=%d no_space=%d",
                    handler.conn.peer, len(stored), failed.count(Stored.MISMATCH),
                    failed.count(Stored.NO_SPACE))
    return bytes(STORED_STATUS[s] for s in stored)


def _put_one(handler: ConnectionHandler, key: bytes, value: memoryview, expected: int,
             group: int, pinned: bool, parent: bytes) -> Stored:
    """One value received whole, through a write (a tier without a batch path)."""
    if checksum(value) != expected:
        return Stored.MISMATCH
    try:
        write = handler.tier.alloc(key, len(value), expires=False, group=group, pinned=pinned,
                                   parent=parent)
    except NoSpace as exc:                          # no room, or the pin budget spent
        log.warning("batch_put.no_space bytes=%d reason=%s", len(value), exc)
        return Stored.NO_SPACE

    def copy(target: memoryview, hasher: Hasher | None) -> None:
        target[:] = value
        if hasher is not None:
            hasher.update(target)
    write.receive(0, len(value), copy)
    return Stored.OK if write.commit(expected) else Stored.NO_SPACE


def batch_lease(handler: ConnectionHandler, h: Header) -> None:
    table = bytearray()
    leased_bytes = 0
    for k in handler.read_keys(h):
        leased = handler.lease_or_status(k, expires=True)
        if isinstance(leased, Status):
            table += LEASE_ENTRY.pack(leased, 0, 0, 0, 0)
            continue
        entry = leased.entry
        leased_bytes += entry.length
        table += LEASE_ENTRY.pack(Status.OK, leased.handle, entry.value, entry.length,
                                  entry.checksum)
    handler.reply(h, Status.OK, payload=(bytes(table),), count=h.count)
    BYTES_OUT.inc(leased_bytes)


def exists(handler: ConnectionHandler, h: Header) -> None:
    keys = handler.read_keys(h)
    present = bytes(1 if handler.tier.exists(k) and not handler.mutable.hidden(k) else 0
                    for k in keys)
    handler.reply(h, Status.OK, payload=(present,), count=len(keys))


def list_pinned(handler: ConnectionHandler, h: Header, prefix: bytes) -> None:
    """A page of the pinned keys under ``prefix``: those a read would find (a hidden one may be
    older than a put elsewhere, ``mutable_keys``)."""
    after = bytes(handler.recv_bytes(h.payload_len))
    scope = handler.scope
    after = scope.inner(after) if after else b""
    keys: list[bytes] = []
    tier = handler.tier
    while isinstance(tier, Listing) and len(keys) < h.count:   # a short page is the last
        page = tier.pinned_keys(prefix, after=after, limit=h.count - len(keys))
        if not page:
            break
        keys += (scope.outer(k) for k in page
                 if scope.owns(k) and not handler.mutable.hidden(k))
        after = page[-1]
    handler.reply(h, Status.OK, payload=(encode_keys(keys),), count=len(keys))

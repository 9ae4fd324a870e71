"""Serving one client connection: read a frame, act on the hot tier, send one reply.

With a cluster token set, a connection must answer HELLO's nonce with AUTH (an HMAC of it)
before any other request; the arena's descriptor is only ever sent in the reply to a successful
AUTH (or to HELLO when the server has no token). The stream stays in sync or the connection is
dropped: a request whose payload cannot be
consumed safely (a bad header, a payload larger than the limits) gets an error reply and the
connection is closed; a request that is well-framed but wrong (unknown handle, no space) gets an
error reply and the connection lives on. Whatever a connection leaves behind when it goes —
writes never committed, leases never released — is aborted and released here, so a client that
disconnects halfway through a write leaves nothing visible and pins nothing.

What a peer can cost the server is what it sent: a handle works only on the connection that
obtained it; an unauthenticated connection has ``auth_timeout_s`` to AUTH; a payload must arrive
at ``min_transfer_rate`` (after one IO timeout of grace) or the connection is cut off and its
space freed; key lists and tables are received into buffers that grow with the bytes that
arrive, never allocated at the size a header declares.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from collections.abc import Callable, Mapping

from gcache.config import ServerConfig
from gcache.errors import ChecksumMismatch, InvalidRequest, NoSpace, ProtocolError, TransportError
from gcache.frame import (
    FLAG_CHECKSUM_TRAILS,
    FLAG_CONTENT_ADDRESSED,
    FLAG_IN_PLACE,
    FLAG_NO_REPLY,
    FLAG_PARENT,
    FLAG_PINNED,
    GET_ENTRY,
    HANDLE,
    HEADER_SIZE,
    LEASE_ENTRY,
    PUT_ENTRY,
    TRAILER,
    Header,
    Op,
    Status,
    auth_proof,
    decode_keys,
    encode_keys,
    split_parent,
    unpack_header,
)
from gcache.keys import MAX_KEY_BYTES
from gcache.server.metrics import BYTES_IN, BYTES_OUT, OP_TIMERS
from gcache.server.mutable_keys import MutableKeys
from gcache.server.request_rules import Refused, check_request
from gcache.server.tier import Copied, Entry, Stored
from gcache.server.tier_protocol import Tier
from gcache.transport.stream import READ_AHEAD, StreamConnection

log = logging.getLogger(__name__)

STORED_STATUS = {Stored.OK: Status.OK, Stored.MISMATCH: Status.CHECKSUM_MISMATCH,
                 Stored.NO_SPACE: Status.NO_SPACE}

class ConnectionHandler:
    """Serves requests on one connection until it closes or ``is_stopping()``."""

    def __init__(self, conn: StreamConnection, tier: Tier, config: ServerConfig, *,
                 stat_extra: Callable[[], Mapping[str, object]], is_stopping: Callable[[], bool],
                 hello: Mapping[str, object], arena_fd: int | None,
                 mutable: MutableKeys | None = None) -> None:
        self.conn = conn
        self.mutable = mutable or MutableKeys(None, tier.delete)
        self._is_stopping = is_stopping
        self._hello = json.dumps(hello).encode()
        self._arena_fd = arena_fd           # set on Unix connections: HELLO passes the arena
        self._nonce = os.urandom(16)
        self._authenticated = config.token is None
        self.opened_s = time.monotonic()
        self._auth_deadline_s = self.opened_s + config.auth_timeout_s
        self.tier = tier
        self.config = config
        self.io_timeout_s = max(config.io_timeout_s, config.lease_ttl_s)
        self._stat_extra = stat_extra
        self._handles: set[int] = set()     # pins this connection holds
        self._max_payload = (max(config.max_value_size, config.memory)
                             + 65535 * (PUT_ENTRY.size + MAX_KEY_BYTES))
        self._scratch: memoryview | None = None     # made on the first drain: most never do
        self._dispatch: dict[Op, Callable[[Header, bytes], None]] = {
            Op.PUT: self._put, Op.GET: self._get, Op.ALLOC: self._alloc, Op.WRITE: self._write,
            Op.COMMIT: self._commit, Op.LEASE: self._lease, Op.READ: self._read,
            Op.RELEASE: self._release, Op.EXISTS: self._exists, Op.DELETE: self._delete,
            Op.STAT: self._stat, Op.BATCH_GET: self._batch_get, Op.BATCH_PUT: self._batch_put,
            Op.HELLO: self._hello_reply, Op.BATCH_LEASE: self._batch_lease, Op.AUTH: self._auth,
            Op.LIST: self._list,
        }

    @property
    def authenticated(self) -> bool:
        return self._authenticated

    def serve(self) -> None:
        try:
            while not self._is_stopping():
                raw = bytearray(HEADER_SIZE)
                timeout_s = self.io_timeout_s
                if not self._authenticated:
                    timeout_s = self._auth_deadline_s - time.monotonic()
                    if timeout_s <= 0:
                        log.warning("conn.auth_timeout peer=%s", self.conn.peer)
                        return
                try:
                    # One timeout for every IO on this socket (no per-request setsockopt); an
                    # idle client just waits through it, a half-sent header is a stall.
                    if not self.conn.recv_into(memoryview(raw), timeout_s=timeout_s,
                                               idle_ok=True,
                                               deadline_s=None if self._authenticated
                                               else self._auth_deadline_s):
                        continue
                except TransportError:
                    return                                     # client went away or stalled
                header = None
                started_s = time.perf_counter()
                try:
                    header = unpack_header(raw, max_payload=self._max_payload)
                    check_request(header, max_value_size=self.config.max_value_size)
                    if not self._authenticated and header.op not in (Op.HELLO, Op.AUTH):
                        raise Refused(Status.AUTH_REQUIRED, f"{header.op.name} before AUTH")
                    key = bytes(self.conn.recv_exact(header.key_len, timeout_s=self.io_timeout_s,
                                                     deadline_s=self._deadline_s(header.key_len)))
                    self._dispatch[header.op](header, key)
                    OP_TIMERS[header.op].observe(time.perf_counter() - started_s)
                except (ProtocolError, Refused) as exc:
                    status = exc.status if isinstance(exc, Refused) else Status.BAD_REQUEST
                    log.warning("conn.drop peer=%s reason=%s", self.conn.peer, exc)
                    self._reply(header, status, fatal=True)
                    return
        except TransportError as exc:
            log.info("conn.lost peer=%s reason=%s", self.conn.peer, exc)
        except Exception:
            log.exception("conn.crash peer=%s", self.conn.peer)
        finally:
            self._cleanup()

    # ---- replies ------------------------------------------------------------------------------

    def _reply(self, request: Header | None, status: Status, *, fatal: bool = False,
               payload: tuple[bytes | memoryview, ...] = (), **fields: int) -> None:
        op = request.op if request is not None else Op.STAT
        request_id = request.request_id if request is not None else 0
        size = sum(len(p) for p in payload)
        header = Header(op, request_id, status, payload_len=size, **fields)
        try:
            self.conn.send((header.pack(), *payload), timeout_s=self.io_timeout_s,
                           deadline_s=self._deadline_s(size))
        except TransportError:
            if not fatal:
                raise

    def _deadline_s(self, n_bytes: int) -> float:
        """When ``n_bytes`` must have moved: one IO timeout of grace, then the minimum rate; and
        never later than the authentication deadline while there is one."""
        deadline_s = time.monotonic() + self.io_timeout_s + n_bytes / self.config.min_transfer_rate
        return deadline_s if self._authenticated else min(deadline_s, self._auth_deadline_s)

    def _recv_bytes(self, n_bytes: int) -> bytearray:
        """A peer-declared payload (key lists, tables, proofs), grown as its bytes arrive."""
        return self.conn.recv_growing(n_bytes, timeout_s=self.io_timeout_s,
                                      deadline_s=self._deadline_s(n_bytes))

    def _drain(self, n_bytes: int) -> None:
        """Consume a payload we will not store, to keep the stream in sync."""
        if self._scratch is None:
            self._scratch = memoryview(bytearray(min(self.config.io_size, 1 << 20)))
        deadline_s = self._deadline_s(n_bytes)
        while n_bytes:
            chunk = min(n_bytes, len(self._scratch))
            self.conn.recv_into(self._scratch[:chunk], timeout_s=self.io_timeout_s,
                                deadline_s=deadline_s)
            n_bytes -= chunk

    def _recv_value(self, key: bytes, length: int, expected: int | None, group: int,
                    flags: int, parent: bytes = b"") -> Status:
        """Receive a value into a fresh extent and commit it; the status for the reply.

        ``expected`` None means the checksum trails the value on the wire. ``group``: the
        request's ``group`` field, the placement-group hash (0: none), kept for a drain.
        ``parent``: the key it hangs from (``FLAG_PARENT``), kept in its record.
        """
        trailer = TRAILER.size if expected is None else 0
        # Memory is claimed once the payload flows: a peer that sent a header and trickles
        # pinned a span for the transfer's whole deadline (three such peers starved a 32 MiB
        # arena of old spans, and writes evicted values acknowledged a moment before).
        self.conn.read_ahead(length + trailer, timeout_s=self.io_timeout_s,
                             deadline_s=self._deadline_s(min(length + trailer, READ_AHEAD)))
        self.mutable.written(key, content_addressed=bool(flags & FLAG_CONTENT_ADDRESSED),
                             group=group)
        try:
            handle, _, target = self.tier.alloc(key, length, expires=False, group=group,
                                                pinned=bool(flags & FLAG_PINNED), parent=parent)
        except NoSpace as exc:
            log.warning("put.no_space bytes=%d reason=%s", length, exc)
            self._drain(length + trailer)
            return Status.NO_SPACE
        target.release()
        self._handles.add(handle)
        self._recv_extent(handle, 0, length)
        if expected is None:
            (expected,) = TRAILER.unpack(self.conn.recv_exact(
                trailer, timeout_s=self.io_timeout_s, deadline_s=self._deadline_s(trailer)))
        self._handles.discard(handle)
        return self._commit_status(handle, expected)

    def _recv_extent(self, handle: int, offset: int, n_bytes: int) -> bool:
        """Receive ``n_bytes`` of a pending write; raises InvalidRequest before reading any.
        False when the write's TTL passed during the receive: it no longer exists."""
        target, hasher = self.tier.write_target(handle, offset, n_bytes)
        try:
            self.conn.recv_into(target, timeout_s=self.io_timeout_s, hasher=hasher,
                                deadline_s=self._deadline_s(n_bytes))
        finally:
            target.release()
            in_time = self.tier.write_done(handle)
        return in_time

    def _commit_status(self, handle: int, expected: int) -> Status:
        try:
            self.tier.commit(handle, expected)
            return Status.OK
        except ChecksumMismatch as exc:
            log.error("put.checksum_mismatch peer=%s %s", self.conn.peer, exc)
            return Status.CHECKSUM_MISMATCH
        except InvalidRequest:
            return Status.UNKNOWN_HANDLE

    # ---- operations ---------------------------------------------------------------------------

    def _put(self, h: Header, key: bytes) -> None:
        trails = bool(h.flags & FLAG_CHECKSUM_TRAILS)
        length = h.payload_len - TRAILER.size if trails else h.payload_len
        key, parent = split_parent(key) if h.flags & FLAG_PARENT else (key, b"")
        status = self._recv_value(key, length, None if trails else h.checksum, h.group, h.flags,
                                  parent)
        BYTES_IN.inc(length)
        self._reply(h, status)

    def _lease_or_status(self, key: bytes, *,
                         expires: bool) -> tuple[int, Entry, memoryview] | Status:
        """A lease of ``key``, or the status a reader gets instead: NOT_FOUND when it is in no
        tier or this server hides it (it may be older than a put elsewhere: ``mutable_keys``),
        NO_SPACE when it is on disk and memory has no room to promote it now."""
        if self.mutable.hidden(key):
            return Status.NOT_FOUND
        try:
            leased = self.tier.lease(key, expires=expires)
        except NoSpace:
            return Status.NO_SPACE
        return Status.NOT_FOUND if leased is None else leased

    def _get(self, h: Header, key: bytes) -> None:
        leased = self._lease_or_status(key, expires=False)
        if isinstance(leased, Status):
            self._reply(h, leased)
            return
        handle, entry, view = leased
        try:
            self._reply(h, Status.OK, payload=(view,), length=entry.length,
                        checksum=entry.checksum)
            BYTES_OUT.inc(entry.length)
        finally:
            view.release()
            self.tier.release(handle)

    def _alloc(self, h: Header, key: bytes) -> None:
        if h.length == 0 or h.length > self.config.max_value_size:
            self._reply(h, Status.TOO_LARGE if h.length else Status.BAD_REQUEST)
            return
        key, parent = split_parent(key) if h.flags & FLAG_PARENT else (key, b"")
        self.mutable.written(key, content_addressed=bool(h.flags & FLAG_CONTENT_ADDRESSED),
                             group=h.group)
        try:
            handle, offset, target = self.tier.alloc(key, h.length, group=h.group,
                                                     pinned=bool(h.flags & FLAG_PINNED),
                                                     parent=parent)
        except NoSpace:
            self._reply(h, Status.NO_SPACE)
            return
        target.release()
        self._handles.add(handle)
        self._reply(h, Status.OK, handle=handle, length=h.length, offset=offset)

    def _owned(self, handle: int) -> int:
        """``handle`` if this connection obtained it, else 0 (which no pin has): handles are
        not capabilities to pass around."""
        return handle if handle in self._handles else 0

    def _write(self, h: Header, key: bytes) -> None:
        if h.flags & FLAG_IN_PLACE:
            self._written_in_place(h)
            return
        try:
            in_time = self._recv_extent(self._owned(h.handle), h.offset, h.payload_len)
        except InvalidRequest:
            self._drain(h.payload_len)
            self._reply(h, Status.UNKNOWN_HANDLE)
            return
        BYTES_IN.inc(h.payload_len)
        if not in_time:
            log.warning("write.expired peer=%s bytes=%d", self.conn.peer, h.payload_len)
            self._handles.discard(h.handle)
        self._reply(h, Status.OK if in_time else Status.UNKNOWN_HANDLE)

    def _written_in_place(self, h: Header) -> None:
        """A same-host client wrote these bytes itself: hash them now, while it copies on."""
        try:
            view, hasher = self.tier.write_target(self._owned(h.handle), h.offset, h.length)
        except InvalidRequest:
            status = Status.UNKNOWN_HANDLE                 # COMMIT will say so too
        else:
            if hasher is not None:
                hasher.update(view)
            view.release()
            self.tier.write_done(h.handle)
            BYTES_IN.inc(h.length)
            status = Status.OK
        if not h.flags & FLAG_NO_REPLY:
            self._reply(h, status)

    def _commit(self, h: Header, key: bytes) -> None:
        status = self._commit_status(self._owned(h.handle), h.checksum)
        self._handles.discard(h.handle)        # committed, refused or expired: done with it
        self._reply(h, status)

    def _lease(self, h: Header, key: bytes) -> None:
        leased = self._lease_or_status(key, expires=True)
        if isinstance(leased, Status):
            self._reply(h, leased)
            return
        handle, entry, view = leased
        view.release()
        self._handles.add(handle)
        self._reply(h, Status.OK, handle=handle, offset=entry.value, length=entry.length,
                    checksum=entry.checksum)
        BYTES_OUT.inc(entry.length)          # the client copies the value itself

    def _read(self, h: Header, key: bytes) -> None:
        try:
            entry = self.tier.leased(self._owned(h.handle))
        except InvalidRequest:
            self._reply(h, Status.UNKNOWN_HANDLE)
            return
        if h.length > self.config.io_size or h.offset + h.length > entry.length:
            self._reply(h, Status.BAD_REQUEST)
            return
        view = self.tier.read_view(entry, h.offset, h.length)
        try:
            self._reply(h, Status.OK, payload=(view,), offset=h.offset, length=h.length)
        finally:
            view.release()

    def _release(self, h: Header, key: bytes) -> None:
        if h.count:
            raw = self._recv_bytes(h.payload_len)
            handles = [HANDLE.unpack_from(raw, i * HANDLE.size)[0] for i in range(h.count)]
        else:
            handles = [h.handle]
        released = 0
        for handle in handles:
            if handle in self._handles:
                released += self.tier.release(handle)
                self._handles.discard(handle)  # released now, or expired already
        if not h.flags & FLAG_NO_REPLY:
            self._reply(h, Status.OK if released == len(handles) else Status.UNKNOWN_HANDLE,
                        count=released)

    def _read_keys(self, h: Header) -> list[bytes]:
        return decode_keys(self._recv_bytes(h.payload_len), h.count)

    def _exists(self, h: Header, key: bytes) -> None:
        keys = self._read_keys(h)
        present = bytes(1 if self.tier.exists(k) and not self.mutable.hidden(k) else 0
                        for k in keys)
        self._reply(h, Status.OK, payload=(present,), count=len(keys))

    def _delete(self, h: Header, key: bytes) -> None:
        self._reply(h, Status.OK if self.tier.delete(key) else Status.NOT_FOUND)

    def _list(self, h: Header, key: bytes) -> None:
        """A page of the pinned keys under the prefix ``key``: those a read would find (a
        hidden one may be older than a put elsewhere, ``mutable_keys``)."""
        after = bytes(self._recv_bytes(h.payload_len))
        keys: list[bytes] = []
        while len(keys) < h.count:          # a short page is the last: skip hidden ones here
            page = self.tier.pinned_keys(key, after=after, limit=h.count - len(keys))
            if not page:
                break
            keys += (k for k in page if not self.mutable.hidden(k))
            after = page[-1]
        self._reply(h, Status.OK, payload=(encode_keys(keys),), count=len(keys))

    def _stat(self, h: Header, key: bytes) -> None:
        stats = {"tier": self.tier.stats(), **self._stat_extra()}
        self._reply(h, Status.OK, payload=(json.dumps(stats).encode(),))

    def _batch_get(self, h: Header, key: bytes) -> None:
        """Values up to one IO in all are copied out under the tier's lock (``read_many``: no
        lease to take and give back per key); the rest, and what only the disk holds, are
        leased and sent from the arena."""
        keys = self._read_keys(h)
        shown = [i for i, k in enumerate(keys) if not self.mutable.hidden(k)]
        copies, left = self.tier.read_many([keys[i] for i in shown],
                                           budget_bytes=self.config.io_size)
        results: list[Copied | tuple[int, Entry, memoryview] | Status] = \
            [Status.NOT_FOUND] * len(keys)
        for i, copy in zip(shown, copies, strict=True):
            if copy is not None:
                results[i] = copy
        held = []
        try:
            for j in left:
                results[shown[j]] = leased = self._lease_or_status(keys[shown[j]], expires=False)
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
                    table += GET_ENTRY.pack(Status.OK, result[1].length, result[1].checksum)
                    values.append(result[2])
            self._reply(h, Status.OK, payload=(bytes(table), *values), count=len(keys))
            BYTES_OUT.inc(sum(len(value) for value in values))
        finally:
            for handle, _, view in held:
                view.release()
                self.tier.release(handle)

    def _batch_put(self, h: Header, key: bytes) -> None:
        table_len = h.count * PUT_ENTRY.size
        if table_len > h.payload_len:
            raise Refused(Status.BAD_REQUEST, f"{h.count} entries need a {table_len}-byte table")
        table = self._recv_bytes(table_len)
        entries = [PUT_ENTRY.unpack_from(table, i * PUT_ENTRY.size) for i in range(h.count)]
        keys_len, values_len = sum(e[0] for e in entries), sum(e[1] for e in entries)
        if (any(not 1 <= e[0] <= MAX_KEY_BYTES or e[1] == 0 or e[1] > self.config.max_value_size
                for e in entries)
                or table_len + keys_len + values_len != h.payload_len):
            raise Refused(Status.BAD_REQUEST,
                          "BATCH_PUT table does not match its payload or limits")
        keys_blob = self._recv_bytes(keys_len)
        keys, pos = [], 0
        for key_len, _, _ in entries:
            keys.append(bytes(keys_blob[pos:pos + key_len]))
            pos += key_len
        parents: list[bytes] | None = None
        if h.flags & FLAG_PARENT:
            split = [split_parent(k) for k in keys]
            keys, parents = [k for k, _ in split], [p for _, p in split]
        if values_len <= self.config.io_size:
            statuses = self._put_received(h, keys, entries, values_len, parents)
        else:
            statuses = bytes(self._recv_value(key, length, expected, h.group, h.flags,
                                              parents[i] if parents else b"")
                             for i, (key, (_, length, expected))
                             in enumerate(zip(keys, entries, strict=True)))
        BYTES_IN.inc(values_len)
        self._reply(h, Status.OK, payload=(statuses,), count=h.count)

    def _put_received(self, h: Header, keys: list[bytes], entries: list[tuple[int, int, int]],
                      values_len: int, parents: list[bytes] | None) -> bytes:
        """A batch of small values (one IO's worth at most, as a peer may send anyway): one
        receive for them all, then the tier stores them together (``Tier.put_many``) instead
        of an ALLOC, a receive and a COMMIT each."""
        values = memoryview(self._recv_bytes(values_len))
        content_addressed = bool(h.flags & FLAG_CONTENT_ADDRESSED)
        items, pos = [], 0
        for key, (_, length, expected) in zip(keys, entries, strict=True):
            self.mutable.written(key, content_addressed=content_addressed, group=h.group)
            items.append((key, values[pos:pos + length], expected))
            pos += length
        stored = self.tier.put_many(items, group=h.group, pinned=bool(h.flags & FLAG_PINNED),
                                    parents=parents)
        failed = [s for s in stored if s is not Stored.OK]
        if failed:
            log.warning("batch_put.refused peer=%s values=%d checksum_mismatch=%d no_space=%d",
                        self.conn.peer, len(stored), failed.count(Stored.MISMATCH),
                        failed.count(Stored.NO_SPACE))
        return bytes(STORED_STATUS[s] for s in stored)

    def _hello_reply(self, h: Header, key: bytes) -> None:
        """Server facts (and, on a Unix socket, the arena) — or, before AUTH, a nonce."""
        if not self._authenticated:
            self._reply(h, Status.AUTH_REQUIRED, payload=(self._nonce,))
            return
        reply = Header(h.op, h.request_id, Status.OK, payload_len=len(self._hello))
        if self._arena_fd is None:
            self.conn.send((reply.pack(), self._hello), timeout_s=self.io_timeout_s)
        else:
            self.conn.send_fds((reply.pack(), self._hello), [self._arena_fd],
                               timeout_s=self.io_timeout_s)

    def _auth(self, h: Header, key: bytes) -> None:
        proof = bytes(self._recv_bytes(h.payload_len))
        token = self.config.token
        if token is not None and not hmac.compare_digest(proof, auth_proof(token, self._nonce)):
            log.warning("conn.auth_failed peer=%s", self.conn.peer)
            raise Refused(Status.AUTH_FAILED, "wrong cluster token")
        self._authenticated = True
        self._hello_reply(h, key)

    def _batch_lease(self, h: Header, key: bytes) -> None:
        table = bytearray()
        leased_bytes = 0
        for k in self._read_keys(h):
            leased = self._lease_or_status(k, expires=True)
            if isinstance(leased, Status):
                table += LEASE_ENTRY.pack(leased, 0, 0, 0, 0)
                continue
            handle, entry, view = leased
            view.release()
            self._handles.add(handle)
            leased_bytes += entry.length
            table += LEASE_ENTRY.pack(Status.OK, handle, entry.value, entry.length,
                                      entry.checksum)
        self._reply(h, Status.OK, payload=(bytes(table),), count=h.count)
        BYTES_OUT.inc(leased_bytes)

    def _cleanup(self) -> None:
        for handle in self._handles:
            if not self.tier.release(handle):
                self.tier.abort(handle)
        self._handles.clear()
        self.conn.close()



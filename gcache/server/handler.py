"""Serving one client connection: read a frame, act on the tier, send one reply.

With a cluster token set, a connection must answer HELLO's nonce with AUTH (an HMAC of it)
before any other request; the arena's descriptor is only ever sent in the reply to a successful
AUTH (or to HELLO when the server has no token), never to a tenant (``conn_auth``). Every key
a request names is scoped by what the connection proved as soon as it is read off the wire
(``tenant_keys.Scope``): nothing past this boundary sees a key a tenant sent as it sent it.
The stream stays in sync or the connection is dropped: a request whose payload cannot be
consumed safely (a bad header, a payload larger than the limits) gets an error reply and the
connection is closed; a request that is well-framed but wrong (unknown handle, no space) gets
an error reply and the connection lives on.

What a peer can cost the server is what it sent: a handle works only on the connection that
obtained it, and whatever a connection still holds when it goes is given back
(``conn_holds``); the bytes it holds are capped; an unauthenticated connection has
``auth_timeout_s`` to AUTH; a payload must arrive at ``min_transfer_rate`` (after one IO timeout
of grace, none while room is short: ``transfers``) or the connection is cut off and its room
freed; key lists and tables are received into buffers that grow with the bytes that arrive.
Requests over lists of keys (``BATCH_*``, ``EXISTS``, ``LIST``) are served in ``batch_requests``,
requests on a handle (WRITE, READ, RELEASE) in ``handle_requests``.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Callable, Mapping

from gcache.config import ServerConfig
from gcache.errors import ChecksumMismatch, InvalidRequest, ProtocolError, TransportError
from gcache.frame import (
    FLAG_CHECKSUM_TRAILS,
    FLAG_CONTENT_ADDRESSED,
    FLAG_PARENT,
    FLAG_PINNED,
    HEADER_SIZE,
    PUT_ENTRY,
    TRAILER,
    Header,
    Op,
    Status,
    decode_keys,
    split_parent,
    unpack_header,
)
from gcache.keys import MAX_KEY_BYTES, Hasher
from gcache.server import batch_requests, handle_requests
from gcache.server.conn_auth import ConnectionAuth, facts_for
from gcache.server.conn_holds import ConnectionHolds
from gcache.server.metrics import BYTES_IN, BYTES_OUT, OP_TIMERS
from gcache.server.mutable_keys import MutableKeys
from gcache.server.prefetch_requests import prefetch
from gcache.server.request_rules import Refused, check_request
from gcache.server.tenant_table import Tenants
from gcache.server.tier_protocol import Lease, Tier, Write
from gcache.server.transfers import Transfers
from gcache.transport.stream import READ_AHEAD, StreamConnection

log = logging.getLogger(__name__)

SCOPED_KEY_OPS = frozenset({Op.PUT, Op.GET, Op.ALLOC, Op.LEASE, Op.DELETE, Op.LIST})


class ConnectionHandler:
    """Serves requests on one connection until it closes or ``is_stopping()``."""

    def __init__(self, conn: StreamConnection, tier: Tier, config: ServerConfig, *,
                 stat_extra: Callable[[int], Mapping[str, object]],
                 is_stopping: Callable[[], bool],
                 hello: Mapping[str, object], arena_fd: int | None,
                 mutable: MutableKeys | None = None, transfers: Transfers | None = None,
                 tenants: Tenants | None = None) -> None:
        self.conn = conn
        self.mutable = mutable or MutableKeys(None, tier.delete)
        self.transfers = transfers or Transfers(config.min_transfer_rate)
        self._is_stopping = is_stopping
        self._hello = hello
        self._arena_fd = arena_fd           # set on Unix connections: HELLO passes the arena
        self.tenants = tenants or Tenants()
        self.auth = ConnectionAuth(config.token, self.tenants, conn.peer)
        self.scope = self.auth.scope
        self.counted: collections.Counter[str] = collections.Counter()   # this request's
        self.opened_s = time.monotonic()
        self._auth_deadline_s = self.opened_s + config.auth_timeout_s
        self.tier = tier
        self.config = config
        self.io_timeout_s = max(config.io_timeout_s, config.lease_ttl_s)
        self._stat_extra = stat_extra
        self.holds = ConnectionHolds(tier, max(config.io_size,
                                               int(tier.arena.size_bytes * config.max_held_share)),
                                     conn.peer)
        self._max_payload = (max(config.max_value_size, config.memory)
                             + 65535 * (PUT_ENTRY.size + MAX_KEY_BYTES))
        self._scratch: memoryview | None = None     # made on the first drain: most never do
        self._dispatch: dict[Op, Callable[[Header, bytes], None]] = {
            Op.PUT: self._put, Op.GET: self._get, Op.ALLOC: self._alloc,
            Op.WRITE: lambda h, _: handle_requests.write(self, h),
            Op.COMMIT: self._commit, Op.LEASE: self._lease,
            Op.READ: lambda h, _: handle_requests.read(self, h),
            Op.RELEASE: lambda h, _: handle_requests.release(self, h),
            Op.DELETE: self._delete, Op.STAT: self._stat,
            Op.HELLO: self._hello_reply, Op.AUTH: self._auth,
            Op.EXISTS: lambda h, _: batch_requests.exists(self, h),
            Op.LIST: lambda h, key: batch_requests.list_pinned(self, h, key),
            Op.BATCH_GET: lambda h, _: batch_requests.batch_get(self, h),
            Op.BATCH_PUT: lambda h, _: batch_requests.batch_put(self, h),
            Op.BATCH_LEASE: lambda h, _: batch_requests.batch_lease(self, h),
            Op.PREFETCH: lambda h, _: prefetch(self, h),
        }

    @property
    def authenticated(self) -> bool:
        return self.auth.authenticated

    def serve(self) -> None:
        try:
            while not self._is_stopping():
                raw = bytearray(HEADER_SIZE)
                timeout_s = self.io_timeout_s
                if not self.authenticated:
                    timeout_s = self._auth_deadline_s - time.monotonic()
                    if timeout_s <= 0:
                        log.warning("conn.auth_timeout peer=%s", self.conn.peer)
                        return
                try:
                    # One timeout for every IO on this socket (no per-request setsockopt); an
                    # idle client just waits through it, a half-sent header is a stall.
                    if not self.conn.recv_into(memoryview(raw), timeout_s=timeout_s,
                                               idle_ok=True,
                                               deadline_s=None if self.authenticated
                                               else self._auth_deadline_s):
                        continue
                except TransportError:
                    return                                     # client went away or stalled
                header = None
                started_s = time.perf_counter()
                try:
                    header = unpack_header(raw, max_payload=self._max_payload)
                    check_request(header, max_value_size=self.config.max_value_size)
                    if not self.authenticated and header.op not in (Op.HELLO, Op.AUTH):
                        raise Refused(Status.AUTH_REQUIRED, f"{header.op.name} before AUTH")
                    if not self.auth.still_valid():
                        raise Refused(Status.AUTH_FAILED, "this connection's tenant was "
                                      "revoked or removed")
                    key = bytes(self.conn.recv_exact(header.key_len, timeout_s=self.io_timeout_s,
                                                     deadline_s=self.deadline_s(header.key_len)))
                    if header.op in SCOPED_KEY_OPS:
                        key = self.scope.key_field(key, has_parent=bool(
                            header.flags & FLAG_PARENT) and header.op in (Op.PUT, Op.ALLOC))
                    self._dispatch[header.op](header, key)
                    OP_TIMERS[header.op].observe(time.perf_counter() - started_s)
                    if self.counted:
                        self.tenants.count(self.scope.tenant_id, **self.counted)
                        self.counted.clear()
                except (ProtocolError, Refused) as exc:
                    status = exc.status if isinstance(exc, Refused) else Status.BAD_REQUEST
                    log.warning("conn.drop peer=%s reason=%s", self.conn.peer, exc)
                    self.reply(header, status, fatal=True)
                    return
        except TransportError as exc:
            log.info("conn.lost peer=%s reason=%s", self.conn.peer, exc)
        except Exception:
            log.exception("conn.crash peer=%s", self.conn.peer)
        finally:
            self.holds.release_all()
            self.conn.close()

    # ---- replies and receives -----------------------------------------------------------------

    def reply(self, request: Header | None, status: Status, *, fatal: bool = False,
              payload: tuple[bytes | memoryview, ...] = (), **fields: int) -> None:
        op = request.op if request is not None else Op.STAT
        request_id = request.request_id if request is not None else 0
        size = sum(len(p) for p in payload)
        if status == Status.NO_SPACE:
            self.counted["refusals"] += 1
        header = Header(op, request_id, status, payload_len=size, **fields)
        try:
            self.conn.send((header.pack(), *payload), timeout_s=self.io_timeout_s,
                           deadline_s=self.deadline_s(size))
        except TransportError:
            if not fatal:
                raise

    def deadline_s(self, n_bytes: int) -> float:
        """When ``n_bytes`` must have moved: one IO timeout of grace, then the minimum rate; and
        never later than the authentication deadline while there is one."""
        deadline_s = time.monotonic() + self.io_timeout_s + n_bytes / self.config.min_transfer_rate
        return deadline_s if self.authenticated else min(deadline_s, self._auth_deadline_s)

    def recv_bytes(self, n_bytes: int) -> bytearray:
        """A peer-declared payload (key lists, tables, proofs), grown as its bytes arrive."""
        return self.conn.recv_growing(n_bytes, timeout_s=self.io_timeout_s,
                                      deadline_s=self.deadline_s(n_bytes))

    def read_keys(self, h: Header) -> list[bytes]:
        """A request's key list, each key scoped (``tenant_keys.Scope``)."""
        inner = self.scope.inner
        return [inner(k) for k in decode_keys(self.recv_bytes(h.payload_len), h.count)]

    def drain(self, n_bytes: int) -> None:
        """Consume a payload we will not store, to keep the stream in sync."""
        if self._scratch is None:
            self._scratch = memoryview(bytearray(min(self.config.io_size, 1 << 20)))
        deadline_s = self.deadline_s(n_bytes)
        while n_bytes:
            chunk = min(n_bytes, len(self._scratch))
            self.conn.recv_into(self._scratch[:chunk], timeout_s=self.io_timeout_s,
                                deadline_s=deadline_s)
            n_bytes -= chunk

    def recv_value(self, key: bytes, length: int, expected: int | None, group: int,
                   flags: int, parent: bytes = b"") -> Status:
        """Receive a value into a fresh extent and commit it; the status for the reply.
        ``expected`` None: the checksum trails the value on the wire. ``group``: the
        placement-group hash (0: none). ``parent``: the key it hangs from (``FLAG_PARENT``)."""
        trailer = TRAILER.size if expected is None else 0
        # Room is claimed once the payload flows: a peer that sends a header and trickles
        # holds nothing while it is cut off.
        self.conn.read_ahead(length + trailer, timeout_s=self.io_timeout_s,
                             deadline_s=self.deadline_s(min(length + trailer, READ_AHEAD)))
        self.mutable.written(key, content_addressed=bool(flags & FLAG_CONTENT_ADDRESSED),
                             group=group)
        write = self.holds.claim(key, length, expires=False, group=group,
                                 pinned=bool(flags & FLAG_PINNED), parent=parent)
        if write is None:
            self.drain(length + trailer)
            return Status.NO_SPACE
        self.receive(write, 0, length)
        if expected is None:
            (expected,) = TRAILER.unpack(self.conn.recv_exact(
                trailer, timeout_s=self.io_timeout_s, deadline_s=self.deadline_s(trailer)))
        return self._commit_status(write.handle, expected)

    def receive(self, write: Write, offset: int, n_bytes: int) -> bool:
        """Receive ``n_bytes`` of a pending write; raises InvalidRequest before reading any.
        False when the write's TTL passed during the receive: it no longer exists."""
        def fill(target: memoryview, hasher: Hasher | None) -> None:
            transfer = self.transfers.start(self.conn, n_bytes)   # cut off if it lags
            try:
                self.conn.recv_into(target, timeout_s=self.io_timeout_s, hasher=hasher,
                                    deadline_s=self.deadline_s(n_bytes))
            finally:
                self.transfers.end(transfer)
        return write.receive(offset, n_bytes, fill)

    def _commit_status(self, handle: int, expected: int) -> Status:
        write = self.holds.drop_write(handle)     # committed, refused or expired: done with it
        if write is None:
            return Status.UNKNOWN_HANDLE
        try:
            write.commit(expected)
            self.counted["puts"] += 1
            return Status.OK
        except ChecksumMismatch as exc:
            log.error("put.checksum_mismatch peer=%s %s", self.conn.peer, exc)
            return Status.CHECKSUM_MISMATCH
        except InvalidRequest:
            return Status.UNKNOWN_HANDLE

    def lease_or_status(self, key: bytes, *, expires: bool) -> Lease | Status:
        """``ConnectionHolds.lease_key``, for a key this server does not hide (one it hides
        may be older than a put elsewhere: ``mutable_keys``)."""
        leased = (Status.NOT_FOUND if self.mutable.hidden(key)
                  else self.holds.lease_key(key, expires=expires))
        if leased is Status.NOT_FOUND:
            self.counted["misses"] += 1
        elif not isinstance(leased, Status):
            self.counted["hits"] += 1
        return leased

    # ---- operations ---------------------------------------------------------------------------

    def _put(self, h: Header, key: bytes) -> None:
        trails = bool(h.flags & FLAG_CHECKSUM_TRAILS)
        length = h.payload_len - TRAILER.size if trails else h.payload_len
        key, parent = split_parent(key) if h.flags & FLAG_PARENT else (key, b"")
        status = self.recv_value(key, length, None if trails else h.checksum, h.group, h.flags,
                                 parent)
        BYTES_IN.inc(length)
        self.reply(h, status)

    def _get(self, h: Header, key: bytes) -> None:
        lease = self.lease_or_status(key, expires=False)
        if isinstance(lease, Status):
            self.reply(h, lease)
            return
        try:
            view = lease.view()
            try:
                self.reply(h, Status.OK, payload=(view,), length=lease.entry.length,
                           checksum=lease.entry.checksum)
            finally:
                view.release()
            BYTES_OUT.inc(lease.entry.length)
        finally:
            self.holds.give_back(lease)

    def _alloc(self, h: Header, key: bytes) -> None:
        if h.length == 0 or h.length > self.config.max_value_size:
            self.reply(h, Status.TOO_LARGE if h.length else Status.BAD_REQUEST)
            return
        key, parent = split_parent(key) if h.flags & FLAG_PARENT else (key, b"")
        self.mutable.written(key, content_addressed=bool(h.flags & FLAG_CONTENT_ADDRESSED),
                             group=h.group)
        write = self.holds.claim(key, h.length, expires=True, group=h.group,
                                 pinned=bool(h.flags & FLAG_PINNED), parent=parent)
        if write is None:
            self.reply(h, Status.NO_SPACE)
            return
        self.reply(h, Status.OK, handle=write.handle, length=h.length, offset=write.entry.value)

    def _commit(self, h: Header, key: bytes) -> None:
        self.reply(h, self._commit_status(h.handle, h.checksum))

    def _lease(self, h: Header, key: bytes) -> None:
        lease = self.lease_or_status(key, expires=True)
        if isinstance(lease, Status):
            self.reply(h, lease)
            return
        entry = lease.entry
        self.reply(h, Status.OK, handle=lease.handle, offset=entry.value, length=entry.length,
                   checksum=entry.checksum)
        BYTES_OUT.inc(entry.length)          # the client copies the value itself

    def _delete(self, h: Header, key: bytes) -> None:
        self.reply(h, Status.OK if self.tier.delete(key) else Status.NOT_FOUND)

    def _stat(self, h: Header, key: bytes) -> None:
        stats = {"tier": self.tier.stats(), **self._stat_extra(self.scope.tenant_id)}
        self.reply(h, Status.OK, payload=(json.dumps(stats).encode(),))

    def _hello_reply(self, h: Header, key: bytes) -> None:
        """Server facts (and, on a Unix socket, the arena) — or, before AUTH, a nonce."""
        if not self.authenticated:
            self.reply(h, Status.AUTH_REQUIRED, payload=(self.auth.nonce,))
            return
        tenant = self.scope.is_tenant
        facts = facts_for(self._hello, tenant=tenant)
        reply = Header(h.op, h.request_id, Status.OK, payload_len=len(facts))
        if self._arena_fd is None or tenant:
            self.conn.send((reply.pack(), facts), timeout_s=self.io_timeout_s)
        else:
            self.conn.send_fds((reply.pack(), facts), [self._arena_fd],
                               timeout_s=self.io_timeout_s)

    def _auth(self, h: Header, key: bytes) -> None:
        self.auth.verify(h.flags, bytes(self.recv_bytes(h.payload_len)))
        self.scope = self.auth.scope
        self._hello_reply(h, key)

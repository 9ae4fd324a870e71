"""How the SDK reaches each server: TCP, or shared memory when the server is on this host.

A route is decided on first contact and cached: a HELLO over TCP tells the server's host id and
Unix socket; if the host id is ours (``transport="auto"``) or shared memory is forced
(``"shm"``), the SDK connects to the Unix socket, whose HELLO hands over the arena descriptor,
and maps the arena once per server (again only when a restarted server presents a new arena).
A failure forgets the route, so a server that comes back is asked again.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass

from gcache.errors import ConnectFailed, ProtocolError
from gcache.frame import HEADER_SIZE, Header, Op, raise_for_status, unpack_header
from gcache.transport.shm import ArenaMapping, connect_unix, host_id
from gcache.transport.stream import StreamConnection
from gcache.transport.tcp import connect


@dataclass(slots=True)
class Link:
    """One connection to a server, with the arena mapping when it is a same-host link."""

    conn: StreamConnection
    mapping: ArenaMapping | None
    address: str

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def close(self) -> None:
        self.conn.close()


class Routes:
    def __init__(self, *, transport: str, timeout_s: float, io_size: int) -> None:
        self._transport = transport
        self._timeout_s = timeout_s
        self._io_size = io_size
        self._host_id = host_id()
        self._lock = threading.Lock()
        self._unix_path: dict[str, str] = {}          # address -> socket path; "" means TCP
        self._mappings: dict[str, ArenaMapping] = {}

    def connect(self, address: str) -> Link:
        """A new link to ``address`` over the route for it. Raises ConnectFailed."""
        if self._transport == "tcp":
            return Link(self._tcp(address), None, address)
        with self._lock:
            path = self._unix_path.get(address)
        if path is None:
            path = self._discover(address)
        if not path:
            return Link(self._tcp(address), None, address)
        conn = connect_unix(path, timeout_s=self._timeout_s, io_size=self._io_size)
        try:
            return Link(conn, self._map_arena(address, conn), address)
        except BaseException:
            conn.close()
            raise

    def forget(self, address: str) -> None:
        with self._lock:
            self._unix_path.pop(address, None)

    def is_shm(self, address: str) -> bool:
        with self._lock:
            return bool(self._unix_path.get(address))

    def _tcp(self, address: str) -> StreamConnection:
        return connect(address, timeout_s=self._timeout_s, io_size=self._io_size)

    def _discover(self, address: str) -> str:
        conn = self._tcp(address)
        try:
            facts = json.loads(bytes(_hello(conn, self._timeout_s)[0]))
        finally:
            conn.close()
        local = facts.get("host_id") == self._host_id and bool(facts.get("unix_socket"))
        if self._transport == "shm" and not local:
            raise ConnectFailed(f"{address} is not on this host (or has no unix socket); "
                                "transport='shm' needs a same-host server")
        path = facts["unix_socket"] if local else ""
        with self._lock:
            self._unix_path[address] = path
        return path

    def _map_arena(self, address: str, conn: StreamConnection) -> ArenaMapping:
        payload, fds = _hello(conn, self._timeout_s, with_fds=True)
        facts = json.loads(bytes(payload))
        if len(fds) != 1:
            for fd in fds:
                _close(fd)
            raise ProtocolError(f"{address} sent {len(fds)} descriptors with HELLO; expected 1")
        with self._lock:
            mapping = self._mappings.get(address)
            if mapping is not None and mapping.arena_id == facts["arena_id"]:
                _close(fds[0])
                return mapping
        mapping = ArenaMapping(fds[0], int(facts["arena_bytes"]), facts["arena_id"])
        with self._lock:
            self._mappings[address] = mapping
        return mapping


def _hello(conn: StreamConnection, timeout_s: float, *,
           with_fds: bool = False) -> tuple[bytearray, list[int]]:
    conn.send((Header(Op.HELLO, 1).pack(),), timeout_s=timeout_s)
    if with_fds:
        raw, fds = conn.recv_fds(HEADER_SIZE, timeout_s=timeout_s)
    else:
        raw, fds = conn.recv_exact(HEADER_SIZE, timeout_s=timeout_s), []
    reply = unpack_header(raw, max_payload=1 << 20)
    raise_for_status(reply, "HELLO")
    if reply.op != Op.HELLO:
        raise ProtocolError(f"HELLO answered with {reply.op.name}")
    return conn.recv_exact(reply.payload_len, timeout_s=timeout_s), fds


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)

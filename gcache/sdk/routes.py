"""How the SDK reaches each server: TCP, or shared memory when the server is on this host.

Every new connection starts with a handshake: HELLO, answered with AUTH (an HMAC of the server's
nonce under the cluster token) when the server asks for one. A route is decided on first contact
and cached: the HELLO facts over TCP tell the server's host id and Unix socket; if the host id
is ours (``transport="auto"``) or shared memory is forced (``"shm"``), the SDK connects to the
Unix socket, whose HELLO hands over the arena descriptor, and maps the arena once per server
(again only when a restarted server presents a new arena). A failure forgets the route, so a
server that comes back is asked again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gcache.errors import ConnectFailed, ProtocolError
from gcache.transport.handshake import handshake, parse_facts
from gcache.transport.shm import ArenaMapping, connect_unix, host_id
from gcache.transport.stream import StreamConnection, close_fd
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
    def __init__(self, *, transport: str, timeout_s: float, io_size: int,
                 token: str | None) -> None:
        self._transport = transport
        self._token = token
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
            return self._discover(address)
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

    def _tcp(self, address: str, *, facts: list[dict] | None = None) -> StreamConnection:
        """A TCP connection past the handshake; its HELLO facts go into ``facts`` if given."""
        conn = connect(address, timeout_s=self._timeout_s, io_size=self._io_size)
        try:
            payload, _ = handshake(conn, self._timeout_s, self._token)
            if facts is not None:
                facts.append(parse_facts(payload))
        except BaseException:
            conn.close()
            raise
        return conn

    def _discover(self, address: str) -> Link:
        """First contact: learn where the server is; a TCP link, or a shm link if local."""
        found: list[dict] = []
        conn = self._tcp(address, facts=found)
        facts = found[0]
        local = facts.get("host_id") == self._host_id and bool(facts.get("unix_socket"))
        if self._transport == "shm" and not local:
            conn.close()
            raise ConnectFailed(f"{address} is not on this host (or has no unix socket); "
                                "transport='shm' needs a same-host server")
        with self._lock:
            self._unix_path[address] = facts["unix_socket"] if local else ""
        if not local:
            return Link(conn, None, address)
        conn.close()
        return self.connect(address)

    def _map_arena(self, address: str, conn: StreamConnection) -> ArenaMapping:
        payload, fds = handshake(conn, self._timeout_s, self._token, with_fds=True)
        try:
            facts = parse_facts(payload)
            if facts.get("arena_id") is None or facts.get("arena_bytes") is None:
                raise ProtocolError(f"{address} sent no arena facts with its descriptor")
        except ProtocolError:
            for fd in fds:
                close_fd(fd)
            raise
        if len(fds) != 1:
            for fd in fds:
                close_fd(fd)
            raise ProtocolError(f"{address} sent {len(fds)} descriptors with HELLO; expected 1")
        with self._lock:
            mapping = self._mappings.get(address)
            if mapping is not None and mapping.arena_id == facts["arena_id"]:
                close_fd(fds[0])
                return mapping
        ttl_s = facts.get("lease_ttl_ms", 5000) / 1000
        mapping = ArenaMapping(fds[0], facts["arena_bytes"], facts["arena_id"],
                               write_window_s=ttl_s / 2)
        with self._lock:
            self._mappings[address] = mapping
        return mapping

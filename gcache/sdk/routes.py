"""How the SDK reaches each server, and the ``Exchange`` each link uses: shared memory when the
server is on this host, NIXL (RDMA / GPU Direct) where both sides have it, TCP otherwise.

Every new connection starts with a handshake: HELLO, answered with AUTH (an HMAC of the server's
nonce under the cluster token) when the server asks for one. A route is decided on first contact
and cached; the HELLO facts over TCP tell the server's host id, Unix socket and NIXL agent.
``transport="auto"`` picks shm when the host id is ours, NIXL when the server offers it, NIXL
imports here and this host has an RDMA NIC, TCP otherwise; ``"tcp"``, ``"shm"`` and ``"nixl"``
force one (a server that cannot be reached that way is unreachable). Over shm the client maps
the arena once per server (again only when a restarted server presents a new arena); over NIXL
it adds the server's agent once (again only when it presents another). A failure forgets the
route, so a server that comes back is asked again. Each choice is logged once per server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gcache.buffer import BufferLike
from gcache.errors import ConnectFailed, ProtocolError
from gcache.sdk.exchange import Exchange
from gcache.sdk.nixl_peers import NixlPeers
from gcache.sdk.shm_exchange import ShmExchange
from gcache.sdk.tcp_exchange import TcpExchange
from gcache.transport.handshake import handshake, parse_facts
from gcache.transport.shm import ArenaMapping, connect_unix, host_id
from gcache.transport.stream import StreamConnection, close_fd
from gcache.transport.tcp import connect

if TYPE_CHECKING:
    from gcache.transport.cuda_staging import CudaStaging

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Link:
    """One connection to a server and the exchange that moves values on it."""

    conn: StreamConnection
    exchange: Exchange
    address: str

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def close(self) -> None:
        self.conn.close()


class Routes:
    def __init__(self, *, transport: str, timeout_s: float, io_size: int,
                 token: str | None, staging: Callable[[], CudaStaging],
                 transfers_in_flight: int = 8, nixl_devices: tuple[str, ...] = (),
                 nixl_workers: int = 1) -> None:
        self._transport = transport
        self._token = token
        self._timeout_s = timeout_s
        self._io_size = io_size
        self._host_id = host_id()
        self._lock = threading.Lock()
        self._route: dict[str, tuple[str, str]] = {}  # address -> (kind, unix socket path)
        self._logged: set[tuple[str, str]] = set()
        self._shm: dict[str, ShmExchange] = {}        # address -> its arena's exchange
        self._takes_parents: set[str] = set()          # servers whose HELLO said "parents"
        self._takes_prefetch: set[str] = set()         # ... and "prefetch"
        self._tcp_exchange = TcpExchange(io_size=io_size, staging=staging)
        self._nixl = NixlPeers(io_size=io_size, timeout_s=timeout_s,
                               in_flight=transfers_in_flight, devices=nixl_devices,
                               staging=staging, workers=nixl_workers)
        self._nixl_here: bool | None = None

    def connect(self, address: str) -> Link:
        """A new link to ``address`` over the route for it. Raises ConnectFailed."""
        if self._transport == "tcp":
            return Link(self._tcp(address), self._tcp_exchange, address)
        with self._lock:
            route = self._route.get(address)
        if route is None:
            return self._discover(address)
        kind, path = route
        if kind == "shm":
            conn = connect_unix(path, timeout_s=self._timeout_s, io_size=self._io_size)
            try:
                return Link(conn, self._map_arena(address, conn), address)
            except BaseException:
                conn.close()
                raise
        found: list[dict[str, Any]] = []
        conn = self._tcp(address, facts=found)
        return self._link(address, kind, conn, found[0])

    def takes_parents(self, address: str) -> bool:
        """Whether the server said in HELLO that it keeps parents (``FLAG_PARENT``)."""
        with self._lock:
            return address in self._takes_parents

    def takes_prefetch(self, address: str) -> bool:
        """Whether the server said in HELLO that it answers PREFETCH."""
        with self._lock:
            return address in self._takes_prefetch

    def _note(self, address: str, facts: dict[str, Any]) -> None:
        with self._lock:       # a fact missing: a server restarted on an older version
            for fact, servers in (("parents", self._takes_parents),
                                  ("prefetch", self._takes_prefetch)):
                if facts.get(fact) is True:
                    servers.add(address)
                else:
                    servers.discard(address)

    def forget(self, address: str) -> None:
        with self._lock:
            self._route.pop(address, None)
        self._nixl.forget(address)

    def transport_of(self, address: str) -> str | None:
        """"shm", "nixl" or "tcp" for a server reached before; None when not decided yet."""
        if self._transport == "tcp":
            return "tcp"
        with self._lock:
            route = self._route.get(address)
        return None if route is None else route[0]

    def is_shm(self, address: str) -> bool:
        return self.transport_of(address) == "shm"

    def register_buffer(self, buffer: BufferLike) -> bool:
        """Register ``buffer`` for NIXL transfers when this client may use NIXL; False (and
        nothing done) when it never will (another transport, or NIXL not installed here)."""
        if not self._may_use_nixl():
            return False
        self._nixl.register(buffer)
        return True

    def unregister_buffer(self, buffer: BufferLike) -> bool:
        """Undo ``register_buffer``; False when ``buffer`` was not registered."""
        return self._may_use_nixl() and self._nixl.unregister(buffer)

    def nixl_regions(self) -> int:
        return self._nixl.registered_regions()

    def close(self) -> None:
        """Drop NIXL's peers and unmap the arenas: a closed client must not keep a server's
        memory mapped (its file could not be freed, nor its tmpfs unmounted)."""
        self._nixl.close()
        with self._lock:
            mapped, self._shm = list(self._shm.values()), {}
        for exchange in mapped:
            exchange.mapping.close()

    def _may_use_nixl(self) -> bool:
        if self._transport == "nixl":
            from gcache.transport import nixl
            return nixl.available()
        return self._transport == "auto" and self._nixl_usable()

    def _nixl_usable(self) -> bool:
        """Whether ``auto`` prefers NIXL for remote servers: it imports and there is a NIC."""
        if self._nixl_here is None:
            from gcache.transport import nixl
            self._nixl_here = nixl.available() and nixl.has_rdma_nic()
        return self._nixl_here

    def _tcp(self, address: str, *,
             facts: list[dict[str, Any]] | None = None) -> StreamConnection:
        """A TCP connection past the handshake; its HELLO facts go into ``facts`` if given."""
        conn = connect(address, timeout_s=self._timeout_s, io_size=self._io_size)
        try:
            payload, _ = handshake(conn, self._timeout_s, self._token)
            found = parse_facts(payload)
            self._note(address, found)
            if facts is not None:
                facts.append(found)
        except BaseException:
            conn.close()
            raise
        return conn

    def _link(self, address: str, kind: str, conn: StreamConnection,
              facts: dict[str, Any]) -> Link:
        """A link over a handshaken TCP connection: TCP's exchange, or this server's NIXL one."""
        if kind == "tcp":
            return Link(conn, self._tcp_exchange, address)
        try:
            ttl_s = facts.get("lease_ttl_ms", 5000) / 1000
            return Link(conn, self._nixl.exchange(address, facts, lease_window_s=ttl_s / 2),
                        address)
        except BaseException:
            conn.close()
            raise

    def _discover(self, address: str) -> Link:
        """First contact: learn where the server is and choose the route to it."""
        found: list[dict[str, Any]] = []
        conn = self._tcp(address, facts=found)
        facts = found[0]
        try:
            kind = self._choose(address, facts)
        except BaseException:
            conn.close()
            raise
        with self._lock:
            self._route[address] = (kind, facts.get("unix_socket") or "")
            first = (address, kind) not in self._logged
            self._logged.add((address, kind))
        if first:
            log.info("sdk.route server=%s transport=%s", address, kind)
        if kind != "shm":
            return self._link(address, kind, conn, facts)
        conn.close()
        return self.connect(address)

    def _choose(self, address: str, facts: dict[str, Any]) -> str:
        local = facts.get("host_id") == self._host_id and bool(facts.get("unix_socket"))
        offers_nixl = bool(facts.get("nixl"))
        if self._transport == "shm":
            if not local:
                raise ConnectFailed(f"{address} is not on this host (or has no unix socket); "
                                    "transport='shm' needs a same-host server")
            return "shm"
        if self._transport == "nixl":
            from gcache.transport import nixl
            if not nixl.available():
                raise ConnectFailed("transport='nixl' needs NIXL here: pip install --no-deps "
                                    "nixl-cu12==1.5.1")
            if not offers_nixl:
                raise ConnectFailed(f"{address} offers no NIXL (nixl-cu12 is missing there, "
                                    "it runs with --no-nixl, or its agent did not start)")
            return "nixl"
        if local:
            return "shm"
        return "nixl" if offers_nixl and self._nixl_usable() else "tcp"

    def _map_arena(self, address: str, conn: StreamConnection) -> ShmExchange:
        payload, fds = handshake(conn, self._timeout_s, self._token, with_fds=True)
        try:
            facts = parse_facts(payload)
            if facts.get("arena_id") is None or facts.get("arena_bytes") is None:
                raise ProtocolError(f"{address} sent no arena facts with its descriptor")
            self._note(address, facts)
        except ProtocolError:
            for fd in fds:
                close_fd(fd)
            raise
        if len(fds) != 1:
            for fd in fds:
                close_fd(fd)
            raise ProtocolError(f"{address} sent {len(fds)} descriptors with HELLO; expected 1")
        with self._lock:
            known = self._shm.get(address)
            if known is not None and known.mapping.arena_id == facts["arena_id"]:
                close_fd(fds[0])
                return known
        ttl_s = facts.get("lease_ttl_ms", 5000) / 1000
        exchange = ShmExchange(ArenaMapping(fds[0], facts["arena_bytes"], facts["arena_id"],
                                            lease_window_s=ttl_s / 2))
        with self._lock:
            self._shm[address] = exchange
        return exchange

"""TCP transport: connecting, listening and tuning; the byte moving is ``stream``'s.

Sockets get TCP_NODELAY (frames are request/response) and 4 MiB kernel buffers, so one 4 MiB
value fits in flight without the sender waiting on the receiver's window, and TCP_USER_TIMEOUT of
one IO timeout: sent bytes the peer has not acknowledged for that long end the connection. Without
it a peer cut off mid-transfer (a partition, a crashed host) was noticed only after about three
IO timeouts: each blocked ``sendmsg`` returned a partial count at its timeout, because the kernel
frees a little buffer at every retransmission, and was retried, so only a call that moved nothing
timed out; meanwhile the reply's read leases kept its segments pinned. A live peer that is just
slow to read still acknowledges the kernel's window probes and is not cut off by this.
"""

from __future__ import annotations

import socket

from gcache.errors import ConnectFailed, InvalidRequest
from gcache.transport.stream import StreamConnection, accept_socket

SOCKET_BUFFER_BYTES = 4 << 20


def parse_address(address: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (IPv6 hosts in brackets). Raises InvalidRequest (a ValueError)
    naming the address."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidRequest(f"address {address!r} must be HOST:PORT")
    return host.strip("[]"), int(port)


def _tune(sock: socket.socket, unacknowledged_s: float) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                    max(1, int(unacknowledged_s * 1000)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


def connect(address: str, *, timeout_s: float, io_size: int) -> StreamConnection:
    """Open a connection to ``address``. Raises ConnectFailed within ``timeout_s``; once open,
    bytes unacknowledged for ``timeout_s`` end it (a send raises ConnectionLost)."""
    host, port = parse_address(address)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        sock.settimeout(None)           # blocking from here on; timeouts are SO_RCVTIMEO/SNDTIMEO
        _tune(sock, timeout_s)
    except OSError as exc:
        raise ConnectFailed(f"connect to {address} failed: {exc}") from exc
    return StreamConnection(sock, address, io_size=io_size)


class TcpListener:
    """A socket bound at once (its port is known) that takes connections only from ``listen``
    on: a connection attempt before that is refused, a fast failure a client retries, rather
    than accepted by a server not yet able to answer it. It hands out ``StreamConnection``s;
    bytes they send that stay unacknowledged for ``unacknowledged_s`` end them."""

    def __init__(self, address: str, *, io_size: int, unacknowledged_s: float) -> None:
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise ConnectFailed(f"cannot listen on {address}: {exc}") from exc
        self.io_size, self._unacknowledged_s = io_size, unacknowledged_s
        bound_host, bound_port = self._sock.getsockname()[:2]
        self.address = f"{bound_host}:{bound_port}"

    def listen(self, backlog: int = 512) -> None:
        """Start taking connections."""
        self._sock.listen(backlog)

    def accept(self, *, timeout_s: float) -> StreamConnection | None:
        """The next connection, or None after ``timeout_s`` (so the caller can check for stop)."""
        accepted = accept_socket(self._sock, timeout_s=timeout_s, name=self.address)
        if accepted is None:
            return None
        sock, peer = accepted
        assert isinstance(peer, tuple)          # an AF_INET(6) peer is (host, port, ...)
        _tune(sock, self._unacknowledged_s)
        return StreamConnection(sock, f"{peer[0]}:{peer[1]}", io_size=self.io_size)

    def close(self) -> None:
        self._sock.close()

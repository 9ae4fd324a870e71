"""TCP transport: frames between sockets and memory with no intermediate copies.

Values are sent with ``sendall`` on memoryview slices of the caller's buffer (or the server's
arena) and received with ``recv_into`` straight into the destination, one ``io_size`` slice per
IO; the only buffer of our own is the one that joins a header with its key. Small pieces are
joined into one ``sendall`` because two syscalls cost more than a copy of a few hundred bytes.
Timeouts are per IO, so a 64 MiB transfer is not bounded by a 200 ms deadline, but a stalled peer
is detected within one ``timeout_s``.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Protocol

from gcache.errors import ConnectFailed, ConnectionLost, IOTimeout

class Hasher(Protocol):
    def update(self, data: memoryview, /) -> None: ...


_JOIN_LIMIT = 64 * 1024      # pieces smaller than this are joined before sending
SOCKET_BUFFER_BYTES = 4 << 20


def parse_address(address: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (IPv6 hosts in brackets). Raises ValueError naming the address."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {address!r} must be HOST:PORT")
    return host.strip("[]"), int(port)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


class TcpConnection:
    """One TCP stream. Not thread-safe: one user at a time (the SDK pools them)."""

    __slots__ = ("_sock", "peer", "io_size", "_timeout_s", "_closed")

    def __init__(self, sock: socket.socket, peer: str, *, io_size: int) -> None:
        self._sock = sock
        self.peer = peer
        self.io_size = io_size
        self._timeout_s: float | None = None
        self._closed = False
        _tune(sock)

    def __repr__(self) -> str:
        return f"TcpConnection(peer={self.peer!r}, closed={self._closed})"

    def _set_timeout(self, timeout_s: float | None) -> None:
        if timeout_s != self._timeout_s:
            self._sock.settimeout(timeout_s)
            self._timeout_s = timeout_s

    def send(self, frames: Sequence[bytes | memoryview], *, timeout_s: float | None) -> None:
        self._set_timeout(timeout_s)
        small: list[bytes | memoryview] = []
        try:
            for frame in frames:
                if len(frame) < _JOIN_LIMIT:
                    small.append(frame)
                    continue
                if small:
                    self._sock.sendall(b"".join(small))
                    small = []
                view = memoryview(frame)
                for start in range(0, len(view), self.io_size):
                    self._sock.sendall(view[start:start + self.io_size])
            if small:
                self._sock.sendall(b"".join(small))
        except socket.timeout as exc:
            raise IOTimeout(f"send to {self.peer} exceeded {timeout_s}s") from exc
        except OSError as exc:
            raise ConnectionLost(f"send to {self.peer} failed: {exc}") from exc

    def recv_into(self, buf: memoryview, *, timeout_s: float | None,
                  hasher: Hasher | None = None) -> None:
        """Fill ``buf``; with ``hasher``, feed it each piece while the piece is still in cache."""
        self._set_timeout(timeout_s)
        got, total = 0, len(buf)
        try:
            while got < total:
                n = self._sock.recv_into(buf[got:got + self.io_size])
                if n == 0:
                    raise ConnectionLost(f"{self.peer} closed the connection after {got} of "
                                         f"{total} bytes")
                if hasher is not None:
                    hasher.update(buf[got:got + n])
                got += n
        except socket.timeout as exc:
            raise IOTimeout(f"recv from {self.peer} exceeded {timeout_s}s ({got} of {total} "
                            "bytes)") from exc
        except OSError as exc:
            raise ConnectionLost(f"recv from {self.peer} failed: {exc}") from exc

    def recv_exact(self, n_bytes: int, *, timeout_s: float | None) -> bytearray:
        buf = bytearray(n_bytes)
        if n_bytes:
            self.recv_into(memoryview(buf), timeout_s=timeout_s)
        return buf

    def shutdown(self) -> None:
        """Wake a thread blocked on this connection (it sees ConnectionLost)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._sock.close()
            except OSError:
                pass

    @property
    def closed(self) -> bool:
        return self._closed


def connect(address: str, *, timeout_s: float, io_size: int) -> TcpConnection:
    """Open a connection to ``address``. Raises ConnectFailed within ``timeout_s``."""
    host, port = parse_address(address)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        raise ConnectFailed(f"connect to {address} failed: {exc}") from exc
    return TcpConnection(sock, address, io_size=io_size)


class TcpListener:
    """A listening socket that hands out ``TcpConnection``s."""

    def __init__(self, address: str, *, io_size: int, backlog: int = 512) -> None:
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise ConnectFailed(f"cannot listen on {address}: {exc}") from exc
        self._sock.listen(backlog)
        self.io_size = io_size
        bound_host, bound_port = self._sock.getsockname()[:2]
        self.address = f"{bound_host}:{bound_port}"

    def accept(self, *, timeout_s: float) -> TcpConnection | None:
        """The next connection, or None after ``timeout_s`` (so the caller can check for stop)."""
        self._sock.settimeout(timeout_s)
        try:
            sock, peer = self._sock.accept()
        except socket.timeout:
            return None
        except OSError as exc:
            raise ConnectionLost(f"accept on {self.address} failed: {exc}") from exc
        sock.settimeout(None)
        return TcpConnection(sock, f"{peer[0]}:{peer[1]}", io_size=self.io_size)

    def close(self) -> None:
        self._sock.close()

"""A stream connection (TCP or Unix socket) that moves frames with no intermediate copies.

Values are sent with ``sendmsg`` on memoryview slices of the caller's buffer (or the server's
arena) and received with ``recv_into`` straight into the destination, one ``io_size`` slice per
IO. Header, key and value go out as one gathered ``sendmsg``; header and key come in through a
small read-ahead buffer, because on these machines a syscall costs more than copying a few KiB.
Timeouts are per IO, so a 64 MiB transfer is not bounded by a 200 ms deadline, but a stalled peer
is detected within one ``timeout_s``: a receive waits at most that long for a byte, and a send to
a peer that stopped acknowledging ends once the kernel gives up on it (``tcp``'s
TCP_USER_TIMEOUT), however much the local send buffer still takes.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from gcache.errors import ConnectionLost, IOTimeout
from gcache.keys import Hasher

READ_AHEAD = 16 * 1024      # bytes a small read may pull in at once
_DIRECT_MIN = 4 * 1024       # reads at least this large skip the read-ahead buffer
_TIMEVAL = struct.Struct("@ll")
_PEER_GONE = select.POLLRDHUP | select.POLLHUP | select.POLLERR


class StreamConnection:
    """One TCP stream. Not thread-safe: one user at a time (the SDK pools them).

    Reads go through a small read-ahead buffer so that a header and its key (or a reply header
    and a small value) cost one ``recv``; a read of at least ``_DIRECT_MIN`` bytes bypasses it
    and lands straight in the destination. Writes gather header, key and value slices into one
    ``sendmsg`` of at most ``io_size`` bytes, with no copy.
    """

    __slots__ = (
        "_closed",
        "_rbuf",
        "_rend",
        "_rpos",
        "_rview",
        "_sock",
        "_timeout_s",
        "io_size",
        "last_recv_s",
        "peer",
        "received",
    )

    def __init__(self, sock: socket.socket, peer: str, *, io_size: int) -> None:
        self._sock = sock
        self.peer = peer
        self.io_size = io_size
        self._timeout_s: float | None = None
        self._closed = False
        self._rbuf = bytearray(READ_AHEAD)
        self._rview = memoryview(self._rbuf)
        self._rpos = self._rend = 0
        self.received = 0          # bytes taken off the socket so far (a transfer's progress)
        self.last_recv_s = 0.0     # time.monotonic() when bytes last came

    def __repr__(self) -> str:
        return f"StreamConnection(peer={self.peer!r}, closed={self._closed})"

    def _set_timeout(self, timeout_s: float | None) -> None:
        """Kernel-side timeouts on a blocking socket: Python's own ``settimeout`` would add a
        ``poll()`` before every send and recv, doubling the syscalls of a round trip."""
        if timeout_s != self._timeout_s:
            whole = int(timeout_s or 0)
            usec = 0 if timeout_s is None else max(1, int((timeout_s - whole) * 1e6))
            value = _TIMEVAL.pack(whole, usec)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
            self._timeout_s = timeout_s

    def send(self, frames: Sequence[bytes | memoryview], *, timeout_s: float | None,
             deadline_s: float | None = None) -> None:
        """Send ``frames`` in IOs of at most ``io_size``. ``deadline_s`` (``time.monotonic()``)
        bounds the whole send, as in ``recv_into``: a peer that reads a byte at a time must not
        hold what the reply pins (a read lease) for ever."""
        self._set_timeout(timeout_s)
        batch: list[memoryview] = []
        batch_len = 0
        with self._socket_errors("send to", timeout_s):
            for frame in frames:
                view = memoryview(frame)
                for start in range(0, len(view), self.io_size):
                    piece = view[start:start + self.io_size]
                    if batch_len + len(piece) > self.io_size:
                        self._sendmsg_all(batch, timeout_s, deadline_s)
                        batch, batch_len = [], 0
                    batch.append(piece)
                    batch_len += len(piece)
            if batch:
                self._sendmsg_all(batch, timeout_s, deadline_s)

    def _socket_errors(self, action: str, timeout_s: float | None,
                       progress: Callable[[], str] = str) -> _SocketBoundary:
        """The socket boundary, as a context: a timeout becomes IOTimeout, any other OSError
        ConnectionLost, each naming the peer and the action (``progress()`` adds how far it
        got)."""
        return _SocketBoundary(self.peer, action, timeout_s, progress)

    def _before_deadline(self, deadline_s: float, timeout_s: float | None, done: str) -> None:
        """Raise IOTimeout once ``deadline_s`` has passed; else make a blocked IO wake near it."""
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            raise IOTimeout(f"{self.peer} too slow: only {done} by the transfer's deadline")
        if _wakes_late(timeout_s, left_s):
            self._set_timeout(left_s)

    def _sendmsg_all(self, batch: list[memoryview], timeout_s: float | None,
                     deadline_s: float | None) -> None:
        while batch:
            if deadline_s is not None:
                self._before_deadline(deadline_s, timeout_s, "the peer did not take the reply")
            sent = self._sock.sendmsg(batch)
            while sent:
                if sent >= len(batch[0]):
                    sent -= len(batch.pop(0))
                else:
                    batch[0] = batch[0][sent:]
                    sent = 0

    def recv_into(self, buf: memoryview, *, timeout_s: float | None,
                  hasher: Hasher | None = None, idle_ok: bool = False,
                  deadline_s: float | None = None) -> bool:
        """Fill ``buf``; with ``hasher``, feed it each piece while the piece is still in cache.

        With ``idle_ok``, a timeout before the first byte returns False (an idle peer) instead
        of raising IOTimeout; a timeout after it is a stall and raises. ``deadline_s`` (a
        ``time.monotonic()`` instant) bounds the whole transfer: ``timeout_s`` alone is per IO,
        so a peer trickling a byte at a time would never reach it.
        """
        self._set_timeout(timeout_s)
        got, total = 0, len(buf)
        with self._socket_errors("recv from", timeout_s, lambda: f" ({got} of {total} bytes)"):
            while got < total:
                if deadline_s is not None:
                    self._before_deadline(deadline_s, timeout_s, f"{got} of {total} bytes came")
                if self._rpos < self._rend:               # bytes already read ahead
                    n = min(total - got, self._rend - self._rpos)
                    buf[got:got + n] = self._rview[self._rpos:self._rpos + n]
                    self._rpos += n
                else:
                    # large: straight into the destination; small: one recv into the read-ahead
                    # buffer, maybe more than asked
                    direct = total - got >= _DIRECT_MIN
                    filled = self._recv_some(buf[got:got + self.io_size] if direct
                                             else self._rview, idle=idle_ok and got == 0)
                    if filled < 0:
                        return False
                    if filled == 0:
                        raise ConnectionLost(f"{self.peer} closed the connection after {got} of "
                                             f"{total} bytes")
                    if not direct:
                        self._rpos, self._rend = 0, filled
                        continue
                    n = filled
                if hasher is not None:
                    hasher.update(buf[got:got + n])
                got += n
        return True

    def _recv_some(self, dest: memoryview, *, idle: bool = False) -> int:
        """One ``recv`` into ``dest``: bytes received, 0 when the peer closed, -1 when ``idle``
        and nothing came within the timeout (an idle peer, not a stall)."""
        try:
            n = self._sock.recv_into(dest)
        except (TimeoutError, BlockingIOError):
            if idle:
                return -1
            raise
        self.received += n
        self.last_recv_s = time.monotonic()
        return n

    def read_ahead(self, n_bytes: int, *, timeout_s: float | None, deadline_s: float) -> None:
        """Return once the next ``min(n_bytes, READ_AHEAD)`` bytes have arrived, holding them
        in the read-ahead buffer (a later ``recv_into`` takes them from there). A server calls
        it before it claims memory for a payload, so that a peer that sends a header and then
        trickles pins nothing while it is cut off at ``deadline_s``."""
        want = min(n_bytes, READ_AHEAD)
        held = self._rend - self._rpos
        if held >= want:
            return
        if self._rpos:
            self._rbuf[:held] = self._rbuf[self._rpos:self._rend]
            self._rpos, self._rend = 0, held
        self._set_timeout(timeout_s)
        with self._socket_errors("recv from", timeout_s,
                                 lambda: f" ({self._rend} of the first {want} bytes)"):
            while self._rend < want:
                self._before_deadline(deadline_s, timeout_s,
                                      f"{self._rend} of the first {want} bytes came")
                n = self._sock.recv_into(self._rview[self._rend:want], want - self._rend,
                                         socket.MSG_WAITALL)
                if n == 0:
                    raise ConnectionLost(f"{self.peer} closed the connection after "
                                         f"{self._rend} of {n_bytes} bytes")
                self.received += n
                self.last_recv_s = time.monotonic()
                self._rend += n

    def recv_exact(self, n_bytes: int, *, timeout_s: float | None,
                   deadline_s: float | None = None) -> bytearray:
        buf = bytearray(n_bytes)
        if n_bytes:
            self.recv_into(memoryview(buf), timeout_s=timeout_s, deadline_s=deadline_s)
        return buf

    def recv_growing(self, n_bytes: int, *, timeout_s: float | None,
                     deadline_s: float | None = None, step: int = 64 * 1024) -> bytearray:
        """``recv_exact`` whose buffer grows with the bytes that arrive, so a peer that only
        declares a large payload costs a step of memory, not the declared size."""
        buf = bytearray()
        while len(buf) < n_bytes:
            buf += self.recv_exact(min(step, n_bytes - len(buf)), timeout_s=timeout_s,
                                   deadline_s=deadline_s)
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

    def readable(self) -> bool:
        """Whether a read would find something now: bytes read ahead, or on the socket, or
        its end (a zero-wait poll; nothing is read)."""
        if self._rpos < self._rend or self._closed:
            return True
        poller = select.poll()
        poller.register(self._sock, select.POLLIN | _PEER_GONE)
        try:
            return bool(poller.poll(0))
        except OSError:
            return True

    def peer_closed(self) -> bool:
        """Whether the peer has shut its end or died (a zero-wait poll; nothing is read). A
        poller per call: a batch's IO threads ask this of one connection at once."""
        if self._closed:
            return True
        poller = select.poll()
        poller.register(self._sock, _PEER_GONE)
        try:
            return bool(poller.poll(0))
        except OSError:
            return True

    def send_fds(self, frames: Sequence[bytes | memoryview], fds: Sequence[int], *,
                 timeout_s: float | None) -> None:
        """Send small ``frames`` with file descriptors attached (SCM_RIGHTS, Unix sockets)."""
        self._set_timeout(timeout_s)
        data = b"".join(frames)
        with self._socket_errors("send to", timeout_s):
            sent = socket.send_fds(self._sock, [data], list(fds))
            if sent < len(data):
                self._sock.sendall(memoryview(data)[sent:])

    def recv_fds(self, n_bytes: int, *, timeout_s: float | None) -> tuple[bytearray, list[int]]:
        """Receive exactly ``n_bytes`` and the descriptors sent with the first of them."""
        if self._rpos < self._rend:
            raise ConnectionLost(f"{self.peer}: descriptors expected at a frame boundary")
        self._set_timeout(timeout_s)
        with self._socket_errors("recv from", timeout_s):
            data, fds, _flags, _addr = socket.recv_fds(self._sock, n_bytes, 4)
        if not data:
            for fd in fds:
                close_fd(fd)
            raise ConnectionLost(f"{self.peer} closed the connection")
        buf = bytearray(data)
        if len(buf) < n_bytes:
            rest = bytearray(n_bytes - len(buf))
            self.recv_into(memoryview(rest), timeout_s=timeout_s)
            buf += rest
        return buf, fds


class _SocketBoundary:
    """``StreamConnection._socket_errors``: a plain class, not a generator context, because it
    wraps every frame's IO (a generator's set-up costs several times as much)."""

    __slots__ = ("action", "peer", "progress", "timeout_s")

    def __init__(self, peer: str, action: str, timeout_s: float | None,
                 progress: Callable[[], str]) -> None:
        self.peer, self.action, self.timeout_s, self.progress = peer, action, timeout_s, progress

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, (TimeoutError, BlockingIOError)):
            raise IOTimeout(f"{self.action} {self.peer} exceeded {self.timeout_s}s"
                            f"{self.progress()}") from exc
        if isinstance(exc, OSError):
            raise ConnectionLost(f"{self.action} {self.peer} failed: {exc}") from exc


def _wakes_late(timeout_s: float | None, left_s: float) -> bool:
    """Whether the socket's timeout must be lowered to ``left_s`` for a blocked IO to wake near
    its deadline: only once less than half an IO timeout is left (a blocked IO then overshoots
    the deadline by at most half a timeout). Lowering costs two syscalls and raising it again
    two more; a deadline starts a whole IO timeout away, so a transfer at a useful rate, and
    every small request, never pays them (measured: paying them on every key and reply cost a
    third of a small same-host put's time)."""
    return timeout_s is None or left_s < timeout_s / 2


def close_fd(fd: int) -> None:
    """Close a received descriptor, ignoring one already gone."""
    try:
        os.close(fd)
    except OSError:
        pass


def accept_socket(listener: socket.socket, *, timeout_s: float,
                  name: str) -> tuple[socket.socket, object] | None:
    """The next accepted socket (blocking, for StreamConnection) and its peer address, or None
    after ``timeout_s`` so an accept loop can check for stop. Raises ConnectionLost."""
    listener.settimeout(timeout_s)
    try:
        sock, peer = listener.accept()
    except TimeoutError:
        return None
    except OSError as exc:
        raise ConnectionLost(f"accept on {name} failed: {exc}") from exc
    sock.settimeout(None)
    return sock, peer

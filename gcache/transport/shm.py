"""Same-host transport: control frames over a Unix socket, values through the server's arena.

After a HELLO on the Unix socket the server passes its arena's file descriptor (SCM_RIGHTS) and
the client maps the whole arena once, populated up front (MAP_POPULATE) so that no page fault
lands on a read. From then on a read is LEASE -> one copy out of the mapping -> RELEASE, and a
write ALLOC -> one copy into the mapping -> COMMIT: the frames on the socket are small and the
value is touched exactly once. Copies go through numpy, which releases the GIL, in chunks that
are hashed just before they are copied, so the copy reads them from cache.

The socket file is mode 0600 and the arena file too: only the server's user may map it.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import socket

import numpy as np

from gcache.errors import ConnectFailed, ConnectionLost
from gcache.keys import HASH_PIECE, Hasher
from gcache.transport.stream import StreamConnection, accept_socket

# Unhashed copies go whole or in 1 MiB pieces: below that glibc's memcpy left its non-temporal
# path on 2026-11's machine and a 4 MiB copy dropped from ~19 to ~7 GB/s. Copies that are hashed
# go in HASH_PIECE pieces, each hashed from its source just before it is copied, so the copy
# reads cache-warm bytes (4 MiB at 18.9 GB/s in 256 KiB pieces, 14.8 in 1 MiB ones, 2026-12-06).
COPY_CHUNK = 1 << 20


def host_id() -> str:
    """An id equal for every process on this host and boot (machine-id and boot id) in one
    network namespace: processes in two namespaces (containers, or the tests' network hosts)
    reach each other over an interface, so they are two hosts to the transport."""
    parts = []
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path) as fh:
                parts.append(fh.read().strip())
        except OSError:
            parts.append("")
    parts.append(socket.gethostname())
    try:
        parts.append(str(os.stat("/proc/self/ns/net").st_ino))
    except OSError:
        parts.append("")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _is_served(path: str) -> bool:
    """Whether a live process accepts connections on the Unix socket at ``path``."""
    if not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


class UnixListener:
    """A Unix socket at ``path`` (mode 0600), bound at once and taking connections only from
    ``listen`` on (before, a connection is refused), that hands out StreamConnections."""

    def __init__(self, path: str, *, io_size: int) -> None:
        self.path = path
        self.io_size = io_size
        if _is_served(path):
            raise ConnectFailed(f"cannot listen on unix socket {path}: another server is "
                                "listening there; give each server its own --unix-socket")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if os.path.exists(path):
                os.unlink(path)               # a stale socket from a crashed server
            old_umask = os.umask(0o177)
            try:
                self._sock.bind(path)
            finally:
                os.umask(old_umask)
        except OSError as exc:
            self._sock.close()
            raise ConnectFailed(f"cannot listen on unix socket {path}: {exc}") from exc

    def listen(self, backlog: int = 512) -> None:
        """Start taking connections."""
        self._sock.listen(backlog)

    def accept(self, *, timeout_s: float) -> StreamConnection | None:
        accepted = accept_socket(self._sock, timeout_s=timeout_s, name=self.path)
        if accepted is None:
            return None
        return StreamConnection(accepted[0], f"unix:{self.path}", io_size=self.io_size)

    def close(self) -> None:
        self._sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def connect_unix(path: str, *, timeout_s: float, io_size: int) -> StreamConnection:
    """Connect to a server's Unix socket. Raises ConnectFailed."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.settimeout(None)
    except OSError as exc:
        sock.close()
        raise ConnectFailed(f"connect to unix socket {path} failed: {exc}") from exc
    return StreamConnection(sock, f"unix:{path}", io_size=io_size)


class ArenaMapping:
    """A client's mapping of a server arena, from the descriptor the server passed.

    Takes ownership of ``fd`` (closed once mapped). ``arena_id`` names the arena instance, so a
    client can tell a restarted server's new arena from the old one.
    """

    def __init__(self, fd: int, size_bytes: int, arena_id: str, *,
                 lease_window_s: float = 2.5) -> None:
        try:
            # Mapped past the file's end, a read would be a SIGBUS, not an error: a server
            # that names a larger arena than the descriptor holds is refused.
            if os.fstat(fd).st_size < size_bytes:
                raise ConnectionLost(f"server named a {size_bytes}-byte arena; its descriptor "
                                     f"holds {os.fstat(fd).st_size}")
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._mmap = mmap.mmap(fd, size_bytes, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise ConnectionLost(f"cannot map the server arena ({size_bytes} bytes): {exc}") \
                from exc
        finally:
            os.close(fd)
        self.size_bytes = size_bytes
        self.arena_id = arena_id
        # How long after LEASE or ALLOC this client may still read or write an extent: half the
        # server's lease TTL, after which it may reclaim the extent for someone else's value.
        self.lease_window_s = lease_window_s
        self.array = np.frombuffer(self._mmap, dtype=np.uint8)
        self.cuda_registered = False

    def _check(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.size_bytes:
            raise ConnectionLost(f"server named bytes [{offset}, {offset + length}) outside its "
                                 f"{self.size_bytes}-byte arena")

    def read_into(self, offset: int, out: memoryview, hasher: Hasher | None) -> None:
        """Copy ``len(out)`` arena bytes at ``offset`` into ``out``, hashing as it goes."""
        self._check(offset, len(out))
        dst = np.frombuffer(out, dtype=np.uint8)
        step = HASH_PIECE if hasher is not None else max(1, len(out))
        for start in range(0, len(out), step):
            end = min(len(out), start + step)
            source = self.array[offset + start:offset + end]
            if hasher is not None:
                # numpy's stubs make an ndarray a buffer on Python 3.12+ only (__buffer__)
                hasher.update(source)  # type: ignore[arg-type]
            np.copyto(dst[start:end], source)

    def write_from(self, offset: int, src: memoryview) -> None:
        """Copy ``src`` into the arena at ``offset`` (the caller hashes it: ``AheadHash``)."""
        self._check(offset, len(src))
        np.copyto(self.array[offset:offset + len(src)], np.frombuffer(src, dtype=np.uint8))

    def region(self, offset: int, length: int) -> memoryview:
        self._check(offset, length)
        return memoryview(self._mmap)[offset:offset + length]

    def close(self) -> None:
        try:
            self.array = np.empty(0, dtype=np.uint8)
            self._mmap.close()
        except BufferError:
            pass              # a caller still holds a view; the mapping goes with the process

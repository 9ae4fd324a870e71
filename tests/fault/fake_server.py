"""A fake data server for testing the SDK against lies: a real socket speaking the real frame
codec, answering HELLO with facts it is given and every later request with a scripted reply."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from gcache.frame import HEADER_SIZE, Header, Op, Status, unpack_header

Reply = Callable[[Header], bytes]


class FakeServer:
    """Answers HELLO with ``facts`` (bytes as sent) and every other request with
    ``reply(request)``; on a Unix socket HELLO also passes ``fd``."""

    def __init__(self, facts: bytes, reply: Reply, *, unix_path: str | None = None,
                 fd: int | None = None) -> None:
        self.facts, self.reply, self.fd = facts, reply, fd
        family = socket.AF_UNIX if unix_path else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(unix_path or ("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = unix_path or f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            while True:
                raw = conn.recv(HEADER_SIZE, socket.MSG_WAITALL)
                if len(raw) < HEADER_SIZE:
                    return
                request = unpack_header(raw, max_payload=1 << 30)
                rest = request.key_len + request.payload_len
                while rest:
                    rest -= len(conn.recv(min(rest, 1 << 16)))
                if request.op == Op.HELLO:
                    frame = Header(Op.HELLO, request.request_id, Status.OK,
                                   payload_len=len(self.facts)).pack() + self.facts
                    if self.fd is not None:
                        socket.send_fds(conn, [frame], [self.fd])
                    else:
                        conn.sendall(frame)
                else:
                    conn.sendall(self.reply(request))
        except OSError:
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(2)

"""``StreamConnection.read_ahead``: a server waits for a payload's first bytes before it claims
arena memory for it, so a peer that sends a header and trickles pins nothing."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from gcache.errors import ConnectionLost, IOTimeout
from gcache.transport.stream import READ_AHEAD, StreamConnection


def connected(family: int) -> tuple[socket.socket, socket.socket]:
    if family == socket.AF_UNIX:
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    listener = socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(listener.getsockname())
    theirs, _ = listener.accept()
    listener.close()
    return ours, theirs


@pytest.mark.parametrize("family", [socket.AF_UNIX, socket.AF_INET])
def test_it_returns_once_the_first_bytes_are_in_and_later_reads_get_every_byte_in_order(family):
    ours, theirs = connected(family)
    conn = StreamConnection(ours, "peer", io_size=1 << 20)
    payload = bytes(range(256)) * 200                      # 51,200 bytes
    try:
        theirs.sendall(b"HEAD" + payload[:100])
        head = conn.recv_exact(4, timeout_s=2.0)         # pulls the 100 bytes in too
        assert head == b"HEAD"

        def rest() -> None:
            time.sleep(0.2)
            theirs.sendall(payload[100:])
        sender = threading.Thread(target=rest)
        sender.start()
        started = time.monotonic()
        conn.read_ahead(len(payload), timeout_s=2.0, deadline_s=time.monotonic() + 2.0)
        assert time.monotonic() - started >= 0.15         # it waited for the rest to come
        out = bytearray(len(payload))
        conn.recv_into(memoryview(out), timeout_s=2.0)
        sender.join()
        assert out == payload
    finally:
        conn.close()
        theirs.close()


@pytest.mark.parametrize("family", [socket.AF_UNIX, socket.AF_INET])
def test_a_peer_that_trickles_is_cut_off_at_the_deadline(family):
    ours, theirs = connected(family)
    conn = StreamConnection(ours, "peer", io_size=1 << 20)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.05):
            try:
                theirs.sendall(b"x")
            except OSError:
                return
    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        started = time.monotonic()
        with pytest.raises(IOTimeout, match="of the first"):
            conn.read_ahead(1 << 20, timeout_s=2.0, deadline_s=time.monotonic() + 0.5)
        assert time.monotonic() - started < 1.5
    finally:
        stop.set()
        sender.join()
        conn.close()
        theirs.close()


def test_a_short_payload_waits_for_its_own_length_and_a_closed_peer_is_lost():
    ours, theirs = connected(socket.AF_UNIX)
    conn = StreamConnection(ours, "peer", io_size=1 << 20)
    try:
        theirs.sendall(b"abc")
        conn.read_ahead(3, timeout_s=1.0, deadline_s=time.monotonic() + 1.0)
        assert conn.recv_exact(3, timeout_s=1.0) == b"abc"
        theirs.sendall(b"de")
        theirs.close()
        with pytest.raises(ConnectionLost):
            conn.read_ahead(READ_AHEAD * 4, timeout_s=1.0, deadline_s=time.monotonic() + 1.0)
    finally:
        conn.close()

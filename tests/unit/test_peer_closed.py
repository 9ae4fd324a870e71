"""``StreamConnection.peer_closed``: what an unhashed arena read relies on to know that the
server held its lease through the copy (``gcache.sdk.leases.copy_held``)."""

from __future__ import annotations

import socket

import pytest

from gcache.transport.stream import StreamConnection


@pytest.mark.parametrize("family", [socket.AF_UNIX, socket.AF_INET])
def test_a_peer_that_closes_is_seen_at_once_and_an_open_one_never(family):
    if family == socket.AF_UNIX:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        ours = socket.create_connection(listener.getsockname())
        theirs, _ = listener.accept()
        listener.close()
    conn = StreamConnection(ours, "peer", io_size=1 << 20)
    try:
        assert conn.peer_closed() is False
        theirs.sendall(b"x")                       # unread bytes are not a closed peer
        assert conn.peer_closed() is False
        theirs.close()
        assert conn.peer_closed() is True
    finally:
        conn.close()
    assert conn.peer_closed() is True              # nor is our own closed end usable

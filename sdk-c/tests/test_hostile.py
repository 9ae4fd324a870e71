"""libgcache against lying servers (tests/fault/fake_server.py: the real frame codec, scripted
replies): every call is a miss, never a crash (the test program is built with ASan and UBSan),
over TCP and over a same-host Unix socket with an arena that does not hold what is announced."""

from __future__ import annotations

import json
import os
import struct

import pytest
from c_programs import run

from gcache.frame import GET_ENTRY, Header, Op, Status
from gcache.transport.shm import host_id
from tests.fault.fake_server import FakeServer

FACTS = json.dumps({"version": 2, "host_id": "elsewhere", "unix_socket": "",
                    "lease_ttl_ms": 5000}).encode()


def announce_too_much(request: Header) -> bytes:
    """A value longer than any client accepts, a table that does not add up, the wrong count."""
    if request.op == Op.GET:
        return Header(Op.GET, request.request_id, payload_len=1 << 40, length=1 << 40).pack()
    if request.op == Op.BATCH_GET:
        table = GET_ENTRY.pack(0, 5, 0) * request.count
        return Header(Op.BATCH_GET, request.request_id, payload_len=len(table) + 1,
                      count=request.count).pack() + table + b"x"
    if request.op == Op.EXISTS:
        return Header(Op.EXISTS, request.request_id, payload_len=request.count + 1).pack() \
            + bytes(request.count + 1)
    return Header(request.op, request.request_id + 1).pack()      # answers another request


def garbage(request: Header) -> bytes:
    return os.urandom(64 + request.request_id % 50)


def lying_lease(request: Header) -> bytes:
    """Extents past the end of the arena, and an ALLOC of another length."""
    if request.op == Op.LEASE:
        return Header(Op.LEASE, request.request_id, handle=1, offset=(1 << 20) - 10,
                      length=4096, checksum=0).pack()
    if request.op == Op.ALLOC:
        return Header(Op.ALLOC, request.request_id, handle=1, offset=0,
                      length=request.length + 1).pack()
    if request.op == Op.BATCH_LEASE:
        entry = struct.pack("<BQQQQ", 0, 1, 1 << 62, 1 << 20, 0)
        return Header(Op.BATCH_LEASE, request.request_id, payload_len=len(entry) * request.count,
                      count=request.count).pack() + entry * request.count
    return Header(request.op, request.request_id, Status.INTERNAL).pack()


@pytest.mark.parametrize("reply", [announce_too_much, garbage], ids=lambda f: f.__name__)
def test_lying_tcp_server_is_a_miss(reply):
    server = FakeServer(FACTS, reply)
    try:
        run("test_cross", "hostile", "--servers", server.address, "--transport", "tcp",
            "--timeout", "0.5", "--suspect", "0")
    finally:
        server.close()


@pytest.mark.parametrize("arena_bytes", [1 << 20, 1 << 30], ids=["lies-in-replies",
                                                                  "arena-larger-than-file"])
def test_lying_same_host_server_is_a_miss(tmp_path, arena_bytes):
    """The TCP facts send the client to a Unix socket whose HELLO passes a 1 MiB file as the
    arena: announced as 1 GiB it is refused before mapping; announced right, every extent the
    server then names lies outside it."""
    arena = tmp_path / "arena"
    arena.write_bytes(bytes(1 << 20))
    fd = os.open(arena, os.O_RDWR)
    path = str(tmp_path / "fake.sock")
    unix = FakeServer(json.dumps({"arena_bytes": arena_bytes, "arena_id": "fake",
                                  "lease_ttl_ms": 5000}).encode(), lying_lease,
                      unix_path=path, fd=fd)
    tcp = FakeServer(json.dumps({"host_id": host_id(), "unix_socket": path}).encode(),
                     lying_lease)
    try:
        run("test_cross", "hostile", "--servers", tcp.address, "--transport", "shm",
            "--timeout", "0.5", "--suspect", "0")
    finally:
        tcp.close()
        unix.close()
        os.close(fd)

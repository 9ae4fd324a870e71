"""The SDK facing a server that lies: every lie is a miss (None / False), never an exception,
and a reply announcing more than the value limit is refused before anything is allocated.

The fake server is a real socket speaking the real frame codec (``gcache.frame``), answering
HELLO with facts it chooses and every later request with one scripted reply.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from gcache import Client
from gcache.frame import GET_ENTRY, Header, Status
from gcache.transport.shm import host_id
from tests.fault.fake_server import FakeServer, Reply


def facts(**extra) -> bytes:
    base = {"version": 1, "host_id": "elsewhere", "unix_socket": "", "io_size": 1 << 20}
    base.update(extra)
    return json.dumps(base).encode()


def huge_get(request: Header) -> bytes:
    return Header(request.op, request.request_id, Status.OK, payload_len=1 << 40,
                  length=1 << 40).pack()


def huge_batch(request: Header) -> bytes:
    table = GET_ENTRY.pack(Status.OK, 1 << 40, 0) * request.count
    return Header(request.op, request.request_id, Status.OK,
                  payload_len=len(table) + (1 << 40) * request.count,
                  count=request.count).pack() + table


def huge_small_reply(request: Header) -> bytes:
    return Header(request.op, request.request_id, Status.OK, payload_len=1 << 40,
                  count=request.count).pack()


@pytest.fixture
def fake():
    started: list[FakeServer] = []

    def start(facts_payload: bytes, reply: Reply, **kwargs) -> FakeServer:
        server = FakeServer(facts_payload, reply, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@pytest.mark.parametrize("reply", [huge_get, huge_batch, huge_small_reply])
def test_a_reply_announcing_an_absurd_length_is_a_miss(fake, reply):
    server = fake(facts(), reply)
    with Client([server.address], timeout_s=1.0, transport="tcp") as client:
        assert client.get("k") is None
        assert client.get_into("k", bytearray(16)) is None
        assert client.batch_get(["a", "b"]) == [None, None]
        assert client.exists("k") is False
        assert client.stats()["misses_by_reason"].get("protocol", 0) >= 1


@pytest.mark.parametrize("payload", [b"{not json", b"[1, 2]", b'"text"',
                                     b'{"host_id": 7}', b'{"unix_socket": ["x"]}',
                                     b"\xff\xfe\x00"])
def test_malformed_hello_facts_are_a_miss(fake, payload):
    server = fake(payload, huge_get)
    with Client([server.address], timeout_s=1.0) as client:
        assert client.get("k") is None
        assert client.put("k", b"v") is False
        assert client.stats()["misses_by_reason"].get("protocol", 0) >= 1


def test_an_arena_larger_than_its_descriptor_is_refused_not_mapped(fake):
    """A same-host server that names a bigger arena than the file it passes: mapping it would
    turn a read past the file's end into a SIGBUS."""
    with tempfile.TemporaryDirectory() as folder:
        small = os.path.join(folder, "arena")
        with open(small, "wb") as fh:
            fh.write(b"\0" * 4096)
        fd = os.open(small, os.O_RDWR)
        unix_path = os.path.join(folder, "sock")
        local = facts(host_id=host_id(), arena_id="lie", arena_bytes=1 << 30)
        fake(local, huge_get, unix_path=unix_path, fd=fd)
        tcp = fake(facts(host_id=host_id(), unix_socket=unix_path), huge_get)
        try:
            with Client([tcp.address], timeout_s=1.0) as client:
                assert client.get("k") is None
                assert client.put("k", b"v" * 100) is False
        finally:
            os.close(fd)

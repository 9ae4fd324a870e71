"""Hostile and broken clients: the server drops or answers them and keeps serving everyone."""

import socket
import struct

import pytest

from gcache import Client
from gcache.frame import (
    FLAG_CHECKSUM_TRAILS,
    FLAG_PARENT,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    VERSION,
    Header,
    Op,
    Status,
    unpack_header,
)
from gcache.keys import checksum
from tests.helpers import wait_until


def raw_socket(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def read_reply(sock: socket.socket) -> Header | None:
    data = b""
    while len(data) < HEADER_SIZE:
        chunk = sock.recv(HEADER_SIZE - len(data))
        if not chunk:
            return None
        data += chunk
    return unpack_header(data, max_payload=1 << 40)


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True


@pytest.fixture
def server(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")
    address = cluster.addresses[0]
    with Client([address], timeout_s=2.0) as client:
        assert client.put("bystander", b"precious" * 1000)
        yield address, client
    assert cluster.servers[0].is_running(), "the server died"


def assert_still_serving(client: Client) -> None:
    assert client.get("bystander") == b"precious" * 1000
    assert client.put("after", b"ok") and client.get("after") == b"ok"


def test_garbage_bytes_get_an_error_and_a_closed_connection(server):
    address, client = server
    sock = raw_socket(address)
    sock.sendall(b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 64)
    reply = read_reply(sock)
    assert reply is not None and reply.status == Status.BAD_REQUEST
    assert closed_by_server(sock)
    assert_still_serving(client)


def test_a_header_declaring_a_terabyte_payload_is_refused_without_reading_it(server):
    address, client = server
    sock = raw_socket(address)
    sock.sendall(Header(Op.PUT, 1, key_len=1, payload_len=1 << 40).pack() + b"k")
    reply = read_reply(sock)
    assert reply is not None and reply.status == Status.BAD_REQUEST
    assert closed_by_server(sock)
    assert_still_serving(client)


def test_a_put_over_max_value_size_is_refused(server):
    address, client = server
    sock = raw_socket(address)
    sock.sendall(Header(Op.PUT, 1, key_len=1, payload_len=(1 << 30) + 1).pack() + b"k")
    reply = read_reply(sock)
    assert reply is not None and reply.status == Status.TOO_LARGE
    assert_still_serving(client)


def test_a_truncated_frame_then_disconnect_is_harmless(server):
    address, client = server
    sock = raw_socket(address)
    sock.sendall(Header(Op.GET, 1, key_len=5).pack()[:30])
    sock.close()
    sock = raw_socket(address)
    sock.sendall(Header(Op.GET, 1, key_len=5).pack() + b"ab")     # key cut short
    sock.close()
    assert_still_serving(client)


def test_disconnect_halfway_through_a_put_leaves_nothing_visible(server):
    address, client = server
    value = b"v" * (4 << 20)
    sock = raw_socket(address)
    sock.sendall(Header(Op.PUT, 1, key_len=4, payload_len=len(value),
                        checksum=checksum(value)).pack() + b"half" + value[:1 << 20])
    sock.close()
    assert client.get("half") is None             # never committed, whenever the server notices
    assert_still_serving(client)


def test_disconnect_between_alloc_and_commit_leaves_nothing_visible(server):
    address, client = server
    sock = raw_socket(address)
    sock.sendall(Header(Op.ALLOC, 1, key_len=5, length=8).pack() + b"alloc")
    alloc = read_reply(sock)
    assert alloc.status == Status.OK
    sock.sendall(Header(Op.WRITE, 2, payload_len=8, handle=alloc.handle).pack() + b"12345678")
    assert read_reply(sock).status == Status.OK
    sock.close()
    assert client.get("alloc") is None
    pins = lambda: client.server_stats()[address]["tier"]["pins"]  # noqa: E731
    wait_until(lambda: pins() == 0, timeout_s=5)    # the abandoned write pins nothing
    assert_still_serving(client)


def test_a_stalled_client_does_not_block_others(server):
    address, client = server
    sock = raw_socket(address)
    sock.sendall(Header(Op.PUT, 1, key_len=5, payload_len=1000).pack() + b"stall" + b"x" * 10)
    assert_still_serving(client)                  # while the stalled one waits mid-payload
    sock.close()


@pytest.mark.parametrize("fields,status", [
    ({"op": Op.GET, "key_len": 0}, Status.BAD_REQUEST),
    ({"op": Op.DELETE, "key_len": 1, "payload_len": 4}, Status.BAD_REQUEST),
    ({"op": Op.EXISTS, "count": 1, "payload_len": 5000}, Status.BAD_REQUEST),
    ({"op": Op.LIST, "count": 0}, Status.BAD_REQUEST),
    ({"op": Op.LIST, "count": 1, "payload_len": 1 << 30}, Status.BAD_REQUEST),
])
def test_malformed_requests_are_refused(server, fields, status):
    address, client = server
    sock = raw_socket(address)
    header = Header(request_id=9, **fields)
    sock.sendall(header.pack() + b"k" * header.key_len)
    reply = read_reply(sock)
    assert reply is not None and reply.status == status
    assert_still_serving(client)


def test_a_trailing_checksum_put_without_room_for_the_trailer_is_refused(server):
    address, client = server
    sock = raw_socket(address)
    sock.sendall(Header(Op.PUT, 1, flags=FLAG_CHECKSUM_TRAILS, key_len=1, payload_len=8).pack()
                 + b"k" + b"12345678")
    reply = read_reply(sock)
    assert reply is not None and reply.status == Status.BAD_REQUEST
    assert_still_serving(client)


def test_a_wrong_protocol_version_is_refused(server):
    address, client = server
    sock = raw_socket(address)
    sock.sendall(HEADER.pack(MAGIC, VERSION + 1, Op.GET, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0) + b"k")
    reply = read_reply(sock)
    assert reply is not None and reply.status == Status.BAD_REQUEST
    assert_still_serving(client)


def test_a_batch_put_whose_table_lies_is_refused(server):
    address, client = server
    sock = raw_socket(address)
    table = struct.pack("<HQQ", 1, 1 << 20, 0)          # claims 1 MiB but the frame carries 3 bytes
    sock.sendall(Header(Op.BATCH_PUT, 1, count=1, payload_len=len(table) + 3).pack() + table + b"k"
                 + b"vv")
    reply = read_reply(sock)
    assert reply is not None and reply.status == Status.BAD_REQUEST
    assert_still_serving(client)


@pytest.mark.parametrize("op", [Op.PUT, Op.ALLOC])
@pytest.mark.parametrize("field", [b"\x00", b"k\x05", b"kk\x40"],
                         ids=["no key", "parent past the field", "parent over 63 bytes"])
def test_a_parent_field_that_lies_is_refused(server, op, field):
    address, client = server
    sock = raw_socket(address)
    payload = b"vv" if op == Op.PUT else b""
    sock.sendall(Header(op, 1, flags=FLAG_PARENT, key_len=len(field), payload_len=len(payload),
                        length=2, checksum=checksum(b"vv")).pack() + field + payload)
    reply = read_reply(sock)
    assert reply is not None and reply.status == Status.BAD_REQUEST
    assert_still_serving(client)

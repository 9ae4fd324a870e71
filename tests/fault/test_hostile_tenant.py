"""A hostile tenant: a fuzzer holding a valid tenant token, sending frames hypothesis writes
(every opcode, flag and field, keys made of another tenant's internal prefix, the
administrator's escape, or random bytes) on connections it authenticated. It must never read,
change or learn of another tenant's values, and never take the server down."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gcache.frame import (
    FLAG_TENANT,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    VERSION,
    Header,
    Op,
    Status,
    unpack_header,
)
from gcache.tenant_token import tenant_proof, token_hash
from tests.fault.test_hostile_peers import raw_socket, rss_bytes
from tests.tenancy import CLUSTER_TOKEN, TenantCluster

pytestmark = pytest.mark.timeout(300)
SECRET = b"alice-secret-value-" * 8
MARK = b"\xff\xfe"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    with TenantCluster(tmp_path_factory.mktemp("hostile")) as cluster:
        alice, mallory = cluster.add("alice"), cluster.add("mallory")
        alice_id = next(t.id for t in cluster.link.tenants().tenants if t.name == "alice")
        with cluster.client(alice) as a:
            assert a.batch_put([f"a/{i}" for i in range(8)], [SECRET] * 8) == [True] * 8
            yield cluster, a, mallory, alice_id
            assert a.batch_get([f"a/{i}" for i in range(8)]) == [SECRET] * 8
        assert cluster.cluster.servers[0].is_running(), "the server died"


def _authenticated(address: str, token: str) -> socket.socket:
    """A raw socket past HELLO and a tenant's AUTH."""
    sock = raw_socket(address)
    sock.sendall(Header(Op.HELLO, 1).pack())
    reply = unpack_header(_recv(sock, HEADER_SIZE), max_payload=64)
    nonce = _recv(sock, reply.payload_len)
    body = tenant_proof(token_hash(token), nonce, "mallory") + b"mallory"
    sock.sendall(Header(Op.AUTH, 2, flags=FLAG_TENANT, payload_len=len(body)).pack() + body)
    reply = unpack_header(_recv(sock, HEADER_SIZE), max_payload=1 << 20)
    assert reply.status == Status.OK
    _recv(sock, reply.payload_len)
    return sock


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _keys(alice_id: int) -> st.SearchStrategy[bytes]:
    theirs = MARK + struct.pack(">I", alice_id)
    return st.one_of(
        st.sampled_from([b"a/0", b"a/1", theirs + b"a/0", MARK + b"\0\0\0\0a/0", theirs,
                         MARK, b"m/0"]),
        st.binary(min_size=1, max_size=40).map(lambda k: theirs + k),
        st.binary(min_size=0, max_size=64))


def _frames(alice_id: int) -> st.SearchStrategy[tuple[dict, bytes, list[bytes]]]:
    fields = st.fixed_dictionaries({
        "op": st.sampled_from([op.value for op in Op] + [0, 18, 99]),
        "version": st.sampled_from([VERSION, VERSION, VERSION, VERSION + 1]),
        "flags": st.integers(0, 0x7F), "status": st.integers(0, 12),
        "count": st.integers(0, 8),
        "payload_len": st.one_of(st.integers(0, 512), st.integers(0, 2**64 - 1)),
        "handle": st.integers(0, 64), "offset": st.integers(0, 2**20),
        "length": st.one_of(st.integers(0, 4096), st.integers(0, 2**64 - 1)),
        "checksum": st.integers(0, 2**64 - 1), "group": st.integers(0, 2**64 - 1)})
    return st.tuples(fields, st.binary(max_size=512), st.lists(_keys(alice_id), max_size=4))


def test_a_fuzzer_with_a_valid_tenant_token_never_reaches_another_tenant(hostile):
    cluster, alice, mallory, alice_id = hostile
    address, pid = cluster.address, cluster.cluster.servers[0].pid
    before = rss_bytes(pid)
    received: list[bytes] = []

    @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
    @given(frame=_frames(alice_id))
    def send(frame: tuple[dict, bytes, list[bytes]]) -> None:
        fields, body, keys = frame
        key = keys[0] if keys else b""
        keyed = b"".join(struct.pack("<H", len(k)) + k for k in keys if 0 < len(k) <= 1024)
        raw = HEADER.pack(MAGIC, fields["version"], fields["op"], fields["flags"],
                          fields["status"], 7, len(key), fields["count"] or len(keys),
                          fields["payload_len"], fields["handle"], fields["offset"],
                          fields["length"], fields["checksum"], fields["group"])
        sock = _authenticated(address, mallory)
        try:
            sock.sendall(raw + key + keyed + body)
            sock.settimeout(0.2)
            try:
                while chunk := sock.recv(1 << 16):
                    received.append(chunk)
            except OSError:
                pass
        finally:
            sock.close()

    send()
    assert not any(SECRET[:19] in chunk for chunk in received)
    assert alice.batch_get([f"a/{i}" for i in range(8)]) == [SECRET] * 8
    assert alice.put("a/after", b"fine") and alice.get("a/after") == b"fine"
    assert rss_bytes(pid) - before < 64 << 20
    stats = cluster.admin_stats()
    assert next(iter(stats.values()))["tenants"]["alice"]["memory_bytes"] > 0


def test_the_administrator_still_reads_every_tenant_after_the_fuzz(hostile):
    cluster, _alice, _, _ = hostile
    from tests.tenancy import exchange, raw_conn
    conn, _reply, _ = raw_conn(cluster.address, CLUSTER_TOKEN, as_tenant="alice")
    try:
        got, value = exchange(conn, Header(Op.GET, 3, key_len=3), b"a/0")
        assert got.status == Status.OK and value == SECRET
    finally:
        conn.close()

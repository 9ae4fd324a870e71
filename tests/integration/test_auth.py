"""The cluster token on the data plane: HMAC handshake, the arena only after it, loopback rule."""

import os
import subprocess
import sys

import pytest

from gcache import Client
from gcache.errors import GCacheError
from gcache.frame import HEADER_SIZE, Header, Op, Status, auth_proof, unpack_header
from gcache.transport.shm import connect_unix

TOKEN = "correct-horse-battery-staple"
SERVER_ARGS = ("--segment-size", "4MiB", "--lease-ttl", "1.0", "--token", TOKEN)


@pytest.fixture
def secured(cluster_factory):
    return cluster_factory(1, server_args=SERVER_ARGS)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_the_right_token_works_on_both_transports(secured, transport):
    with Client(secured.addresses, token=TOKEN, transport=transport) as client:
        assert client.put("k", b"v" * 100) and client.get("k") == b"v" * 100


@pytest.mark.parametrize("token", [None, "wrong-token-wrong-token"])
def test_a_missing_or_wrong_token_is_refused_and_counted(secured, token):
    with Client(secured.addresses, token=token) as client:
        assert client.put("k", b"v") is False and client.get("k") is None
        assert client.stats()["misses_by_reason"].get("auth", 0) >= 1
    with Client(secured.addresses, token=TOKEN) as client:       # the server is fine
        assert client.put("k", b"ok")


def hello(conn, request_id: int = 1):
    conn.send((Header(Op.HELLO, request_id).pack(),), timeout_s=2)
    raw, fds = conn.recv_fds(HEADER_SIZE, timeout_s=2)
    reply = unpack_header(raw, max_payload=1 << 20)
    return reply, bytes(conn.recv_exact(reply.payload_len, timeout_s=2)), fds


def unix_conn(cluster):
    return connect_unix(f"/tmp/{cluster.servers[0].shm_name}.sock", timeout_s=2, io_size=1 << 20)


def test_the_arena_descriptor_is_never_sent_before_a_valid_auth(secured):
    conn = unix_conn(secured)
    reply, nonce, fds = hello(conn)
    assert reply.status == Status.AUTH_REQUIRED and len(nonce) == 16 and fds == []
    proof = auth_proof("not-the-token-at-all", nonce)
    conn.send((Header(Op.AUTH, 2, payload_len=32).pack(), proof), timeout_s=2)
    raw, fds = conn.recv_fds(HEADER_SIZE, timeout_s=2)
    assert unpack_header(raw, max_payload=1 << 20).status == Status.AUTH_FAILED and fds == []
    conn.close()

    conn = unix_conn(secured)
    _, nonce, _ = hello(conn)
    conn.send((Header(Op.AUTH, 2, payload_len=32).pack(), auth_proof(TOKEN, nonce)), timeout_s=2)
    raw, fds = conn.recv_fds(HEADER_SIZE, timeout_s=2)
    assert unpack_header(raw, max_payload=1 << 20).status == Status.OK and len(fds) == 1
    for fd in fds:
        os.close(fd)
    conn.close()


def test_requests_before_auth_are_refused_and_the_connection_closed(secured):
    conn = unix_conn(secured)
    conn.send((Header(Op.GET, 1, key_len=1).pack(), b"k"), timeout_s=2)
    raw, fds = conn.recv_fds(HEADER_SIZE, timeout_s=2)
    assert unpack_header(raw, max_payload=1 << 20).status == Status.AUTH_REQUIRED and fds == []
    with pytest.raises(GCacheError):
        hello(conn, 2)                                 # closed by the server
    conn.close()


def run_server(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcache.server.main", "--memory", "16MiB",
                           "--segment-size", "4MiB", *args], capture_output=True, text=True,
                          timeout=20, env=env)


def test_without_a_token_a_server_refuses_to_listen_beyond_loopback():
    result = run_server("--listen", "0.0.0.0:0")
    assert result.returncode == 2
    assert "listen='0.0.0.0:0': is not a loopback address" in result.stderr
    result = run_server("--listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0")
    assert result.returncode == 2 and "metrics_listen='0.0.0.0:0'" in result.stderr


def test_a_short_token_is_refused_without_echoing_it():
    result = run_server("--listen", "127.0.0.1:0", "--token", "short")
    assert result.returncode == 2 and "at least 16 characters" in result.stderr
    assert "'short'" not in result.stderr                # the token itself is never echoed


def test_gcache_token_from_the_environment_secures_the_server(cluster_factory, monkeypatch):
    monkeypatch.setenv("GCACHE_TOKEN", TOKEN)          # inherited by the server process
    cluster = cluster_factory(1)
    monkeypatch.delenv("GCACHE_TOKEN")
    with Client(cluster.addresses) as client:
        assert client.put("k", b"v") is False
        assert client.stats()["misses_by_reason"]["auth"] >= 1
    with Client(cluster.addresses, token=TOKEN) as client:
        assert client.put("k", b"v")

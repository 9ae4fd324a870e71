"""Peers that try to cost a live server more than they send, or to touch another's data.

Each test pins a defect found by hostile clients: a late WRITE landing in reused memory,
trickling senders pinning the arena, silent connections locking out a token-protected server,
a header alone allocating its declared payload, handles used from another connection, a
second server on the same arena, and an ``--shm-name`` that is a path. Every test also checks
that a well-behaved client alongside is served.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

from gcache import Client
from gcache.frame import HEADER_SIZE, Header, Op, Status, unpack_header
from gcache.keys import checksum
from gcache.transport.stream import READ_AHEAD
from tests.helpers import wait_until

TOKEN = "hostile-peers-test-token-0123456789"


def raw_socket(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_reply(sock: socket.socket) -> Header | None:
    data = b""
    while len(data) < HEADER_SIZE:
        try:
            chunk = sock.recv(HEADER_SIZE - len(data))
        except (TimeoutError, ConnectionResetError):
            return None
        if not chunk:
            return None
        data += chunk
    return unpack_header(data, max_payload=1 << 40)


def is_closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def block(i: int, size: int) -> bytes:
    return (f"<{i}>".encode() * (size // 3 + 1))[:size]


def test_a_write_outliving_its_lease_never_lands_in_reused_memory(cluster_factory):
    cluster = cluster_factory(1, memory="16MiB", server_args=(
        "--segment-size", "4MiB", "--lease-ttl", "1.0", "--io-timeout", "10"))
    address = cluster.addresses[0]
    sock = raw_socket(address)
    sock.sendall(Header(Op.ALLOC, 1, key_len=4, length=3 << 20).pack() + b"late")
    alloc = read_reply(sock)
    assert alloc.status == Status.OK
    sock.sendall(Header(Op.WRITE, 2, payload_len=3 << 20, handle=alloc.handle).pack()
                 + b"\xee" * (1 << 20))
    time.sleep(2.0)                                      # twice the TTL, mid-receive
    expected = {f"v{i}": block(i, 1 << 20) for i in range(24)}   # 1.5x the arena: reuse
    with Client([address], timeout_s=2.0, transport="tcp") as client:
        for key, value in expected.items():
            assert client.put(key, value)
        # The late write is refused: cut off while room was short (it lagged: ``transfers``),
        # or, had room sufficed, its bytes counted for nothing and its COMMIT unknown.
        if not is_closed_by_server(sock, within_s=0.5):
            sock.settimeout(10)
            sock.sendall(b"\xee" * (2 << 20))            # the rest of the late payload
            reply = read_reply(sock)
            assert reply is not None and reply.status == Status.UNKNOWN_HANDLE
            sock.sendall(Header(Op.COMMIT, 3, handle=alloc.handle,
                                checksum=checksum(b"\xee" * (3 << 20))).pack())
            assert read_reply(sock).status == Status.UNKNOWN_HANDLE
    with Client([address], timeout_s=2.0, transport="tcp", verify_checksum=False) as reader:
        found = {k: v for k, v in zip(expected, reader.batch_get(list(expected)))
                 if v is not None}
    assert found and all(found[k] == expected[k] for k in found), "wrong bytes served"
    sock.close()


def trickle(address: str, key: bytes, length: int, stop: threading.Event,
            outcome: dict, *, first: int = 0) -> None:
    """A PUT whose payload arrives a few bytes a second (after ``first`` bytes at once), until
    the server cuts it off."""
    sock = raw_socket(address)
    sock.sendall(Header(Op.PUT, 1, key_len=len(key), payload_len=length).pack() + key
                 + b"x" * first)
    deadline = time.monotonic() + 20
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            sock.sendall(b"x")
            readable, _, _ = select.select([sock], [], [], 0.3)
            if readable and not sock.recv(4096):
                outcome[key] = "cut off"
                return
        outcome[key] = "stopped"
    except OSError:
        outcome[key] = "cut off"
    finally:
        sock.close()


def start_tricklers(address: str, stop: threading.Event, outcome: dict, *,
                    first: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=trickle, args=(address, f"slow{i}".encode(),
                                                      (3 << 20) + (1 << 19), stop, outcome),
                                kwargs={"first": first})
               for i in range(4)]                        # one 3.5 MiB extent per segment
    for thread in threads:
        thread.start()
    return threads


def all_cut_off(threads: list[threading.Thread], stop: threading.Event, outcome: dict) -> bool:
    stop.set()
    for thread in threads:
        thread.join(25)
    return all(outcome.get(f"slow{i}".encode()) == "cut off" for i in range(4))


def test_senders_that_trickle_from_the_start_pin_nothing_and_are_cut_off(cluster_factory):
    cluster = cluster_factory(1, memory="16MiB", server_args=(
        "--segment-size", "4MiB", "--io-timeout", "1", "--min-transfer-rate", "1MiB"))
    address = cluster.addresses[0]
    stop, outcome = threading.Event(), {}
    threads = start_tricklers(address, stop, outcome, first=0)
    try:
        with Client([address], timeout_s=2.0, transport="tcp") as client:
            for i in range(4):                           # a segment's worth each time
                time.sleep(0.2)
                assert client.server_stats()[address]["tier"]["pins"] == 0
                assert client.put(f"legit{i}", b"l" * (3 << 20))
            assert all(client.get(f"legit{i}") == b"l" * (3 << 20) for i in range(4))
            wait_until(lambda: len(outcome) == 4, 10, period_s=0.2)
    finally:
        cut_off = all_cut_off(threads, stop, outcome)
    assert cut_off, outcome


def test_senders_that_trickle_after_a_burst_are_cut_off_and_free_the_arena(cluster_factory):
    cluster = cluster_factory(1, memory="16MiB", server_args=(
        "--segment-size", "4MiB", "--io-timeout", "1", "--min-transfer-rate", "1MiB"))
    address = cluster.addresses[0]
    stop, outcome = threading.Event(), {}
    threads = start_tricklers(address, stop, outcome, first=READ_AHEAD)
    try:
        with Client([address], timeout_s=2.0, transport="tcp") as client:
            wait_until(lambda: client.server_stats()[address]["tier"]["pins"] >= 4, 5)
            # every segment held by a sender that lags: the claim cuts them off
            assert client.put("legit", b"l" * (1 << 20))
            assert client.get("legit") == b"l" * (1 << 20)
    finally:
        cut_off = all_cut_off(threads, stop, outcome)
    assert cut_off, outcome


def test_silent_connections_cannot_lock_out_a_token_protected_server(cluster_factory):
    cluster = cluster_factory(1, server_args=(
        "--segment-size", "4MiB", "--token", TOKEN, "--auth-timeout", "1.5",
        "--max-connections", "16", "--max-unauthenticated", "8"))
    address, pid = cluster.addresses[0], cluster.servers[0].pid
    rss_before = rss_bytes(pid)
    silent = [raw_socket(address) for _ in range(60)]    # never say a word
    with Client([address], token=TOKEN, timeout_s=2.0, transport="tcp") as client:
        for i in range(20):
            assert client.put(f"k{i}", b"v" * 1000) and client.get(f"k{i}") == b"v" * 1000
    assert rss_bytes(pid) - rss_before < 32 << 20
    late = raw_socket(address)                           # within its deadline: still open
    assert not is_closed_by_server(late, 0.3)
    assert is_closed_by_server(late, 4.0)                # then cut off at auth_timeout
    for sock in silent:
        sock.close()
    assert "conn.auth_timeout" in cluster.tail(cluster.servers[0], lines=400) or \
        "conn.unauthenticated_dropped" in cluster.tail(cluster.servers[0], lines=400)


def test_a_header_alone_allocates_nothing_it_declares(cluster_factory):
    cluster = cluster_factory(1)
    address, pid = cluster.addresses[0], cluster.servers[0].pid
    rss_before = rss_bytes(pid)
    socks = []
    for i in range(4):                                   # each declares 64 MiB of keys
        sock = raw_socket(address)
        sock.sendall(Header(Op.EXISTS, i, count=65535, payload_len=65535 * 1026).pack()
                     + b"\x01\x00k" * 10)
        socks.append(sock)
    time.sleep(1.0)
    grown = rss_bytes(pid) - rss_before
    with Client([address], timeout_s=2.0) as client:
        assert client.put("alongside", b"ok") and client.get("alongside") == b"ok"
    for sock in socks:
        sock.close()
    assert grown < 32 << 20, f"server grew {grown >> 20} MiB for headers alone"


def test_handles_work_only_on_the_connection_that_obtained_them(cluster_factory):
    cluster = cluster_factory(1)
    address = cluster.addresses[0]
    with Client([address], timeout_s=2.0) as client:
        assert client.put("leased", b"L" * 4096)
    owner, stranger = raw_socket(address), raw_socket(address)
    owner.sendall(Header(Op.ALLOC, 1, key_len=6, length=8).pack() + b"target")
    alloc = read_reply(owner)
    stranger.sendall(Header(Op.WRITE, 1, payload_len=8, handle=alloc.handle).pack() + b"hijacked")
    assert read_reply(stranger).status == Status.UNKNOWN_HANDLE
    stranger.sendall(Header(Op.COMMIT, 2, handle=alloc.handle,
                            checksum=checksum(b"\x00" * 8)).pack())
    assert read_reply(stranger).status == Status.UNKNOWN_HANDLE
    owner.sendall(Header(Op.LEASE, 2, key_len=6).pack() + b"leased")
    lease = read_reply(owner)
    assert lease.status == Status.OK
    stranger.sendall(Header(Op.RELEASE, 3, handle=lease.handle).pack())
    assert read_reply(stranger).status == Status.UNKNOWN_HANDLE
    stranger.sendall(Header(Op.READ, 4, handle=lease.handle, length=16).pack())
    assert read_reply(stranger).status == Status.UNKNOWN_HANDLE
    owner.sendall(Header(Op.READ, 3, handle=lease.handle, length=16).pack())   # still leased
    reply = read_reply(owner)
    assert reply.status == Status.OK and owner.recv(16, socket.MSG_WAITALL) == b"L" * 16
    owner.sendall(Header(Op.WRITE, 4, payload_len=8, handle=alloc.handle).pack() + b"own-data")
    assert read_reply(owner).status == Status.OK
    owner.sendall(Header(Op.COMMIT, 5, handle=alloc.handle, checksum=checksum(b"own-data")).pack())
    assert read_reply(owner).status == Status.OK
    with Client([address], timeout_s=2.0) as client:
        assert client.get("target") == b"own-data"
    owner.close()
    stranger.close()


def run_server(*args: str, timeout_s: float = 20.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcache.server.main", "--listen",
                           "127.0.0.1:0", "--memory", "16MiB", "--segment-size", "4MiB", *args],
                          capture_output=True, text=True, timeout=timeout_s)


def test_a_second_server_on_a_running_servers_arena_refuses_to_start(cluster_factory):
    cluster = cluster_factory(1)
    first = cluster.servers[0]
    with Client(cluster.addresses, timeout_s=2.0) as client:
        assert client.put("mine", b"first server's value")
    second = run_server("--memory", "64MiB", "--shm-name", first.shm_name)
    assert second.returncode == 2 and "in use by another running server" in second.stderr
    second = run_server("--memory", "64MiB", "--shm-name", f"{first.shm_name}-other",
                        "--unix-socket", f"/tmp/{first.shm_name}.sock")
    assert second.returncode == 2 and "another server is listening" in second.stderr
    for leftover in (f"/dev/shm/{first.shm_name}-other", f"/dev/shm/{first.shm_name}-other.key"):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass
    with Client(cluster.addresses, timeout_s=2.0, transport="shm") as client:
        assert client.get("mine") == b"first server's value"
        assert client.stats()["shm_servers"]


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "x" * 300])
def test_an_shm_name_that_is_not_a_plain_file_name_is_refused(name):
    # /dev/shm is shared with the suites running beside this one (SGLang's engine makes files
    # there), so only names this server could have made from its argument are looked for.
    stem = os.path.basename(name)
    before = {entry for entry in os.listdir("/dev/shm") if entry.startswith(stem)}
    result = run_server("--shm-name", name, "--unix-socket", "off")
    assert result.returncode == 2 and "shm_name" in result.stderr
    assert "must be a file name in /dev/shm" in result.stderr
    assert {entry for entry in os.listdir("/dev/shm") if entry.startswith(stem)} <= before
    assert name in before or not os.path.exists(os.path.normpath(f"/dev/shm/{name}"))
    assert not os.path.exists("/dev/escape")

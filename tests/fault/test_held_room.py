"""Room held by transfers in flight comes back when room is short, and no one connection holds
the arena (real servers, raw frames from peers that stall or trickle, the SDK for the others).

Before: a PUT stalled mid-payload held its span until the IO timeout, so values stored
meanwhile evicted older ones in its place (a 32 MiB PUT stalled for 12 s, then 90 puts of
1000 KiB into a 96 x 1 MiB arena: 78 readable afterwards); and eight peers that sent 64 KiB of a
PUT each and then trickled held every segment of an 8 MiB arena while another client stored 5 of
50 puts. Now a claim that finds no free room cuts off the transfers that lag, and a connection
may hold at most ``max_held_share`` of the arena.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time

from gcache.frame import HEADER_SIZE, Header, Op, Status, unpack_header
from gcache.keys import checksum
from gcache.sdk import Client
from tests.helpers import wait_until


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def stats(client: Client, address: str) -> dict:
    return client.server_stats()[address]


def test_a_stalled_put_gives_its_room_back_when_others_need_it(cluster_factory):
    cluster = cluster_factory(1, memory="96MiB", server_args=("--segment-size", "1MiB"))
    address = cluster.addresses[0]
    value = os.urandom(32 << 20)
    stalled = connect(address)                  # 20 MiB of a 32 MiB PUT, then nothing
    stalled.sendall(Header(Op.PUT, 1, key_len=3, payload_len=len(value),
                           checksum=checksum(value)).pack() + b"big" + value[:20 << 20])
    try:
        with Client([address], timeout_s=2.0, transport="tcp") as client:
            wait_until(lambda: stats(client, address)["tier"]["pins"] == 1, 5)
            time.sleep(1.5)                     # stalled well past a moment, within its grace
            values = {f"v{i}": os.urandom(1000 << 10) for i in range(90)}
            assert all(client.put(key, val) for key, val in values.items())
            readable = sum(client.get(key) == val for key, val in values.items())
            after = stats(client, address)
        assert readable == 90, (readable, after)
        assert after["server"]["transfers_cut_off"] == 1 and after["tier"]["pins"] == 0
    finally:
        stalled.close()


def trickle(address: str, key: bytes, length: int, stop: threading.Event,
            outcome: dict) -> None:
    """A PUT that sends 64 KiB at once, then a byte every 0.3 s until it is cut off."""
    sock = connect(address)
    sock.sendall(Header(Op.PUT, 1, key_len=len(key), payload_len=length).pack() + key
                 + b"x" * (64 << 10))
    try:
        while not stop.is_set():
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


def test_peers_that_trickle_cannot_hold_the_arena_against_another_client(cluster_factory):
    cluster = cluster_factory(1, memory="8MiB", server_args=("--segment-size", "1MiB"))
    address = cluster.addresses[0]
    stop, outcome = threading.Event(), {}
    threads = [threading.Thread(target=trickle, args=(address, f"slow{i}".encode(),
                                                      (1 << 20) - (8 << 10), stop, outcome))
               for i in range(8)]                # one segment each: every segment held
    for thread in threads:
        thread.start()
    try:
        with Client([address], timeout_s=2.0, transport="tcp") as client:
            wait_until(lambda: stats(client, address)["tier"]["pins"] == 8, 5)
            values = {f"legit{i}": os.urandom(64 << 10) for i in range(50)}
            stored = sum(bool(client.put(key, val)) for key, val in values.items())
            readable = sum(client.get(key) == val for key, val in values.items())
            cut_off = stats(client, address)["server"]["transfers_cut_off"]
        assert (stored, readable) == (50, 50), (stored, readable, outcome)
        assert cut_off == 8, outcome
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def test_one_connection_may_hold_at_most_its_share_of_the_arena(cluster_factory):
    """Leases and writes held by one connection stop at ``max_held_share`` of the arena (NO_SPACE
    past it, at once); another connection still finds room."""
    cluster = cluster_factory(1, memory="16MiB", server_args=(
        "--segment-size", "1MiB", "--max-held-share", "0.25"))
    address = cluster.addresses[0]
    hog = connect(address)
    try:
        granted = []
        for i in range(8):                      # 1 MiB each: the cap is 4 MiB
            hog.sendall(Header(Op.ALLOC, i + 1, key_len=4, length=(1 << 20) - 4096).pack()
                        + f"h{i:03d}".encode()[:4])
            reply = unpack_header(hog.recv(HEADER_SIZE, socket.MSG_WAITALL), max_payload=0)
            granted.append(reply.status)
        assert granted == [Status.OK] * 4 + [Status.NO_SPACE] * 4
        with Client([address], timeout_s=2.0, transport="tcp") as client:
            assert all(client.put(f"other{i}", b"o" * (1 << 20)) for i in range(12))
    finally:
        hog.close()

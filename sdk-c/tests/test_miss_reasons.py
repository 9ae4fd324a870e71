"""Each miss reason of libgcache, provoked for real: absent and no_space from a real server, a
checksum that does not hold and a reply that never comes from scripted servers
(tests/fault/fake_server.py), no_server from masters whose map has no server yet. (unreachable,
suspect and connection_lost: test_sdk_c.py's killed server; auth: its token test; protocol:
test_hostile.py.)"""

from __future__ import annotations

import json
import time

from c_programs import run

from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.frame import Header, Op, Status
from gcache.keys import checksum
from tests.fault.fake_server import FakeServer

FACTS = json.dumps({"host_id": "elsewhere", "unix_socket": ""}).encode()


def expect(op: str, key: str, reason: str, size: int, *where: str) -> None:
    run("test_cross", "expect", op, key, reason, str(size), *where, "--timeout", "0.5")


def test_absent_and_no_space_from_a_real_server(tmp_path):
    with LocalCluster(1, memory="16MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path)) as cluster:
        for transport in ("tcp", "shm"):
            where = ("--servers", cluster.addresses[0], "--transport", transport)
            expect("get", "never-put", "absent", 4096, *where)
            expect("put", "larger-than-memory", "no_space", 32 << 20, *where)
            expect("put", "fits", "ok", 1 << 20, *where)


def test_a_value_that_does_not_hash_to_its_checksum_is_a_miss():
    value = b"v" * 5000

    def corrupt(request: Header) -> bytes:
        return Header(Op.GET, request.request_id, payload_len=len(value), length=len(value),
                      checksum=checksum(value) ^ 1).pack() + value

    server = FakeServer(FACTS, corrupt)
    try:
        expect("get", "k", "checksum", 8192, "--servers", server.address, "--transport", "tcp")
    finally:
        server.close()


def test_a_reply_that_never_comes_is_a_timeout():
    def stall(request: Header) -> bytes:
        time.sleep(2)                      # past the client's 0.5 s IO timeout
        return Header(request.op, request.request_id, Status.NOT_FOUND).pack()

    server = FakeServer(FACTS, stall)
    try:
        expect("get", "k", "timeout", 4096, "--servers", server.address, "--transport", "tcp")
    finally:
        server.close()


def test_no_server_in_the_map_is_no_server(tmp_path):
    with LocalMasters(1, log_dir=str(tmp_path)) as masters:
        expect("put", "k", "no_server", 100, "--master", masters.spec)

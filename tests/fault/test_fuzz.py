"""Fuzzing with hypothesis, bounded: a stateful model of the protocol and mutated frames against
a live server, and the SDK against a fake server whose replies hypothesis writes.

The server must never die, never answer against the model, and keep its memory bounded; a
well-behaved client alongside sees no errors. The SDK must turn every reply it cannot trust into
a miss (None / False), never an exception.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from gcache import Client
from gcache.errors import InvalidRequest
from gcache.frame import HEADER, MAGIC, VERSION, Header, Op, Status
from gcache.keys import checksum
from gcache.sdk import protocol
from gcache.sdk.protocol import Channel
from gcache.transport.tcp import connect
from tests.fault.fake_server import FakeServer
from tests.fault.test_hostile_peers import raw_socket, rss_bytes

KEYS = st.sampled_from([f"key{i}".encode() for i in range(6)])
VALUES = st.binary(min_size=1, max_size=8192)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from gcache.cli.local_cluster import LocalCluster
    with LocalCluster(1, memory="64MiB", server_args=("--segment-size", "4MiB", "--lease-ttl",
                                                      "30"),
                      log_dir=str(tmp_path_factory.mktemp("fuzz"))) as cluster:
        with Client(cluster.addresses, timeout_s=2.0) as bystander:
            assert bystander.put("bystander", b"precious" * 512)
            yield cluster, bystander
        assert cluster.servers[0].is_running(), "the server died"


def still_serving(bystander: Client) -> None:
    assert bystander.get("bystander") == b"precious" * 512


class ProtocolModel(RuleBasedStateMachine):
    """Requests of every kind on one connection, checked against a dict."""

    address = ""
    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self.ch = Channel(connect(self.address, timeout_s=5, io_size=1 << 20), timeout_s=5)
        self.model: dict[bytes, bytes] = {}
        for key in [f"key{i}".encode() for i in range(6)]:
            protocol.delete(self.ch, key)                 # each run starts from nothing

    def teardown(self) -> None:
        self.ch.conn.close()

    @rule(key=KEYS, value=VALUES)
    def put(self, key: bytes, value: bytes) -> None:
        assert protocol.put(self.ch, key, memoryview(value), io_size=4096) == Status.OK
        self.model[key] = value

    @rule(key=KEYS)
    def get(self, key: bytes) -> None:
        found = protocol.read_value(self.ch, key, None, verify=True)
        if key in self.model:
            assert found is not None and found.checksum_ok
            assert bytes(found.data[:found.length]) == self.model[key]
        else:
            assert found is None

    @rule(key=KEYS)
    def delete(self, key: bytes) -> None:
        assert protocol.delete(self.ch, key) == (key in self.model)
        self.model.pop(key, None)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=8))
    def exists(self, keys: list[bytes]) -> None:
        assert protocol.exists(self.ch, keys) == [k in self.model for k in keys]

    @rule(key=KEYS, value=VALUES, cuts=st.lists(st.integers(0, 8192), max_size=3),
          reverse=st.booleans(), commit=st.booleans())
    def split_write(self, key: bytes, value: bytes, cuts: list[int], reverse: bool,
                    commit: bool) -> None:
        alloc = self.ch.reply(self.ch.request(Op.ALLOC, key=key, length=len(value)))
        assert alloc.status == Status.OK
        bounds = sorted({0, len(value), *(c % len(value) for c in cuts)})
        pieces = list(itertools.pairwise(bounds))
        for start, end in reversed(pieces) if reverse else pieces:
            reply = self.ch.reply(self.ch.request(Op.WRITE, payload=(value[start:end],),
                                                  handle=alloc.handle, offset=start))
            assert reply.status == Status.OK
        if commit:
            reply = self.ch.reply(self.ch.request(Op.COMMIT, handle=alloc.handle,
                                                  checksum=checksum(value)))
            assert reply.status == Status.OK
            self.model[key] = value

    @rule(target=handles, key=KEYS)
    def lease(self, key: bytes) -> int:
        reply = self.ch.reply(self.ch.request(Op.LEASE, key=key))
        if key not in self.model:
            assert reply.status == Status.NOT_FOUND
            return 0
        assert reply.status == Status.OK and reply.length == len(self.model[key])
        return reply.handle

    @rule(handle=handles)
    def release(self, handle: int) -> None:
        reply = self.ch.reply(self.ch.request(Op.RELEASE, handle=handle))
        assert reply.status in (Status.OK, Status.UNKNOWN_HANDLE)

    @rule(handle=st.integers(1, 1 << 62), op=st.sampled_from([Op.WRITE, Op.COMMIT,
                                                               Op.RELEASE, Op.READ]))
    def foreign_handle(self, handle: int, op: Op) -> None:
        payload = (b"x" * 8,) if op == Op.WRITE else ()
        reply = self.ch.reply(self.ch.request(op, payload=payload, handle=handle, length=8))
        assert reply.status == Status.UNKNOWN_HANDLE

    @rule(keys=st.lists(KEYS, min_size=1, max_size=6, unique=True), value=VALUES)
    def batch(self, keys: list[bytes], value: bytes) -> None:
        statuses = protocol.batch_put(self.ch, keys, [memoryview(value)] * len(keys),
                                      [checksum(value)] * len(keys))
        assert statuses == [Status.OK] * len(keys)
        self.model.update(dict.fromkeys(keys, value))
        found = protocol.batch_read_values(self.ch, keys, None, verify=True)
        assert [bytes(f.data[:f.length]) for f in found] == [value] * len(keys)

    @invariant()
    def in_sync(self) -> None:
        assert protocol.exists(self.ch, [b"key0"]) == [b"key0" in self.model]


def test_a_stateful_model_of_the_protocol_agrees_with_the_server(live):
    cluster, bystander = live
    ProtocolModel.address = cluster.addresses[0]
    run_state_machine_as_test(ProtocolModel, settings=settings(
        max_examples=25, stateful_step_count=30, deadline=None,
        suppress_health_check=list(HealthCheck)))
    still_serving(bystander)


_FIELDS = st.fixed_dictionaries({
    "op": st.integers(0, 20), "version": st.sampled_from([VERSION, VERSION, VERSION + 1]),
    "flags": st.integers(0, 7), "status": st.integers(0, 12),
    "request_id": st.integers(0, 2**32 - 1), "key_len": st.integers(0, 1100),
    "count": st.integers(0, 65535),
    "payload_len": st.one_of(st.integers(0, 4096), st.integers(0, 2**64 - 1)),
    "handle": st.integers(0, 2**64 - 1), "offset": st.integers(0, 2**64 - 1),
    "length": st.one_of(st.integers(0, 4096), st.integers(0, 2**64 - 1)),
    "checksum": st.integers(0, 2**64 - 1), "group": st.integers(0, 2**64 - 1)})


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(fields=_FIELDS, body=st.binary(max_size=2048), authenticate_first=st.booleans())
def _send_mutated(address: str, fields: dict, body: bytes, authenticate_first: bool) -> None:
    frame = HEADER.pack(MAGIC, fields["version"], fields["op"], fields["flags"],
                        fields["status"], fields["request_id"], fields["key_len"],
                        fields["count"], fields["payload_len"], fields["handle"],
                        fields["offset"], fields["length"], fields["checksum"],
                        fields["group"])
    sock = raw_socket(address)
    try:
        if authenticate_first:
            sock.sendall(Header(Op.HELLO, 1).pack())
        sock.sendall(frame + body)
        sock.settimeout(0.2)
        try:
            sock.recv(1 << 16)
        except OSError:
            pass
    finally:
        sock.close()


def test_mutated_frames_never_take_the_server_down_or_its_memory_up(live):
    cluster, bystander = live
    pid = cluster.servers[0].pid
    before = rss_bytes(pid)
    _send_mutated(cluster.addresses[0])
    still_serving(bystander)
    assert bystander.put("after-fuzz", b"ok") and bystander.get("after-fuzz") == b"ok"
    assert rss_bytes(pid) - before < 64 << 20


def test_many_short_connections_do_not_grow_the_server(live):
    cluster, bystander = live
    pid = cluster.servers[0].pid
    for _ in range(300):                              # warm up the allocator first
        raw_socket(cluster.addresses[0]).close()
    before = rss_bytes(pid)
    for i in range(3000):
        sock = raw_socket(cluster.addresses[0])
        if i % 2:
            sock.sendall(Header(Op.EXISTS, 1, count=1, payload_len=5).pack() + b"\x03\x00abc")
            sock.recv(64)
        sock.close()
    still_serving(bystander)
    assert rss_bytes(pid) - before < 24 << 20


# ---- the SDK facing replies written by hypothesis ----------------------------------------------

_REPLY = st.fixed_dictionaries({
    "same_id": st.booleans(), "same_op": st.booleans(), "status": st.integers(0, 12),
    "count": st.integers(0, 70000), "payload_len": st.one_of(st.integers(0, 64),
                                                             st.integers(0, 2**64 - 1)),
    "handle": st.integers(0, 2**64 - 1), "offset": st.integers(0, 2**64 - 1),
    "length": st.one_of(st.integers(0, 64), st.integers(0, 2**64 - 1)),
    "checksum": st.integers(0, 2**64 - 1), "magic_ok": st.booleans()})


def _scripted(fields: dict, body: bytes):
    def reply(request: Header) -> bytes:
        op = request.op if fields["same_op"] else (request.op % 16) + 1
        request_id = request.request_id if fields["same_id"] else request.request_id + 1
        frame = HEADER.pack(MAGIC if fields["magic_ok"] else MAGIC ^ 1, VERSION, op, 0,
                            fields["status"], request_id, 0, fields["count"] % 65536,
                            fields["payload_len"], fields["handle"], fields["offset"],
                            fields["length"], fields["checksum"], 0)
        return frame + body
    return reply


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(fields=_REPLY, body=st.binary(max_size=256),
       hello=st.one_of(st.just(b'{"version": 1, "host_id": "elsewhere"}'),
                       st.binary(max_size=64),
                       st.dictionaries(st.sampled_from(["host_id", "unix_socket",
                                                        "arena_bytes", "lease_ttl_ms"]),
                                       st.one_of(st.integers(), st.text(max_size=8),
                                                 st.none()))
                       .map(lambda d: json.dumps(d).encode())))
def test_the_sdk_turns_any_reply_into_a_result_or_a_miss(fields, body, hello):
    server = FakeServer(hello, _scripted(fields, body))
    try:
        with Client([server.address], timeout_s=0.05, suspect_s=0, transport="tcp") as client:
            value = client.get("k")
            assert value is None or isinstance(value, bytes)
            try:
                length = client.get_into("k", bytearray(64))
                assert length is None or 0 <= length <= 64
            except InvalidRequest as exc:     # documented: an ``out`` too small for the value
                assert "out is 64 bytes" in str(exc)
            assert isinstance(client.put("k", b"v" * 32), bool)
            assert isinstance(client.exists("k"), bool)
            assert isinstance(client.delete("k"), bool)
            assert len(client.batch_get(["a", "b"])) == 2
            assert len(client.batch_put(["a", "b"], [b"x", b"y"])) == 2
    finally:
        server.close()


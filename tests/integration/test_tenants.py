"""Tenants on the data plane: a connection reaches only the keys of the tenant it proved,
whatever it sends; the administrator reaches everything; a revoked or removed tenant is cut off
within one table refresh. Real masters and servers (``tests.tenancy``)."""

from __future__ import annotations

import os
import random
import struct
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gcache import Client
from gcache.cli.ports import free_ports
from gcache.errors import GCacheError
from gcache.frame import (
    FLAG_PARENT,
    FLAG_TENANT,
    GET_ENTRY,
    LEASE_ENTRY,
    PUT_ENTRY,
    Header,
    Op,
    Status,
    with_parent,
)
from gcache.keys import checksum
from gcache.master_client import MasterClient
from gcache.transport.shm import connect_unix
from tests.helpers import wait_until
from tests.tenancy import CLUSTER_TOKEN, TenantCluster, encode_keys, exchange, raw_conn

pytestmark = pytest.mark.timeout(300)
MARK = b"\xff\xfe"


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    (port,) = free_ports(1)
    with TenantCluster(tmp_path_factory.mktemp("tenants"),
                       server_args=("--unreachable-sweep", "0.2", "--metrics-listen",
                                    f"127.0.0.1:{port}")) as cluster:
        cluster.tokens = {name: cluster.add(name) for name in ("alice", "bob")}
        cluster.metrics_url = f"http://127.0.0.1:{port}/metrics"
        yield cluster


def test_two_tenants_k_are_two_values_and_neither_learns_of_the_other(tenants):
    alice, bob = tenants.tokens["alice"], tenants.tokens["bob"]
    with tenants.client(alice) as a, tenants.client(bob) as b, \
            Client(tenants.cluster.addresses, token=CLUSTER_TOKEN, timeout_s=2.0) as admin:
        assert a.put("iso/k", b"alice's")
        assert b.get("iso/k") is None and not b.exists("iso/k")
        assert b.batch_get(["iso/k"]) == [None] and b.batch_exists(["iso/k"]) == [False]
        assert not b.delete("iso/k")                       # nothing of bob's to delete
        assert b.put("iso/k", b"bob's")                    # bob's own k, not an overwrite
        assert b.batch_put(["iso/k2"], [b"bob's 2"]) == [True]
        assert a.get("iso/k") == b"alice's" and b.get("iso/k") == b"bob's"
        assert a.get("iso/k2") is None and a.batch_get(["iso/k", "iso/k2"]) == [b"alice's", None]
        assert admin.get("iso/k") is None                  # the administrator's own key space
        assert b.delete("iso/k") and a.get("iso/k") == b"alice's"
        out = bytearray(16)
        assert b.get_into("iso/k", out) is None


def test_the_administrator_reaches_a_tenants_keys_by_acting_as_it(tenants):
    alice = tenants.tokens["alice"]
    with tenants.client(alice) as a:
        assert a.put("admin/k", b"v" * 40)
    conn, reply, _ = raw_conn(tenants.address, CLUSTER_TOKEN, as_tenant="alice")
    try:
        assert reply.status == Status.OK
        got, value = exchange(conn, Header(Op.GET, 3, key_len=7), b"admin/k")
        assert got.status == Status.OK and value == b"v" * 40
    finally:
        conn.close()


def test_a_tenant_gets_no_way_into_the_arena(tenants):
    """Same host: no arena descriptor, no Unix socket, no NIXL offer; its values go by TCP."""
    sock = f"/tmp/{tenants.cluster.servers[0].shm_name}.sock"
    conn = connect_unix(sock, timeout_s=5, io_size=1 << 20)
    try:
        conn.send((Header(Op.HELLO, 1).pack(),), timeout_s=5)
        from gcache.frame import HEADER_SIZE, unpack_header
        from gcache.tenant_token import tenant_proof, token_hash
        raw, fds = conn.recv_fds(HEADER_SIZE, timeout_s=5)
        nonce = bytes(conn.recv_exact(unpack_header(raw, max_payload=64).payload_len,
                                      timeout_s=5))
        token = tenants.tokens["bob"]
        body = tenant_proof(token_hash(token), nonce, "bob") + b"bob"
        conn.send((Header(Op.AUTH, 2, flags=FLAG_TENANT, payload_len=len(body)).pack(), body),
                  timeout_s=5)
        raw, fds = conn.recv_fds(HEADER_SIZE, timeout_s=5)
        reply = unpack_header(raw, max_payload=1 << 20)
        facts = bytes(conn.recv_exact(reply.payload_len, timeout_s=5))
        assert reply.status == Status.OK and fds == []
        assert b'"unix_socket": ""' in facts and b"nixl" not in facts
    finally:
        conn.close()
    with tenants.client(tenants.tokens["bob"]) as b:
        assert b.put("arena/k", b"x") and b.get("arena/k") == b"x"
        assert not b.stats()["shm_servers"]


def test_hand_made_frames_reach_only_the_senders_tenant(tenants):
    """Bob names alice's key every way a frame can: as she does, as the server keeps it
    internally (MARK + her id), as a parent, in every list; he finds nothing of hers."""
    with tenants.client(tenants.tokens["alice"]) as a:
        assert a.put("hand/k", b"alice-secret")
    alice_id = tenants.link.tenants().tenants
    alice_id = next(t.id for t in alice_id if t.name == "alice")
    internal = MARK + struct.pack(">I", alice_id) + b"hand/k"
    conn, reply, _facts = raw_conn(tenants.address, tenants.tokens["bob"])
    assert reply.status == Status.OK
    try:
        rid = 10
        for key in (b"hand/k", internal, MARK + struct.pack(">I", 0) + b"hand/k"):
            rid += 1
            for op in (Op.GET, Op.LEASE):
                got, _ = exchange(conn, Header(op, rid, key_len=len(key)), key)
                assert got.status == Status.NOT_FOUND, (op, key)
            got, _ = exchange(conn, Header(Op.DELETE, rid, key_len=len(key)), key)
            assert got.status == Status.NOT_FOUND
            keys = encode_keys([key, b"hand/k"])
            for op in (Op.EXISTS, Op.PREFETCH):      # each answers a byte per key: 0 absent
                got, present = exchange(conn, Header(op, rid, count=2,
                                                     payload_len=len(keys)), keys)
                assert present == b"\0\0", op
            got, body = exchange(conn, Header(Op.BATCH_GET, rid, count=2,
                                              payload_len=len(keys)), keys)
            assert [GET_ENTRY.unpack_from(body, i * GET_ENTRY.size)[0] for i in (0, 1)] == \
                [Status.NOT_FOUND, Status.NOT_FOUND] and b"alice" not in body
            got, body = exchange(conn, Header(Op.BATCH_LEASE, rid, count=2,
                                              payload_len=len(keys)), keys)
            assert [LEASE_ENTRY.unpack_from(body, i * LEASE_ENTRY.size)[0]
                    for i in (0, 1)] == [Status.NOT_FOUND, Status.NOT_FOUND]
            got, _listed = exchange(conn, Header(Op.LIST, rid, count=100, key_len=len(key)),
                                   key)
            assert got.count == 0
        # a PUT of her key's name through the parent-carrying path, and of her internal key:
        # bob's own keys (parent links: the next test)
        value = b"bob-overwrites?"
        field = with_parent(b"hand/k", b"")
        got, _ = exchange(conn, Header(Op.PUT, 99, flags=FLAG_PARENT, key_len=len(field),
                                       payload_len=len(value), checksum=checksum(value)),
                          field, value)
        assert got.status == Status.OK
        table = PUT_ENTRY.pack(len(internal), len(value), checksum(value))
        got, statuses = exchange(conn, Header(Op.BATCH_PUT, 100, count=1,
                                              payload_len=len(table) + len(internal)
                                              + len(value)), table, internal, value)
        assert statuses == b"\0"
    finally:
        conn.close()
    with tenants.client(tenants.tokens["alice"]) as a:
        assert a.get("hand/k") == b"alice-secret"


def test_a_parent_link_resolves_in_the_childs_own_tenant(tenants):
    """Bob's page hanging from "par/p": alice holds a "par/p", bob does not, so bob's page can
    no longer hit (the sweep counts it); once bob puts his own "par/p" it can."""
    def unreachable() -> int:
        return next(iter(tenants.admin_stats().values()))["tier"]["unreachable_objects"]
    before = unreachable()
    with tenants.client(tenants.tokens["alice"]) as a:
        assert a.put("par/p", b"alice's parent")
    conn, _reply, _ = raw_conn(tenants.address, tenants.tokens["bob"])
    try:
        value = b"bob's child"
        field = with_parent(b"par/c", b"par/p")
        got, _ = exchange(conn, Header(Op.PUT, 5, flags=FLAG_PARENT, key_len=len(field),
                                       payload_len=len(value), checksum=checksum(value)),
                          field, value)
        assert got.status == Status.OK
    finally:
        conn.close()
    wait_until(lambda: unreachable() == before + 1, 15)
    with tenants.client(tenants.tokens["bob"]) as b:
        assert b.put("par/p", b"bob's parent")
    wait_until(lambda: unreachable() == before, 15)


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_identities_are_refused_and_the_server_stays_up(tenants, seed):
    """AUTH frames with made-up names, proofs of the wrong tenant, truncated or oversized
    payloads, and flags: never a tenant's scope without its proof."""
    rng = random.Random(seed)
    alice, bob = tenants.tokens["alice"], tenants.tokens["bob"]
    from gcache.tenant_token import admin_as_tenant_proof, tenant_proof, token_hash
    for _ in range(40):
        conn = raw_conn_unauthenticated(tenants.address)
        try:
            nonce = conn.nonce
            name = rng.choice([b"alice", b"bob", b"carol", b"", b"al\xffice",
                               os.urandom(rng.randrange(1, 40))])
            proof = rng.choice([os.urandom(32), tenant_proof(token_hash(bob), nonce, "bob"),
                                tenant_proof(token_hash(alice), nonce[::-1], "alice"),
                                admin_as_tenant_proof("not-the-cluster-token!", nonce,
                                                      "alice")])
            body = (proof + name)[:rng.choice([len(proof + name), 31, 32, 100])]
            flags = rng.choice([FLAG_TENANT, 0, 0xFF])
            try:
                got, _ = exchange(conn.conn, Header(Op.AUTH, 2, flags=flags,
                                                    payload_len=len(body)), body)
            except GCacheError:
                continue                      # dropped after its refusal: fine
            if got.status == Status.OK:
                # only bob's own proof of bob opens anything, and it opens bob's keys only
                assert name == b"bob" and proof == tenant_proof(token_hash(bob), nonce, "bob")
                _reply, value = exchange(conn.conn, Header(Op.GET, 3, key_len=6), b"hand/k")
                assert value != b"alice-secret"
            else:
                assert got.status in (Status.AUTH_FAILED, Status.BAD_REQUEST)
        finally:
            conn.conn.close()
    with tenants.client(alice) as a:
        assert a.put("fuzz/alive", b"1") and a.get("fuzz/alive") == b"1"


class _Unauthenticated:
    def __init__(self, address: str) -> None:
        from gcache.transport.tcp import connect
        self.conn = connect(address, timeout_s=5, io_size=1 << 20)
        reply, self.nonce = exchange(self.conn, Header(Op.HELLO, 1))
        assert reply.status == Status.AUTH_REQUIRED


def raw_conn_unauthenticated(address: str) -> _Unauthenticated:
    return _Unauthenticated(address)


def test_stat_shows_a_tenant_only_its_own_figures(tenants):
    with tenants.client(tenants.tokens["bob"]) as b:
        assert b.put("stat/k", b"z" * 1000) and b.get("stat/k")
        mine = next(iter(s for s in b.server_stats().values() if s))["tenants"]
    assert list(mine) == ["bob"] and mine["bob"]["hits"] >= 1 and mine["bob"]["puts"] >= 1
    everyone = next(iter(tenants.admin_stats().values()))["tenants"]
    assert {"alice", "bob", "_admin"} <= set(everyone)
    assert everyone["bob"]["memory_bytes"] > 0


def test_prometheus_has_each_tenants_figures_under_a_tenant_label(tenants):
    with tenants.client(tenants.tokens["alice"]) as a:
        assert a.put("prom/k", b"p" * 5000) and a.get("prom/k") and a.get("prom/none") is None
    request = urllib.request.Request(tenants.metrics_url,
                                     headers={"Authorization": f"Bearer {CLUSTER_TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(answer.read().decode())
                   for s in family.samples}
    assert samples["gcache_server_tenant_bytes", (("tenant", "alice"), ("tier", "memory"))] > 0
    for name in ("hits", "misses", "puts"):
        assert samples[f"gcache_server_tenant_{name}_total", (("tenant", "alice"),)] >= 1
    for name in ("evictions", "refusals"):
        assert (f"gcache_server_tenant_{name}_total", (("tenant", "bob"),)) in samples
    assert ("gcache_server_tenant_quota_bytes", (("tenant", "_admin"), ("tier", "disk"))) \
        in samples


def test_a_tenants_token_opens_the_cluster_map_and_nothing_else_of_the_masters(tenants):
    with MasterClient(tenants.masters.addresses, token=tenants.tokens["bob"]) as link:
        assert link.cluster_map().servers
        for call in (lambda: link.tenants(), lambda: link.add_tenant("mallory"),
                     lambda: link.drain("s-x"), lambda: link.status()):
            with pytest.raises(GCacheError, match="only the cluster map"):
                call()
    with MasterClient(tenants.masters.addresses, token="bob.forged-secret-forged-secret-x") \
            as link, pytest.raises(GCacheError):
        link.cluster_map()


def test_a_revoked_tenant_is_refused_after_one_refresh_and_a_removed_ones_values_go(tenants):
    token = tenants.add("carol", memory_quota_bytes=8 << 20)
    with tenants.client(token) as c:
        assert c.put("rev/k", b"carol" * 100) and c.get("rev/k")
        tenants.link.revoke_tenant("carol")
        # the servers' next heartbeat answer carries the new table version
        wait_until(lambda: c.get("rev/k") is None, 10)
        assert c.stats()["misses_by_reason"].get("auth", 0) >= 1
    conn, reply, _ = raw_conn(tenants.address, token)
    assert reply.status == Status.AUTH_FAILED
    conn.close()
    conn, reply, _ = raw_conn(tenants.address, CLUSTER_TOKEN, as_tenant="carol")
    try:                           # the administrator still reads what a revoked tenant left
        got, value = exchange(conn, Header(Op.GET, 3, key_len=5), b"rev/k")
        assert got.status == Status.OK and value == b"carol" * 100
    finally:
        conn.close()
    new = tenants.link.set_tenant("carol", new_token=True).token
    wait_until(lambda: _reads(tenants, new, "rev/k") == b"carol" * 100, 10)
    def objects() -> int:
        return next(iter(tenants.admin_stats().values()))["tier"]["objects"]
    before = objects()
    tenants.link.remove_tenant("carol")
    tenants.wait_known("carol", present=False)
    wait_until(lambda: objects() == before - 1, 10)          # the server deleted its value
    tenants.add("carol")                     # the same name again: a new id, none of the old
    conn, reply, _ = raw_conn(tenants.address, CLUSTER_TOKEN, as_tenant="carol")
    try:
        got, _ = exchange(conn, Header(Op.GET, 3, key_len=5), b"rev/k")
        assert got.status == Status.NOT_FOUND
    finally:
        conn.close()


def test_a_new_token_ends_the_connections_opened_with_the_old_one(tenants):
    """``gcache tenant set --new-token`` is what an operator runs for a leaked token: a client
    connected with the old one is refused from the next refresh on, not only new ones."""
    old = tenants.add("dave")
    with tenants.client(old) as c:
        assert c.put("rot/k", b"dave" * 100) and c.get("rot/k") == b"dave" * 100
        new = tenants.link.set_tenant("dave", new_token=True).token
        wait_until(lambda: c.get("rot/k") is None, 10)
        assert c.stats()["misses_by_reason"].get("auth", 0) >= 1
    conn, reply, _ = raw_conn(tenants.address, old)
    assert reply.status == Status.AUTH_FAILED
    conn.close()
    assert _reads(tenants, new, "rot/k") == b"dave" * 100


def _reads(tenants: TenantCluster, token: str, key: str) -> bytes | None:
    with tenants.client(token) as c:
        return c.get(key)


def test_an_engines_extra_config_takes_a_tenant_token(tenants):
    """The connectors' settings (``gcache_token``) give an engine's client the tenant's scope."""
    from gcache.kv import client_from_settings, gcache_settings
    with tenants.client(tenants.tokens["alice"]) as a:
        assert a.put("engine/k", b"alice's page")
    for name, expected in (("alice", b"alice's page"), ("bob", None)):
        settings = gcache_settings({"gcache_master": tenants.masters.spec,
                                    "gcache_token": tenants.tokens[name],
                                    "gcache_timeout_ms": 2000})
        with client_from_settings(settings) as engine:
            assert engine.get("engine/k") == expected

"""libgcache (the C SDK) against real gcache-server processes on 127.0.0.1, and against the
Python SDK: the C test programs are built with AddressSanitizer and UndefinedBehaviorSanitizer
(``make -C sdk-c test`` builds them, then runs this file from the repository root).

- the shared conformance vectors and the bounded fuzz loop of the reply decoders;
- every operation over TCP and over shared memory (``test_client``);
- values put from C read from Python, and the reverse, byte-identical, over TCP and shm;
- the same key on the same server from both SDKs, with static servers and with masters;
- a killed server as a fast miss, a token refused, lying servers as misses.
"""

from __future__ import annotations

import pytest
from c_programs import SIZES, TRANSPORTS, VECTORS, run, value_of

from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.sdk import Client
from gcache.transport.shm import host_id
from tests.helpers import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(2, memory="256MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path_factory.mktemp("logs"))) as started:
        yield started


def servers(cluster: LocalCluster) -> list[str]:
    return ["--servers", ",".join(cluster.addresses)]


def test_shared_vectors_hold_for_libgcache():
    assert ", 0 failed" in run("test_vectors", str(VECTORS))


def test_hostile_replies_never_crash_the_decoders():
    assert ", 0 failed" in run("fuzz_reply", "5000")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_operation(cluster, transport):
    assert ", 0 failed" in run("test_client", *servers(cluster), "--transport", transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_values_put_from_c_are_read_from_python(cluster, transport):
    prefix, n = f"c2py-{transport}", 24
    run("test_cross", "xput", prefix, str(n), *servers(cluster), "--transport", transport)
    with Client(cluster.addresses, timeout_s=2.0, transport=transport) as client:
        for i in range(n):
            key = f"{prefix}/{i}"
            group = f"{prefix}-group" if i % 3 == 0 else None
            assert client.get(key, group=group) == value_of(key, SIZES[i % len(SIZES)]), key
        assert client.stats()["transports"] == dict.fromkeys(cluster.addresses, transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_values_put_from_python_are_read_from_c(cluster, transport):
    prefix, n = f"py2c-{transport}", 24
    with Client(cluster.addresses, timeout_s=2.0, transport=transport) as client:
        for i in range(n):
            key = f"{prefix}/{i}"
            group = f"{prefix}-group" if i % 3 == 0 else None
            assert client.put(key, value_of(key, SIZES[i % len(SIZES)]), group=group)
    run("test_cross", "xget", prefix, str(n), *servers(cluster), "--transport", transport)


def test_both_sdks_place_keys_on_the_same_servers(cluster):
    lines = run("test_cross", "owners", "300", *servers(cluster)).splitlines()
    assert len(lines) == 300
    with Client(cluster.addresses) as client:
        for i, line in enumerate(lines):
            key, owner = line.split()
            assert owner == client.owner(key, group="owners-group" if i % 3 == 0 else None)


def test_host_id_is_the_servers(cluster):
    assert run("test_cross", "hostid").strip() == host_id()


def test_killed_server_is_a_fast_miss(tmp_path):
    with LocalCluster(2, memory="64MiB", log_dir=str(tmp_path)) as private:
        with Client(private.addresses, timeout_s=2.0, transport="tcp") as client:
            for i in range(40):
                key = f"dead/{i}"
                assert client.put(key, value_of(key, 4096))
        dead = private.addresses[0]
        private.kill(0)
        run("test_cross", "dead", dead, "40", *servers(private), "--transport", "tcp",
            "--timeout", "0.5")


@pytest.mark.parametrize("mode", ["good", "bad", "none"])
def test_the_cluster_token(tmp_path, mode):
    token = "c-sdk-cluster-token-s3cret"
    with LocalCluster(1, memory="64MiB", server_args=("--token", token),
                      log_dir=str(tmp_path)) as private:
        given = {"good": ["--token", token], "bad": ["--token", "wrong"], "none": []}[mode]
        for transport in TRANSPORTS:
            run("test_cross", "auth", mode, *servers(private), "--transport", transport, *given)


def test_a_tenant_token_scopes_libgcaches_keys(tmp_path):
    """libgcache given a tenant's token (``<name>.<secret>``) proves the tenant (AUTH with the
    TENANT flag) and reaches that tenant's keys only, through the masters' map (which a
    tenant's token opens); its values go over TCP even on this host."""
    from tests.tenancy import CLUSTER_TOKEN, TenantCluster
    with TenantCluster(tmp_path) as cluster:
        alice, bob = cluster.add("alice"), cluster.add("bob")
        run("test_cross", "xput", "tenant", "6", "--master", cluster.masters.spec,
            "--token", alice)
        run("test_cross", "xget", "tenant", "6", "--master", cluster.masters.spec,
            "--token", alice)
        keys = [f"tenant/{i}" for i in range(6)]
        groups = ["tenant-group" if i % 3 == 0 else None for i in range(6)]
        with cluster.client(alice) as a, cluster.client(bob) as b, \
                Client(cluster.cluster.addresses, token=CLUSTER_TOKEN, timeout_s=2.0) as admin:
            for key, group, size in zip(keys, groups, SIZES, strict=False):
                assert a.get(key, group=group) == value_of(key, size), key
                assert b.get(key, group=group) is None and admin.get(key) is None
        run("test_cross", "auth", "bad", "--servers", cluster.address, "--transport", "tcp",
            "--token", alice[:-1] + ("A" if alice[-1] != "A" else "B"))


def test_keys_follow_the_masters_map(tmp_path):
    with LocalMasters(1, log_dir=str(tmp_path / "masters")) as masters, \
            LocalCluster(2, memory="64MiB", master=masters.spec,
                         log_dir=str(tmp_path / "servers")) as private, \
            Client(master=masters.spec, timeout_s=2.0) as client:
        wait_until(lambda: len(client.stats()["servers"]) == 2, 30)
        lines = run("test_cross", "owners", "100", "--master", masters.spec).splitlines()
        for i, line in enumerate(lines):
            key, owner = line.split()
            assert owner == client.owner(key, group="owners-group" if i % 3 == 0 else None)
        run("test_cross", "xput", "viamap", "8", "--master", masters.spec)
        for i in range(8):
            key = f"viamap/{i}"
            group = "viamap-group" if i % 3 == 0 else None
            assert client.get(key, group=group) == value_of(key, SIZES[i]), key
        assert set(private.addresses) == set(client.stats()["servers"])

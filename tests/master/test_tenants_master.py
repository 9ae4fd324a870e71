"""The tenant table in the masters: the ``gcache tenant`` commands as an operator types them,
and tenants, quotas and their servers' enforcement surviving a leader kill and a master
restart. Real masters and servers on loopback."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from gcache.errors import GCacheError
from gcache.master_client import MasterClient
from gcache.proto import master_pb2 as pb
from tests.helpers import wait_until
from tests.tenancy import CLUSTER_TOKEN, TenantCluster

pytestmark = pytest.mark.timeout(300)
TOKEN_SHAPE = re.compile(r"^[a-z][a-z0-9_-]*\.[A-Za-z0-9_-]{43}$")


def gcache(*args: str, token: str | None = CLUSTER_TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GCACHE_TOKEN"}
    if token is not None:
        env["GCACHE_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "gcache.cli", *args], capture_output=True,
                          env=env, timeout=60, check=False)


def test_the_tenant_commands(tmp_path):
    with TenantCluster(tmp_path) as cluster:
        spec = cluster.masters.spec
        added = gcache("tenant", "add", "alice", "--memory-quota", "64MiB", "--disk-quota",
                       "1GiB", "--master", spec)
        assert added.returncode == 0, added.stderr
        lines = added.stdout.decode().splitlines()
        assert len(lines) == 1 and TOKEN_SHAPE.match(lines[0]) and lines[0].startswith("alice.")
        token = lines[0]
        listed = gcache("tenant", "ls", "--master", spec).stdout.decode()
        assert re.search(r"alice\s+1\s+active\s+64MiB\s+1GiB", listed), listed
        assert gcache("tenant", "set", "alice", "--memory-quota", "32MiB",
                      "--master", spec).returncode == 0
        assert "32MiB" in gcache("tenant", "ls", "--master", spec).stdout.decode()
        again = gcache("tenant", "add", "alice", "--master", spec)
        assert again.returncode == 2 and b"exists already" in again.stderr
        bad = gcache("tenant", "add", "Alice!", "--master", spec)
        assert bad.returncode == 2 and b"tenant name" in bad.stderr
        refused = gcache("tenant", "ls", "--master", spec, token=token)
        assert refused.returncode == 2 and b"only the cluster map" in refused.stderr
        cluster.wait_known("alice")
        with cluster.client(token) as c:
            assert c.put("k", b"v") and c.get("k") == b"v"
        assert gcache("tenant", "revoke", "alice", "--master", spec).returncode == 0
        assert "revoked" in gcache("tenant", "ls", "--master", spec).stdout.decode()
        renewed = gcache("tenant", "set", "alice", "--new-token", "--master", spec)
        new_token = renewed.stdout.decode().strip()
        assert TOKEN_SHAPE.match(new_token) and new_token != token
        assert gcache("tenant", "rm", "alice", "--master", spec).returncode == 0
        assert "alice" not in gcache("tenant", "ls", "--master", spec).stdout.decode()
        missing = gcache("tenant", "rm", "alice", "--master", spec)
        assert missing.returncode == 2 and b"no tenant" in missing.stderr


def test_tenants_need_a_cluster_token(tmp_path):
    from gcache.cli.local_masters import LocalMasters
    env = {k: v for k, v in os.environ.items() if k != "GCACHE_TOKEN"}
    with LocalMasters(1, env=env, log_dir=str(tmp_path)) as masters:
        refused = gcache("tenant", "add", "alice", "--master", masters.spec, token=None)
        assert refused.returncode == 2 and b"need a cluster token" in refused.stderr


def test_tenants_and_quotas_survive_a_leader_kill_and_a_master_restart(tmp_path):
    with TenantCluster(tmp_path, n_masters=3) as cluster:
        wait_until(lambda: leader_index(cluster.masters) is not None, 15)
        alice = cluster.add("alice", memory_quota_bytes=16 << 20, disk_quota_bytes=1 << 30)
        cluster.add("bob", memory_quota_bytes=8 << 20)
        before = {t.name: t for t in cluster.link.tenants().tenants}
        with cluster.client(alice) as a:
            assert a.put("survive/k", b"alice's")
        old = leader_index(cluster.masters)
        assert old is not None
        cluster.masters.kill(old)
        wait_until(lambda: leader_index(cluster.masters) not in (None, old), 15)
        for member in cluster.masters.members:
            if member.index == old:
                continue
            with MasterClient([member.listen], token=CLUSTER_TOKEN) as link:
                wait_until(lambda link=link: _table(link) == before, 10)
        with cluster.client(alice) as a:            # the map through the survivors, the data
            assert a.get("survive/k") == b"alice's"   # plane as it was
        carol = cluster.add("carol")                 # a new id, after the others'
        ids = {t.name: t.id for t in cluster.link.tenants().tenants}
        assert ids["carol"] > max(ids["alice"], ids["bob"])
        cluster.masters.restart(old)                 # it replays its journal, then catches up
        with MasterClient([cluster.masters.members[old].listen], token=CLUSTER_TOKEN) as link:
            wait_until(lambda: set(_table(link)) == {"alice", "bob", "carol"}, 20)
            assert _table(link)["alice"] == before["alice"]
        with cluster.client(carol) as c:
            assert c.put("survive/k", b"carol's") and c.get("survive/k") == b"carol's"
        stats = cluster.admin_stats()
        row = next(iter(stats.values()))["tenants"]
        assert row["alice"]["memory_quota_bytes"] == 16 << 20
        assert row["alice"]["disk_quota_bytes"] == 1 << 30


def leader_index(masters: object) -> int | None:
    """The member that leads, asked with the cluster token; None during an election."""
    for member in masters.members:                   # type: ignore[attr-defined]
        if not member.is_running():
            continue
        try:
            with MasterClient([member.listen], token=CLUSTER_TOKEN, timeout_s=1.0) as link:
                if link.status().is_leader:
                    return int(member.index)
        except GCacheError:
            continue
    return None


def _table(link: MasterClient) -> dict[str, pb.Tenant]:
    try:
        return {t.name: t for t in link.tenants().tenants}
    except GCacheError:
        return {}


def test_a_drain_hands_each_tenants_keys_over_into_that_tenants_space(tmp_path):
    """The draining server places a tenant's key by the key the tenant sees and sends it as
    that tenant: afterwards each tenant reads its own values from the remaining servers, the
    other's never. A removed tenant's values were deleted already (the drain would skip any)."""
    with TenantCluster(tmp_path, n_servers=3) as cluster:
        alice, bob = cluster.add("alice"), cluster.add("bob")
        gone = cluster.add("gone")
        keys = [f"d/{i}" for i in range(90)]
        with cluster.client(alice, map_refresh_s=0.2) as a, \
                cluster.client(bob, map_refresh_s=0.2) as b, \
                cluster.client(gone) as g:
            assert a.batch_put(keys, [f"alice {k}".encode() for k in keys]) == [True] * 90
            assert b.batch_put(keys[:30], [f"bob {k}".encode() for k in keys[:30]]) == \
                [True] * 30
            assert g.batch_put(keys[:30], [b"gone"] * 30) == [True] * 30
            cluster.link.remove_tenant("gone")
            cluster.wait_known("gone", present=False)
            victim = next(s for s in cluster.link.status().servers
                          if s.address == cluster.cluster.addresses[1])
            out = subprocess.run([sys.executable, "-m", "gcache.cli", "drain", victim.id,
                                  "--master", cluster.masters.spec, "--wait", "60"],
                                 capture_output=True, text=True, timeout=120,
                                 env=dict(os.environ, GCACHE_TOKEN=CLUSTER_TOKEN))
            assert out.returncode == 0, out.stderr
            wait_until(lambda: victim.address not in a.stats()["servers"] and
                       victim.address not in b.stats()["servers"], 10)
            assert a.batch_get(keys) == [f"alice {k}".encode() for k in keys]
            assert b.batch_get(keys) == [f"bob {k}".encode() for k in keys[:30]] + [None] * 60
        log = cluster.cluster.tail(cluster.cluster.servers[1], 50)
        assert "failed=0 dropped=0" in log

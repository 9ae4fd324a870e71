"""Tenants' memory quotas under pressure, on a real server: a tenant flooding the cache loses its
own surplus and never another tenant's values held within that tenant's quota; pinned values
count against their tenant; each tenant's bytes are counted again after a restart."""

from __future__ import annotations

import pytest

from tests.helpers import wait_until
from tests.tenancy import TenantCluster

pytestmark = pytest.mark.timeout(300)
MiB = 1 << 20
VALUE = 128 << 10


@pytest.fixture
def quota_cluster(tmp_path):
    with TenantCluster(tmp_path, memory="48MiB") as cluster:
        yield cluster


def figures(cluster: TenantCluster) -> dict[str, dict[str, int]]:
    return next(iter(cluster.admin_stats().values()))["tenants"]


def flood(cluster: TenantCluster, alice: str, bob: str) -> tuple[int, int]:
    """Alice puts her 8 MiB hot set; bob writes 80 MiB (ten times 8 MiB) in 128 KiB values
    while alice reads her set after every 20 MiB of his (less than the 48 MiB arena turns
    over in). Her (hits, reads)."""
    hot = [f"hot/{i}" for i in range(64)]
    with cluster.client(alice) as a, cluster.client(bob) as b:
        assert a.batch_put(hot, [bytes([i]) * VALUE for i in range(64)]) == [True] * 64
        reads = hits = 0
        for i in range(10 * 8 * MiB // VALUE):                   # 640 values of bob's
            assert b.put(f"flood/{i}", b"b" * VALUE)
            if i % 160 == 159:
                got = a.batch_get(hot)
                reads += len(got)
                hits += sum(g == bytes([j]) * VALUE for j, g in enumerate(got))
        # bob's oldest values went; his newest are still his
        assert b.get("flood/639") == b"b" * VALUE and b.get("flood/0") is None
    return hits, reads


def test_a_flooding_tenant_loses_its_own_surplus_and_never_anothers_hot_set(quota_cluster):
    """Bob writes ten times his 8 MiB quota while alice reads her 8 MiB hot set, within her
    16 MiB quota: every one of her reads hits, and what goes is bob's."""
    alice = quota_cluster.add("alice", memory_quota_bytes=16 * MiB)
    bob = quota_cluster.add("bob", memory_quota_bytes=8 * MiB)
    hits, reads = flood(quota_cluster, alice, bob)
    assert reads == 4 * 64 and hits == reads
    row = figures(quota_cluster)
    assert row["alice"]["evicted_objects"] == 0 and row["bob"]["evicted_objects"] > 300
    assert row["alice"]["hits"] >= reads and row["alice"]["memory_bytes"] >= 8 * MiB


def test_without_quotas_the_same_flood_takes_the_oldest_values_of_anyone(quota_cluster):
    """The control: the same two tenants without quotas share the arena by age, and bob's
    flood takes alice's set with the rest (her reads between his puts come too late)."""
    alice, bob = quota_cluster.add("alice"), quota_cluster.add("bob")
    hits, reads = flood(quota_cluster, alice, bob)
    assert reads == 4 * 64 and hits < reads
    assert figures(quota_cluster)["alice"]["evicted_objects"] > 0


def test_pinned_values_count_against_their_tenant(quota_cluster):
    """Pinned values are never evicted, so a tenant may pin no more than its memory quota
    (whole spans of 1 MiB here): past it a pinned put is refused, and counted a refusal."""
    token = quota_cluster.add("files", memory_quota_bytes=4 * MiB)
    with quota_cluster.client(token) as c:
        stored = [c.put(f"pin/{i}", b"p" * VALUE, pinned=True) for i in range(48)]
    assert stored[0] and not all(stored)
    row = figures(quota_cluster)["files"]
    assert row["pinned_bytes"] <= 4 * MiB and row["refusals"] >= 1
    assert sum(stored) * VALUE <= 4 * MiB


def test_each_tenants_bytes_are_counted_again_after_a_restart(quota_cluster):
    alice = quota_cluster.add("alice", memory_quota_bytes=16 * MiB)
    bob = quota_cluster.add("bob", memory_quota_bytes=8 * MiB)
    with quota_cluster.client(alice) as a, quota_cluster.client(bob) as b:
        assert a.batch_put([f"r/{i}" for i in range(20)], [b"a" * VALUE] * 20) == [True] * 20
        assert b.batch_put([f"r/{i}" for i in range(5)], [b"b" * VALUE] * 5) == [True] * 5
    before = figures(quota_cluster)
    quota_cluster.cluster.kill(0)
    quota_cluster.cluster.restart(0)
    quota_cluster.wait_known("bob")
    after = figures(quota_cluster)
    for name in ("alice", "bob"):
        assert after[name]["memory_bytes"] == before[name]["memory_bytes"] > 0
        assert after[name]["memory_quota_bytes"] == before[name]["memory_quota_bytes"]
    with quota_cluster.client(alice) as a, quota_cluster.client(bob) as b:
        wait_until(lambda: a.get("r/0") == b"a" * VALUE, 10)
        assert b.get("r/0") == b"b" * VALUE and b.get("r/10") is None


def test_a_tenant_at_its_disk_quota_drops_its_own_oldest_values_from_disk(tmp_path):
    """Behind a cold tier: a tenant whose values overflow memory to disk keeps no more than its
    disk quota there, its own oldest values going first; another tenant's disk values stay."""
    disk = tmp_path / "disk"
    disk.mkdir()
    with TenantCluster(tmp_path / "c", memory="8MiB",
                       server_args=("--disk-dir", str(disk))) as cluster:
        other = cluster.add("other", disk_quota_bytes=16 * MiB)
        token = cluster.add("big", disk_quota_bytes=4 * MiB)
        with cluster.client(other) as o:
            assert o.batch_put([f"o/{i}" for i in range(16)], [b"o" * VALUE] * 16) == \
                [True] * 16
        with cluster.client(token) as c:
            for i in range(192):                                  # 24 MiB through 8 MiB
                assert c.put(f"big/{i}", b"x" * VALUE)
            wait_until(lambda: figures(cluster)["big"]["disk_bytes"] > 2 * MiB, 15)
            assert figures(cluster)["big"]["disk_bytes"] <= 4 * MiB
            assert c.get("big/0") is None and c.get("big/191") == b"x" * VALUE
        with cluster.client(other) as o:
            assert o.batch_get([f"o/{i}" for i in range(16)]) == [b"o" * VALUE] * 16

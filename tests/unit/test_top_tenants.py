"""``gcache top``'s tenant table from two polls of STAT's ``tenants`` (pure)."""

from gcache.cli.top_tenants import tenant_lines


def stat(**tenants: dict) -> dict:
    base = dict.fromkeys(("memory_bytes", "memory_quota_bytes", "disk_bytes",
                          "disk_quota_bytes", "pinned_bytes", "evicted_objects", "hits",
                          "misses", "puts", "refusals"), 0)
    return {"tenants": {name: {**base, **row} for name, row in tenants.items()}}


def test_one_row_per_tenant_summed_over_servers_with_interval_rates():
    before = {"s1": stat(alice={"hits": 10}, _admin={}), "s2": stat(alice={"hits": 5})}
    after = {"s1": stat(alice={"hits": 30, "misses": 10, "memory_bytes": 1 << 20,
                               "memory_quota_bytes": 8 << 20, "puts": 20},
                        _admin={}),
             "s2": stat(alice={"hits": 25, "memory_bytes": 1 << 20,
                               "memory_quota_bytes": 8 << 20}),
             "s3": None}
    lines = tenant_lines(before, after, 2.0)
    row = next(line for line in lines if line.startswith("alice"))
    # memory summed over servers, the quota per server; 40 of 50 reads hit; 20 puts in 2 s
    assert row.split() == ["alice", "2.0MiB", "8.0MiB", "0B", "-", "80.0%", "10", "0", "0"]


def test_nothing_without_tenants():
    assert tenant_lines({"s1": stat(_admin={})}, {"s1": stat(_admin={"hits": 3})}, 1.0) == []

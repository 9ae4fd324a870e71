"""How a batch is cut into requests (``Dispatcher.plan``): by owner; for a put with a group per
key by owner and group, since a put request carries one placement group for all its keys (a
draining server hands each key on by it)."""

from __future__ import annotations

from gcache.config import ClientConfig
from gcache.sdk.dispatch import Dispatcher
from gcache.sdk.metrics import ClientStats

SERVERS = tuple(f"127.0.0.1:{7000 + i}" for i in range(4))


def dispatcher() -> Dispatcher:
    return Dispatcher(ClientConfig(servers=SERVERS), ClientStats())


def test_a_group_per_key_cuts_requests_by_owner_and_group():
    d = dispatcher()
    try:
        keys = [f"k{i}".encode() for i in range(64)]
        groups = [b"tree-a" if i < 20 else b"tree-b" if i < 50 else None for i in range(64)]
        puts = d.plan(keys, groups, one_group_each=True)
        assert sorted(i for _, idx in puts for i in idx) == list(range(64))
        for address, idx in puts:
            assert len({groups[i] for i in idx}) == 1
            assert all(d.owner(keys[i], groups[i]) == address for i in idx)
        reads = d.plan(keys, groups)                  # one request per server
        assert sorted(i for _, idx in reads for i in idx) == list(range(64))
        assert len({a for a, _ in reads}) == len(reads) < len(puts)
        assert all(d.owner(keys[i], groups[i]) == a for a, idx in reads for i in idx)
        one = d.plan(keys, b"tree-a")
        assert all(d.owner(keys[i], b"tree-a") == a for a, idx in one for i in idx)
        assert len(one) <= d.config.group_width
    finally:
        d.close()


def test_a_batch_reads_copies_run_in_jobs_of_one_link_and_a_few_mib():
    from gcache.sdk.batch import COPY_JOB_BYTES, _copy_jobs
    from gcache.sdk.leases import Extent
    a, b = object(), object()                      # two links (only their identity matters)
    page = COPY_JOB_BYTES // 4
    copies = [(a, i, Extent(1, i * page, page), None) for i in range(6)]
    copies += [(b, 6, Extent(2, 0, page), None), (a, 7, Extent(1, 0, 10), None)]
    jobs = _copy_jobs(copies)
    assert [[c[1] for c in job] for job in jobs] == [[0, 1, 2, 3], [4, 5], [6], [7]]
    assert [c for job in jobs for c in job] == copies          # every copy once, in order
    assert _copy_jobs([]) == []

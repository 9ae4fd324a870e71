"""``gcache.transport.PinnedPool`` on host memory (``pin=False``: the bookkeeping is the same
with pinning, which needs a CUDA host; tests/gpu covers that)."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch")

from gcache.transport.pinned import DONE, PinnedPool, PoolExhausted

KIB = 1 << 10


class _Pending:
    """A copy's event that has not completed yet (what a busy CUDA stream reports)."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def test_the_pool_reuses_a_buffer_only_after_its_copy_is_done():
    pool = PinnedPool(pin=False, cap_bytes=1 << 20)
    first = pool.take(100 * KIB)
    assert first.numel() == 100 * KIB and pool.allocations == 1
    copy = _Pending()
    pool.give(first, after=copy)
    second = pool.take(90 * KIB)                       # same size class, copy still running
    assert second.data_ptr() != first.data_ptr() and pool.allocations == 2
    copy.done = True
    third = pool.take(120 * KIB)
    assert third.data_ptr() == first.data_ptr() and pool.allocations == 2
    pool.give(second)
    pool.give(third)
    assert pool.take(1).data_ptr() not in (first.data_ptr(), second.data_ptr())  # 64 KiB class
    assert pool.allocated_bytes == 2 * 128 * KIB + 64 * KIB


def test_at_its_cap_the_pool_waits_for_a_buffer_then_gives_up():
    pool = PinnedPool(pin=False, cap_bytes=256 * KIB)
    a, b = pool.take(128 * KIB), pool.take(128 * KIB)
    with pytest.raises(PoolExhausted, match="256 KiB|262144"):
        pool.take(100 * KIB, timeout_s=0.05)
    threading.Timer(0.05, pool.give, args=(a,)).start()   # comes back while the take waits
    c = pool.take(100 * KIB, timeout_s=5.0)
    assert c.data_ptr() == a.data_ptr() and pool.allocations == 2
    with pytest.raises(PoolExhausted, match="cap"):
        pool.take(300 * KIB)                               # can never fit: at once
    pool.give(b, after=DONE)
    pool.give(c)
    small = pool.take(64 * KIB)                            # another class: free ones make room
    assert pool.allocated_bytes <= 256 * KIB and small.numel() == 64 * KIB


def test_every_buffer_made_is_announced_and_every_one_dropped_is_too():
    # The hooks a client registers its staging with (NIXL): what was announced and not yet
    # dropped is exactly what the pool holds, and a failing hook costs nothing but a log line.
    made, dropped = [], []
    pool = PinnedPool(pin=False, cap_bytes=256 * KIB, on_new=made.append,
                      on_drop=dropped.append)
    a = pool.take(100 * KIB)                              # a 128 KiB buffer
    assert [m.data_ptr() for m in made] == [a.data_ptr()] and not dropped
    pool.give(a)
    b = pool.take(200 * KIB)                              # 256 KiB: the free one must go
    assert [d.data_ptr() for d in dropped] == [a.data_ptr()]
    assert [m.data_ptr() for m in made] == [a.data_ptr(), b.data_ptr()]
    pool.give(b)

    def refuse(buffer):
        raise RuntimeError("registration refused")

    failing = PinnedPool(pin=False, cap_bytes=256 * KIB, on_new=refuse)
    assert failing.take(10 * KIB).numel() == 10 * KIB

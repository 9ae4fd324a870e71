"""How the data-plane benchmarks time an operation: the same loop for GCache and for the
baselines that run in their own environments (``bench/mooncake_store.py``)."""

from __future__ import annotations

import threading
import time


def threaded_gbps(n_threads: int, per_thread_ops: int, size: int, op) -> float:
    """Run ``op(thread_index, i)`` per_thread_ops times in each of n_threads; total GB/s."""
    barrier = threading.Barrier(n_threads + 1)

    def worker(t: int) -> None:
        barrier.wait()
        for i in range(per_thread_ops):
            op(t, i)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return n_threads * per_thread_ops * size / (time.perf_counter() - start) / 1e9

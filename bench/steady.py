"""The steady-state workload of ``bench/dataplane.py``: a cache as production meets it.

A production cache is always full: every put evicts something, deletes and overwrites leave
dead records behind. So a run here first fills the store past its capacity with values nobody
reads again, then works on a working set of distinct random values (one contiguous block, so a
store that registers memory registers it once), round after round:

1. delete half of the keys (the other half each round), so half of the puts that follow are
   new keys and half overwrite a live value;
2. ``put`` every key, then ``get_into`` every key into its own output buffer, then ``get``
   every key, then ``batch_get_into`` them 16 at a time (each phase timed, in GB/s).

The first round is a warm-up that checks every byte read back against what was put; the
figures are the median over the timed rounds with their p10 and p90. The limits (memcpy, a raw
socket, Redis, Mooncake Store) are measured with the same rounds over the same working set, so a
figure and its limit see the same caches and the same spread.

This module imports no GCache code: ``bench/mooncake_store.py`` runs it in Mooncake's own
environment.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

MiB = 1 << 20
BATCH = 16
OPS = ("put", "get_into", "get", "batch_get_into16")


class Store(Protocol):
    """What a store under test offers; each call raises (``assert``) when it fails."""

    def put(self, key: str, value: np.ndarray) -> None: ...
    def get(self, key: str) -> int: ...                     # bytes read
    def get_into(self, key: str, out: np.ndarray) -> int: ...
    def batch_get_into(self, keys: Sequence[str], outs: Sequence[np.ndarray]) -> list[int]: ...
    def delete(self, key: str) -> None: ...


class Workload:
    """``count`` distinct random values of ``size`` bytes and as many distinct output buffers,
    all touched, in one block (``block``); keys ``<prefix>/<size>/<i>``."""

    def __init__(self, size: int, count: int, *, seed: int, prefix: str = "steady") -> None:
        if count % BATCH:
            raise ValueError(f"count is {count}; it must be a multiple of {BATCH}")
        self.size, self.count = size, count
        self.block = np.ones(2 * count * size, dtype=np.uint8)
        self.block[:count * size] = np.frombuffer(
            np.random.default_rng(seed).bytes(count * size), dtype=np.uint8)
        self.values = [self.block[i * size:(i + 1) * size] for i in range(count)]
        self.outs = [self.block[(count + i) * size:(count + i + 1) * size] for i in range(count)]
        self.keys = [f"{prefix}/{size}/{i}" for i in range(count)]

    @property
    def nbytes(self) -> int:
        return self.size * self.count


def spread(samples: Sequence[float]) -> dict[str, float]:
    """The median, p10 and p90 of ``samples`` (the middle ones of a short list)."""
    ordered = sorted(samples)
    last = len(ordered) - 1
    return {"median": statistics.median(ordered), "p10": ordered[round(0.1 * last)],
            "p90": ordered[round(0.9 * last)]}


def fill(store: Store, workload: Workload, fill_bytes: int) -> int:
    """Put ``fill_bytes`` of values under keys nobody reads again (``fill/<i>``) from the
    workload's values: what takes a store past its capacity. Returns how many were put."""
    n = max(1, fill_bytes // workload.size)
    for i in range(n):
        store.put(f"fill/{workload.size}/{i}", workload.values[i % workload.count])
    return n


def timed_gbps(threads: int, jobs: int, bytes_per_job: int, job: Callable[[int], None]) -> float:
    """Run ``job(j)`` for j in range(jobs), split by stride over ``threads`` threads; GB/s."""
    if threads == 1:
        start = time.perf_counter()
        for j in range(jobs):
            job(j)
        return jobs * bytes_per_job / (time.perf_counter() - start) / 1e9
    barrier = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        barrier.wait()
        for j in range(t, jobs, threads):
            job(j)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    return jobs * bytes_per_job / (time.perf_counter() - start) / 1e9


def one_round(store: Store, w: Workload, round_index: int, *, threads: int,
              ops: Sequence[str] = OPS) -> dict[str, float]:
    """Delete half of the keys, then each of ``ops`` over every key; GB/s by op."""
    for i in range(round_index % 2, w.count, 2):
        store.delete(w.keys[i])
    size = w.size

    def put(i: int) -> None:
        store.put(w.keys[i], w.values[i])

    def get_into(i: int) -> None:
        assert store.get_into(w.keys[i], w.outs[i]) == size, f"get_into {w.keys[i]}"

    def get(i: int) -> None:
        assert store.get(w.keys[i]) == size, f"get {w.keys[i]}"

    def batch(b: int) -> None:
        part = slice(b * BATCH, (b + 1) * BATCH)
        got = store.batch_get_into(w.keys[part], w.outs[part])
        assert got == [size] * BATCH, f"batch_get_into {w.keys[part][0]}...: {got}"

    jobs = {"put": (put, w.count, size), "get_into": (get_into, w.count, size),
            "get": (get, w.count, size),
            "batch_get_into16": (batch, w.count // BATCH, BATCH * size)}
    figures = {}
    for op in ops:
        job, n, per_job = jobs[op]
        figures[op] = timed_gbps(threads, n, per_job, job)
    return figures


def verify(w: Workload) -> None:
    """Every output buffer holds its value's bytes (after a round's reads)."""
    for i in range(w.count):
        if not np.array_equal(w.outs[i], w.values[i]):
            raise AssertionError(f"{w.keys[i]}: the bytes read back differ from those put")


def rounds(store: Store, w: Workload, *, rounds: int, threads: int,
           ops: Sequence[str] = OPS) -> dict[str, dict[str, float]]:
    """A warm-up round (every byte checked), then ``rounds`` timed ones: the spread by op
    (``put_t1`` ...), plus ``batch_x_single_t1``: each round's batch over its ``get_into``."""
    for out in w.outs:
        out.fill(0)
    one_round(store, w, 0, threads=threads, ops=ops)
    if "get_into" in ops or "batch_get_into16" in ops:
        verify(w)
    samples: dict[str, list[float]] = {op: [] for op in ops}
    for r in range(1, rounds + 1):
        for op, gbps in one_round(store, w, r, threads=threads, ops=ops).items():
            samples[op].append(gbps)
    out = {f"{op}_t{threads}": spread(s) for op, s in samples.items()}
    if "batch_get_into16" in ops and "get_into" in ops:
        out[f"batch_x_single_t{threads}"] = spread(
            [b / g for b, g in zip(samples["batch_get_into16"], samples["get_into"])])
    return out


def latency_rounds(store: Store, w: Workload, *, rounds: int) -> dict[str, float]:
    """``get_into`` of each key timed alone, after each round's deletes and puts: the median
    over rounds of each round's p50 (with p10 and p90 of those), and the p99 of all samples,
    in ms."""
    one_round(store, w, 0, threads=1, ops=("put", "get_into"))
    verify(w)
    p50s, every = [], []
    for r in range(1, rounds + 1):
        one_round(store, w, r, threads=1, ops=("put",))
        samples = []
        for i in range(w.count):
            start = time.perf_counter()
            store.get_into(w.keys[i], w.outs[i])
            samples.append((time.perf_counter() - start) * 1000)
        p50s.append(statistics.median(samples))
        every.extend(samples)
    every.sort()
    p50 = spread(p50s)
    return {"p50_ms": p50["median"], "p50_p10_ms": p50["p10"], "p50_p90_ms": p50["p90"],
            "p99_ms": every[int(0.99 * (len(every) - 1))]}


def memcpy_rounds(w: Workload, *, rounds: int) -> dict[str, float]:
    """Single-thread memcpy of every value into its own output buffer, per round: the shared-
    memory limit, over the same distinct blocks the stores move."""
    samples = []
    for r in range(rounds + 1):
        start = time.perf_counter()
        for value, out in zip(w.values, w.outs):
            np.copyto(out, value)
        if r:
            samples.append(w.nbytes / (time.perf_counter() - start) / 1e9)
    return spread(samples)

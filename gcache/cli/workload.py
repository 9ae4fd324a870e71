"""The demo workload of ``make run``: write then read back blocks, verifying every byte.

Block i is a fixed random block rotated by i, with i stamped in its first 8 bytes, so each block
is distinct and can be regenerated to check what came back. Writes go through ``put_async``
(a window of futures) and reads through ``batch_get_into``, so the demo exercises the IO
threads and the batch path. When the cluster holds less than the total, the oldest blocks are
evicted and read back as misses, which the summary reports; a wrong byte is a failure.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from gcache.sdk import Client


@dataclass(frozen=True, slots=True)
class WorkloadResult:
    blocks: int
    block_bytes: int
    put_ok: int
    put_s: float
    hits: int
    misses: int
    corrupt: int
    get_s: float

    def summary(self) -> str:
        moved = self.blocks * self.block_bytes
        return (f"blocks={self.blocks} block_bytes={self.block_bytes} "
                f"put_ok={self.put_ok} put_gbps={moved / self.put_s / 1e9:.2f} "
                f"hits={self.hits} misses={self.misses} corrupt={self.corrupt} "
                f"get_gbps={self.hits * self.block_bytes / self.get_s / 1e9:.2f}")


class BlockMaker:
    def __init__(self, block_bytes: int, seed: int = 7) -> None:
        self.base = np.random.default_rng(seed).integers(0, 256, block_bytes, dtype=np.uint8)

    def make(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        block = np.roll(self.base, index * 4099) if out is None else out
        if out is not None:
            np.copyto(out, np.roll(self.base, index * 4099))
        block[:8] = np.frombuffer(index.to_bytes(8, "little"), dtype=np.uint8)
        return block


def run_workload(client: Client, *, total_bytes: int, block_bytes: int, window: int = 8,
                 progress: bool = True) -> WorkloadResult:
    blocks = max(1, total_bytes // block_bytes)
    maker = BlockMaker(block_bytes)
    keys = [f"demo/block/{i}" for i in range(blocks)]
    put_ok = 0
    pending: deque[Future[bool]] = deque()
    bar = tqdm(total=blocks * 2, unit="block", desc="put+get", disable=not progress)
    start = time.perf_counter()
    for i, key in enumerate(keys):
        pending.append(client.put_async(key, maker.make(i)))
        if len(pending) >= window:
            put_ok += pending.popleft().result()
            bar.update(1)
    while pending:
        put_ok += pending.popleft().result()
        bar.update(1)
    put_s = time.perf_counter() - start

    hits = misses = corrupt = 0
    outs = [np.empty(block_bytes, dtype=np.uint8) for _ in range(window)]
    expected = np.empty(block_bytes, dtype=np.uint8)
    start = time.perf_counter()
    for first in range(0, blocks, window):
        batch = keys[first:first + window]
        got = client.batch_get_into(batch, outs[:len(batch)])
        for n, size in enumerate(got):
            if size is None:
                misses += 1
                continue
            hits += 1
            maker.make(first + n, expected)
            if size != block_bytes or not np.array_equal(outs[n], expected):
                corrupt += 1
        bar.update(len(batch))
    get_s = time.perf_counter() - start
    bar.close()
    return WorkloadResult(blocks, block_bytes, put_ok, put_s, hits, misses, corrupt, get_s)

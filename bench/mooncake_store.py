"""Mooncake Store over TCP, measured the way ``bench/dataplane.py`` measures GCache: the baseline
the data-plane issue names. Runs in its own environment (``.venv-mooncake``, made by ``make
mooncake``: ``mooncake-transfer-engine-non-cuda``, and Debian's libibverbs unpacked beside it,
which its binaries link against even for TCP); ``bench/dataplane.py`` starts it with that
library on ``LD_LIBRARY_PATH`` and reads the JSON it prints.

Layout, so that every byte crosses a process boundary as GCache's do: a ``mooncake_master``
(with its HTTP metadata server), a ``mooncake_client`` process that holds the storage segment,
and this process as a client that mounts no segment (``global_segment_size`` 0) and moves
values through registered buffers (``upsert_from``, ``get_into``, ``batch_get_into``; ``get``
returns bytes). ``upsert_from`` rather than ``put_from`` because Mooncake refuses a put of a
key that exists, and GCache's put replaces it. Both processes are ours and are stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import threaded_gbps

MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MooncakeCluster:
    """A master and one storage process on loopback, logs in ``log_dir``."""

    def __init__(self, log_dir: str, segment: str = "2 GB") -> None:
        import mooncake
        here = os.path.dirname(mooncake.__file__)
        self.rpc, self.http, self.metrics, self.client_port = (free_port() for _ in range(4))
        self.metadata = f"http://127.0.0.1:{self.http}/metadata"
        self.master = f"127.0.0.1:{self.rpc}"
        self._commands = [
            [os.path.join(here, "mooncake_master"), f"-rpc_port={self.rpc}",
             "-enable_http_metadata_server", "-http_metadata_server_host=127.0.0.1",
             f"-http_metadata_server_port={self.http}", f"-metrics_port={self.metrics}",
             "-enable_metric_reporting=false"],
            [os.path.join(here, "mooncake_client"), f"-master_server_address={self.master}",
             f"-metadata_server={self.metadata}", f"-global_segment_size={segment}",
             "-host=127.0.0.1", f"-port={self.client_port}", "-protocol=tcp"]]
        self._log_dir = log_dir
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> MooncakeCluster:
        for n, command in enumerate(self._commands):
            log = open(os.path.join(self._log_dir, f"mooncake-{n}.log"), "wb")
            self._procs.append(subprocess.Popen(command, stdout=log, stderr=log))
            log.close()
            time.sleep(1.0 if n == 0 else 0)           # the master's ports first
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self._procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def store(self, timeout_s: float = 30.0):
        """A client that mounts no segment, once the storage process has mounted its own."""
        from mooncake.store import MooncakeDistributedStore
        store = MooncakeDistributedStore()
        if store.setup("127.0.0.1", self.metadata, 0, 512 * MiB, "tcp", "", self.master) != 0:
            raise RuntimeError("Mooncake client setup failed (see the mooncake-*.log files)")
        probe = np.zeros(4096, dtype=np.uint8)
        store.register_buffer(probe.ctypes.data, probe.nbytes)
        deadline = time.monotonic() + timeout_s
        while store.upsert_from("probe", probe.ctypes.data, probe.nbytes) != 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self._procs):
                raise RuntimeError("Mooncake's storage process never took a value")
            time.sleep(0.2)
        store.remove("probe")
        return store, probe


def figures(store, size: int, repeat: int, total_bytes: int) -> dict[str, float]:
    """The rows ``bench/dataplane.py`` measures for GCache, same keys, sizes and threads."""
    keys = [f"bench/{size}/{i}" for i in range(16)]
    # one registration for all buffers: Mooncake refuses regions that overlap, and separate
    # allocations may share a page
    block = np.empty(65 * size, dtype=np.uint8)
    assert store.register_buffer(block.ctypes.data, block.nbytes) == 0
    value = block[:size]
    value[:] = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    outs = [[block[(1 + 16 * t + j) * size:(2 + 16 * t + j) * size] for j in range(16)]
            for t in range(4)]
    for k in keys:
        assert store.upsert_from(k, value.ctypes.data, size) == 0
    ops = max(8, total_bytes // size)
    result: dict[str, float] = {}
    for threads in (1, 4):
        n = max(4, ops // threads)

        def put(t: int, i: int) -> None:
            assert store.upsert_from(keys[(t * 4 + i) % 16], value.ctypes.data, size) == 0

        def get(t: int, i: int) -> None:
            assert len(store.get(keys[(t * 4 + i) % 16])) == size

        def get_into(t: int, i: int) -> None:
            assert store.get_into(keys[(t * 4 + i) % 16], outs[t][0].ctypes.data, size) == size

        def batch(t: int, i: int) -> None:
            assert store.batch_get_into(keys, [o.ctypes.data for o in outs[t]],
                                        [size] * 16) == [size] * 16

        for name, op, per_op in (("put", put, size), ("get", get, size),
                                 ("get_into", get_into, size),
                                 ("batch_get_into16", batch, 16 * size)):
            count = n if per_op == size else max(1, n // 16)
            result[f"{name}_t{threads}"] = max(
                threaded_gbps(threads, count, per_op, op) for _ in range(repeat))
    assert bytes(store.get(keys[0])) == value.tobytes()
    store.remove_all()
    store.unregister_buffer(block.ctypes.data)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bytes-per-run", type=int, default=256 * MiB)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as logs, \
            MooncakeCluster(logs) as cluster:
        store, _probe = cluster.store()
        try:
            report = {f"{size // MiB}MiB": figures(store, size, args.repeat, args.bytes_per_run)
                      for size in (MiB, 4 * MiB)}
        finally:
            store.close()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

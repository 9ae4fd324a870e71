"""Mooncake Store over TCP, measured the way ``bench/dataplane.py`` measures GCache: the baseline
the data-plane issue names. Runs in its own environment (``.venv-mooncake``, made by ``make
mooncake``: ``mooncake-transfer-engine-non-cuda``, and Debian's libibverbs unpacked beside it,
which its binaries link against even for TCP); ``bench/dataplane.py`` starts it with that
library on ``LD_LIBRARY_PATH`` and reads the JSON it prints.

Layout, so that every byte crosses a process boundary as GCache's do: a ``mooncake_master``
(with its HTTP metadata server), a ``mooncake_client`` process that holds the storage segment,
and this process as a client that mounts no segment (``global_segment_size`` 0) and moves
values through registered buffers (``upsert_from``, ``get_into``, ``batch_get_into``; ``get``
returns bytes). The workload is ``bench/steady.py``'s: a 1 GB storage segment filled past its
size first, then rounds of deletes, puts and reads over a working set of distinct values;
medians and spreads over the rounds. ``upsert_from`` rather than ``put_from`` because Mooncake
refuses a put of a key that exists, and GCache's put replaces it. Both processes are ours and
are stopped by PID.
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
import steady

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


class MooncakeStore:
    """A Mooncake client as a ``steady.Store``, moving values through ``block`` (registered
    once: Mooncake refuses regions that overlap, and separate allocations may share a page)."""

    def __init__(self, store) -> None:
        self.store = store

    def put(self, key: str, value: np.ndarray) -> None:
        assert self.store.upsert_from(key, value.ctypes.data, value.nbytes) == 0, f"put {key}"

    def get(self, key: str) -> int:
        return len(self.store.get(key))

    def get_into(self, key: str, out: np.ndarray) -> int:
        return self.store.get_into(key, out.ctypes.data, out.nbytes)

    def batch_get_into(self, keys, outs) -> list[int]:
        return list(self.store.batch_get_into(list(keys), [o.ctypes.data for o in outs],
                                              [o.nbytes for o in outs]))

    def delete(self, key: str) -> None:
        self.store.remove(key)


def figures(store, size: int, args) -> dict[str, dict[str, float]]:
    """The steady rounds ``bench/dataplane.py`` runs on GCache: same working set, same ops,
    1 and 4 threads; spreads by row name."""
    w = steady.Workload(size, max(16, args.working_set // size // 16 * 16), seed=size)
    assert store.register_buffer(w.block.ctypes.data, w.block.nbytes) == 0
    mooncake = MooncakeStore(store)
    steady.fill(mooncake, w, args.fill)
    result: dict[str, dict[str, float]] = {}
    for threads in (1, 4):
        result.update(steady.rounds(mooncake, w, rounds=args.rounds, threads=threads))
    store.remove_all()
    store.unregister_buffer(w.block.ctypes.data)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--working-set", type=int, default=256 * MiB)
    parser.add_argument("--fill", type=int, default=1280 * MiB,
                        help="bytes put before the rounds (the storage segment is 1 GiB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as logs, \
            MooncakeCluster(logs, segment="1 GB") as cluster:
        store, _probe = cluster.store()
        try:
            spreads = {f"{size // MiB}MiB": figures(store, size, args) for size in (MiB, 4 * MiB)}
        finally:
            store.close()
    report: dict = {size: {op: s["median"] for op, s in rows.items()
                           if not op.startswith("batch_x_")} for size, rows in spreads.items()}
    report["spread"] = spreads
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Files benchmark: pulling a file from 1, 2 and 3 servers against reading it from the page cache.

In one run: a file of ``--mib`` MiB of random bytes on local disk, read once so that it is in
the page cache; the limit is ``os.preadv`` of it in 16 MiB pieces into a preallocated, touched
buffer (best of ``--repeat``). Then, for 1, 2 and 3 ``gcache-server``s on loopback, the file is
pushed with ``gcache.files`` (16 MiB chunks placed by consistent hashing) and pulled with
``FileStore.get_file`` into a buffer of the same kind, over TCP and over shared memory, best of
``--repeat``; each pull is checked against the file's digest, as every read is. Prints a table
and writes ``bench/results/files-latest.json``; ``update_readme.py`` renders it.

On one host every server shares the client's cores, so more servers add parallel streams, not
bandwidth of other hosts: the figure a fleet gets scales with hosts, which this cannot show.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

from gcache.cli.local_cluster import LocalCluster
from gcache.config import ClientConfig
from gcache.files import FileStore
from gcache.sdk import Client

MiB = 1 << 20
CHUNK = 16 * MiB


def page_cache_gbps(path: str, out: memoryview, repeat: int) -> float:
    size = len(out)
    with open(path, "rb") as fh:
        fh.read()                                 # into the page cache
    best = float("inf")
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            for offset in range(0, size, CHUNK):
                os.preadv(fd, [out[offset:offset + CHUNK]], offset)
            best = min(best, time.perf_counter() - start)
    finally:
        os.close(fd)
    return size / best / 1e9


def pull_gbps(servers: list[str], transport: str, path: str, out: memoryview,
              repeat: int) -> float:
    config = ClientConfig(servers=servers, transport=transport, timeout_s=10.0)
    with Client(config=config) as client:
        store = FileStore(client, chunk_size=CHUNK)
        manifest = store.put_file("bench/file", path)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            got = store.get_file(manifest, out)
            best = min(best, time.perf_counter() - start)
            assert got.digest == manifest.digest
    return manifest.size / best / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="file size in MiB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--servers", default="1,2,3", help="server counts to measure")
    args = parser.parse_args()
    size = args.mib * MiB
    out = memoryview(np.ones(size, np.uint8))
    rows = []
    with tempfile.TemporaryDirectory(prefix="gcache-bench-files-", dir="/var/tmp") as folder:
        path = os.path.join(folder, "file.bin")
        with open(path, "wb") as fh:
            rng = np.random.default_rng(3)
            for _ in range(0, size, CHUNK):
                fh.write(rng.integers(0, 256, CHUNK, dtype=np.uint8).tobytes())
        limit = page_cache_gbps(path, out, args.repeat)
        print(f"page cache preadv: {limit:.2f} GB/s")
        for n in (int(x) for x in args.servers.split(",")):
            # each server holds the whole file: where a chunk lands is the ring's choice
            memory = f"{args.mib + 256}MiB"
            with LocalCluster(n, memory=memory, server_args=("--segment-size", "64MiB"),
                              log_dir=os.path.join(folder, f"logs-{n}")) as cluster:
                for transport in ("tcp", "shm"):
                    gbps = pull_gbps(cluster.addresses, transport, path, out, args.repeat)
                    rows.append({"servers": n, "transport": transport, "gbps": gbps,
                                 "x_page_cache": gbps / limit})
                    print(f"{n} server(s) {transport}: {gbps:.2f} GB/s "
                          f"({gbps / limit:.2f}x page cache)")
    report = {"date": dt.date.today().isoformat(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "file_mib": args.mib,
              "chunk_mib": CHUNK // MiB, "repeat": args.repeat,
              "limits": {"page_cache_preadv_gbps": limit}, "pulls": rows}
    write_results("files", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

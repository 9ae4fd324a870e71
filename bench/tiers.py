"""Tier benchmark: the cold tier against the raw disk, and hot reads while demotion runs.

In one run, on one directory (``--dir``, default a fresh folder under /var/tmp):
- limits: raw sequential write of 1 MiB chunks to one file with an fsync at the end, and raw
  ``os.preadv`` of the same file back into a preallocated, touched buffer of the same size
  (distinct destinations, as promotions into the arena have; the memcpy limit of
  ``bench/dataplane.py`` is measured the same way);
- for each cold format (``segments``: files + RocksDB index, ``blobs``: values in RocksDB blob
  files): demotion throughput (``TieredStore.demote``: checksum check and disk write, fsync
  included) as a ratio to the raw write, and cold-read throughput (a promotion per value: read
  from disk into the arena, checksum, commit) as a ratio to the raw ``preadv``;
- a real ``gcache-server`` with a cold tier: p50/p99 of 64 KiB ``get_into`` of hot keys, alone
  and while another process writes enough to keep the demoter busy.

Reads of a file just written come from the page cache for the raw limit and the cold tier
alike, so the ratios compare the code paths, not the device. Targets (issue 3): demotion ≥ 0.7×
raw write, cold get ≥ 0.7× raw preadv, hot p99 with demotion ≤ 2× without. Reported, never
asserted. Prints a table and writes ``bench/results/tiers-latest.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

from gcache.cli.local_cluster import LocalCluster
from gcache.config import ServerConfig
from gcache.keys import checksum
from gcache.sdk import Client
from gcache.server.daemon import open_tiers

MiB = 1 << 20


def raw_limits(directory: str, total: int, chunk: int) -> dict:
    data = np.random.default_rng(1).integers(0, 256, chunk, dtype=np.uint8).tobytes()
    path = os.path.join(directory, "raw.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    start = time.perf_counter()
    for _ in range(total // chunk):
        os.write(fd, data)
    os.fsync(fd)
    write_s = time.perf_counter() - start
    os.close(fd)
    out = memoryview(np.ones(total, np.uint8))  # distinct, pre-touched destinations, as an
    fd = os.open(path, os.O_RDONLY)             # arena is: one reused buffer would stay cached
    start = time.perf_counter()
    for i in range(total // chunk):
        os.preadv(fd, [out[i * chunk:(i + 1) * chunk]], i * chunk)
    read_s = time.perf_counter() - start
    os.close(fd)
    os.unlink(path)
    return {"raw_write_gbps": total / write_s / 1e9, "raw_preadv_gbps": total / read_s / 1e9}


def cold_format(directory: str, disk_format: str, total: int, chunk: int) -> dict:
    """Demotion and promotion throughput of one cold format, in process."""
    disk = os.path.join(directory, disk_format)
    os.makedirs(disk)
    n = total // chunk
    memory = total + 128 * MiB                          # the demoter stays idle
    config = ServerConfig(memory=memory, segment_size=16 * MiB, disk_dir=disk,
                          disk_format=disk_format, disk_capacity=4 * total)
    name = f"gcache-bench-{uuid.uuid4().hex[:8]}"
    store = open_tiers(config, name)
    rng = np.random.default_rng(2)
    values = [rng.integers(0, 256, chunk, dtype=np.uint8).tobytes() for _ in range(8)]
    try:
        for i in range(n):
            write = store.alloc(f"k{i}".encode(), chunk)
            write.receive(0, chunk, _copying(values[i % 8]))
            write.commit(checksum(values[i % 8]))
        entries = [store.hot.entry(f"k{i}".encode()) for i in range(n)]
        start = time.perf_counter()
        demoted = store.demote(entries)
        store.cold.sync()
        demote_s = time.perf_counter() - start
        assert demoted == n, (demoted, n)
    finally:
        store.close(unlink=True)
    store = open_tiers(config, name + "-fresh")         # an empty arena: every read promotes
    try:
        start = time.perf_counter()
        for i in range(n):
            leased = store.lease(f"k{i}".encode())
            assert leased is not None
            view = leased.view(0, 16)
            assert bytes(view) == values[i % 8][:16]
            view.release()
            leased.release()
        promote_s = time.perf_counter() - start
    finally:
        store.close(unlink=True)
    return {"demote_gbps": total / demote_s / 1e9, "cold_get_gbps": total / promote_s / 1e9}


def _copying(value: bytes):
    """A write's fill that copies ``value`` in and hashes it as it lands."""
    def copy(view: memoryview, hasher) -> None:
        view[:] = value
        if hasher is not None:
            hasher.update(view)
    return copy


def _writer(address: str, seconds: float, size: int, rate_bytes_s: float) -> None:
    """Puts at ``rate_bytes_s``: the ingest a demoter must keep up with."""
    value = bytes(size)
    with Client([address], timeout_s=5.0) as client:
        start, i = time.monotonic(), 0
        while time.monotonic() < start + seconds:
            client.put(f"bulk{i}", value)
            i += 1
            ahead = start + i * size / rate_bytes_s - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)


def hot_latency(directory: str, gets: int, rate_mib_s: float) -> dict:
    """p50/p99 of hot 64 KiB reads, alone and while a writer at ``rate_mib_s`` keeps the
    demoter busy (a flat-out writer would measure CPU contention on a 2-core machine, not
    demotion)."""
    disk = os.path.join(directory, "server")
    os.makedirs(disk)
    args = ("--segment-size", "4MiB", "--disk-dir", disk, "--disk-capacity", "4GiB")
    out = {}
    with LocalCluster(1, memory="256MiB", server_args=args) as cluster, \
            Client(cluster.addresses, timeout_s=5.0) as client:
        hot = [f"hot{i}" for i in range(64)]
        for key in hot:
            client.put(key, bytes(64 << 10))
        buf = bytearray(64 << 10)

        def measure() -> tuple[float, float]:
            lat = []
            for i in range(gets):
                start = time.perf_counter()
                client.get_into(hot[i % len(hot)], buf)
                lat.append(time.perf_counter() - start)
            return float(np.percentile(lat, 50)) * 1e3, float(np.percentile(lat, 99)) * 1e3

        out["hot_p50_ms"], out["hot_p99_ms"] = measure()
        before = client.server_stats()[cluster.addresses[0]]["tiers"]["hot"]["demoted_objects"]
        writer = multiprocessing.get_context("spawn").Process(
            target=_writer, args=(cluster.addresses[0], 60.0, 1 * MiB, rate_mib_s * MiB))
        writer.start()
        try:
            time.sleep(1.0)
            out["hot_demoting_p50_ms"], out["hot_demoting_p99_ms"] = measure()
        finally:
            writer.terminate()
            writer.join(10)
        after = client.server_stats()[cluster.addresses[0]]["tiers"]["hot"]["demoted_objects"]
        out["demoted_during_measure"] = after - before
        out["demotion_rate_mib_s"] = rate_mib_s
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="directory on the disk to measure (default: /var/tmp)")
    parser.add_argument("--total", type=int, default=256, help="MiB per throughput figure")
    parser.add_argument("--gets", type=int, default=10000)
    parser.add_argument("--demote-rate", type=float, default=200.0,
                        help="MiB/s written (and so demoted) during the latency figure")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="gcache-tiers-", dir=args.dir or "/var/tmp")
    total, chunk = args.total * MiB, 1 * MiB
    try:
        report = {"date": dt.date.today().isoformat(), "cpus": os.cpu_count(),
                  "python": platform.python_version(), "total_mib": args.total,
                  "chunk_mib": 1, "limits": raw_limits(directory, total, chunk), "formats": {}}
        for disk_format in ("segments", "blobs"):
            report["formats"][disk_format] = cold_format(directory, disk_format, total, chunk)
        report["hot"] = hot_latency(directory, args.gets, args.demote_rate)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    limits = report["limits"]
    print(f"raw sequential write (fsync) {limits['raw_write_gbps']:.2f} GB/s, raw preadv "
          f"{limits['raw_preadv_gbps']:.2f} GB/s ({args.total} MiB in 1 MiB chunks)")
    for name, row in report["formats"].items():
        row["demote_x_raw_write"] = row["demote_gbps"] / limits["raw_write_gbps"]
        row["cold_get_x_raw_preadv"] = row["cold_get_gbps"] / limits["raw_preadv_gbps"]
        print(f"{name:<9} demotion {row['demote_gbps']:.2f} GB/s = "
              f"{row['demote_x_raw_write']:.2f}× raw write; cold get "
              f"{row['cold_get_gbps']:.2f} GB/s = {row['cold_get_x_raw_preadv']:.2f}× preadv")
    hot = report["hot"]
    hot["p99_ratio"] = hot["hot_demoting_p99_ms"] / hot["hot_p99_ms"]
    print(f"hot 64 KiB get_into: p50 {hot['hot_p50_ms']:.3f} ms, p99 {hot['hot_p99_ms']:.3f} ms; "
          f"with demotion running at {hot['demotion_rate_mib_s']:.0f} MiB/s "
          f"({hot['demoted_during_measure']} objects demoted meanwhile) "
          f"p50 {hot['hot_demoting_p50_ms']:.3f} ms, p99 {hot['hot_demoting_p99_ms']:.3f} ms "
          f"({hot['p99_ratio']:.2f}×)")
    write_results("tiers", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

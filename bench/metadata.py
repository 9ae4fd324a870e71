"""Metadata at page granularity: index memory per object, small-key rates, restart time.

At page granularity a server holds tens of millions of small objects; Mooncake's master ran out
of memory at an estimated 12.5-50 M. One real ``gcache-server`` on loopback takes ``--objects``
values of ``--value-bytes`` each, put by one client process in batches of ``--batch`` keys
(``batch_put``), forced to TCP. Measured:
- the server's anonymous memory (``RssAnon`` from /proc: the arena is shared memory and not
  counted) before and after the puts, per object: what the index costs;
- keys per second for batched puts (every object), then batched EXISTS and batched GETs over a
  sample of ``--sample`` keys;
- a restart on the same arena: SIGTERM, start again, time from launch to ready (recovery
  re-checks every record), memory per object after it, and that a sample still reads back.
Targets (issue 17): at most 64 bytes of index memory per object at 10 M objects, 50,000 keys/s
for each batched operation. Prints a table and writes ``bench/results/metadata-latest.json``.
Reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

from gcache.cli.local_cluster import LocalCluster
from gcache.record_layout import SPAN_HEADER_BYTES, record_size
from gcache.sdk import Client

SEGMENT_BYTES = 64 * 2**20


def rss_anon_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon in /proc/{pid}/status")


def key_of(i: int) -> bytes:
    return b"meta-%010d" % i


def arena_bytes(objects: int, value_bytes: int) -> int:
    """Room for every record with a quarter to spare, in whole segments."""
    per_segment = (SEGMENT_BYTES - SPAN_HEADER_BYTES) // record_size(len(key_of(0)),
                                                                        value_bytes)
    segments = -(-objects * 5 // 4 // per_segment) + 2
    return segments * SEGMENT_BYTES


def rate(op, keys: list[bytes], batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(keys), batch):
        op(keys[i:i + batch])
    return len(keys) / (time.perf_counter() - start)


def run(objects: int, value_bytes: int, batch: int, sample: int) -> dict:
    memory = arena_bytes(objects, value_bytes)
    values = [bytes([i % 251]) * value_bytes for i in range(batch)]
    step = max(1, objects // sample)
    sampled = [key_of(i) for i in range(0, objects, step)][:sample]
    with LocalCluster(1, memory=str(memory),
                      server_args=("--segment-size", str(SEGMENT_BYTES),
                                   "--no-nixl"),
                      ready_timeout_s=1800.0) as cluster:
        server = cluster.servers[0]
        client = Client(cluster.addresses, transport="tcp", timeout_s=60.0)
        try:
            client.put(b"warm-up", b"x")
            assert server.pid is not None
            before = rss_anon_bytes(server.pid)
            stored, start = 0, time.perf_counter()
            for first in range(0, objects, batch):
                keys = [key_of(i) for i in range(first, min(objects, first + batch))]
                stored += sum(client.batch_put(keys, values[:len(keys)]))
                if first // batch % 500 == 0:
                    print(f"  put {first + len(keys):,} of {objects:,}", flush=True)
            put_rate = objects / (time.perf_counter() - start)
            after = rss_anon_bytes(server.pid)
            exists_rate = rate(client.batch_exists, sampled, batch)
            get_rate = rate(client.batch_get, sampled, batch)
            print(f"  {(after - before) / objects:.1f} B/object; keys/s: put {put_rate:,.0f} "
                  f"exists {exists_rate:,.0f} get {get_rate:,.0f}; restarting", flush=True)
            client.close()
            cluster.terminate(0)
            start = time.perf_counter()
            cluster.restart(0)
            restart_s = time.perf_counter() - start
            assert server.pid is not None
            restarted = rss_anon_bytes(server.pid)
            client = Client(cluster.addresses, transport="tcp", timeout_s=60.0)
            back = client.batch_get(sampled[:batch])
            intact = sum(v == values[sampled.index(k) * step % batch]
                         for k, v in zip(sampled[:batch], back, strict=True))
        finally:
            client.close()
    return {
        "objects": objects, "stored": stored, "value_bytes": value_bytes, "batch": batch,
        "sample": len(sampled), "arena_bytes": memory,
        "rss_anon_before_bytes": before, "rss_anon_after_bytes": after,
        "index_bytes_per_object": (after - before) / objects,
        "put_keys_per_s": put_rate, "exists_keys_per_s": exists_rate,
        "get_keys_per_s": get_rate, "restart_s": restart_s,
        "rss_anon_after_restart_bytes": restarted,
        "index_bytes_per_object_after_restart": (restarted - before) / objects,
        "read_back_after_restart": f"{intact}/{min(batch, len(sampled))}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=200_000)
    args = parser.parse_args()
    row = run(args.objects, args.value_bytes, args.batch, args.sample)
    report = {"date": dt.date.today().isoformat(), "cpus": os.cpu_count(),
              "python": platform.python_version(), **row}
    print(f"{row['objects']:,} objects of {row['value_bytes']} B "
          f"(stored {row['stored']:,}), batches of {row['batch']}")
    print(f"  index memory: {row['index_bytes_per_object']:.1f} B/object "
          f"({row['index_bytes_per_object_after_restart']:.1f} after a restart)")
    print(f"  keys/s: put {row['put_keys_per_s']:,.0f}  exists {row['exists_keys_per_s']:,.0f}"
          f"  get {row['get_keys_per_s']:,.0f}")
    print(f"  restart to ready: {row['restart_s']:.1f} s; read back "
          f"{row['read_back_after_restart']}")
    write_results("metadata", report)


if __name__ == "__main__":
    main()

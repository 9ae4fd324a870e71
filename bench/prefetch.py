"""What the router's PREFETCH saves a request whose GCache hit sits on the cold tier (issue 47).

A real ``gcache-server`` with a cold tier (``--disk-dir``) holds prefixes of a model layout
(MiMo-V2.5-Pro's, values scaled by ``--scale`` so that the arena fits this machine); filler puts
push them out of memory onto disk. Then, per prefix, the time of the engine's part of a hit:
- ``cold``: ``KVStore.load`` of the hit straight away, which promotes every object from disk on
  the load's own path;
- ``prefetched``: ``prefetch_prefix`` first (what gcache-router sends right after routing), then
  the same load, which finds everything in memory. The prefetch's own time is reported too: it
  is hidden from the request only while the engine is still busy before its load (queueing,
  scheduling, earlier chunks), and adds nothing to it otherwise since it runs beside it.

A request's time to first token moves by exactly the load's difference when the prefetch has
finished by the time the engine loads; the table gives both so a reader can apply their own
gap. Disk reads come from the page cache (the files were just written, and this benchmark does
not drop the host's caches, which other work on the machine shares): the cold figures are the
promotion's own cost (allocation, copy, checksum, commit) and a lower bound for a real disk.

    .venv/bin/python bench/prefetch.py [--prefixes 24] [--pages 16] [--scale 64]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

from gcache.cli.local_cluster import LocalCluster
from gcache.cli.replay import ZeroKV
from gcache.kv import KVStore, ModelLayout, prefetch_prefix
from gcache.kv.trace import BLOCK_SIZE
from gcache.sdk import Client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefixes", type=int, default=24, help="prefixes, half of them cold")
    parser.add_argument("--pages", type=int, default=16, help="pages of 512 tokens per prefix")
    parser.add_argument("--scale", type=int, default=64, help="value size divisor")
    parser.add_argument("--results", action="store_true",
                        help="also write bench/results/prefetch-latest.json")
    args = parser.parse_args(argv)
    layout = ModelLayout.from_config("mimo-v2.5-pro", page_size=BLOCK_SIZE).scaled(args.scale)
    rng = np.random.default_rng(47)
    prefixes = [rng.integers(0, 150_000, args.pages * BLOCK_SIZE) for _ in range(args.prefixes)]
    per_prefix = args.pages * layout.full_page_bytes() + layout.tail_bytes(args.pages)
    arena = max(64 << 20, 1 << (2 * per_prefix).bit_length())
    times: dict[str, list[float]] = {"cold": [], "prefetched": [], "prefetch": []}
    with tempfile.TemporaryDirectory(prefix="gcache-prefetch-") as disk, \
            LocalCluster(1, memory=str(arena), server_args=(
                "--segment-size", "1MiB", "--disk-dir", disk,
                "--disk-capacity", str(8 * (arena + per_prefix * args.prefixes)))) as cluster, \
            Client(cluster.addresses, timeout_s=10.0) as client, \
            KVStore(client, layout, pressure_poll_s=0.0) as store:
        source = ZeroKV(layout)
        for tokens in prefixes:
            store.save(tokens, source)
        filler = bytes(1 << 20)
        for i in range(3 * arena >> 20):                      # everything saved goes to disk
            client.put(f"filler/{i}", filler)
        hits = [store.match(tokens) for tokens in prefixes]
        for n, (tokens, hit) in enumerate(zip(prefixes, hits)):
            if not hit:
                continue
            if n % 2:
                started = time.perf_counter()
                done = prefetch_prefix(store, tokens, hit)
                times["prefetch"].append(time.perf_counter() - started)
                if done.in_memory != done.keys:
                    print(f"prefix {n}: {done.keys - done.in_memory} objects not promoted")
            started = time.perf_counter()
            load = store.load(tokens, hit, source)
            load.wait(timeout_s=60.0)
            times["prefetched" if n % 2 else "cold"].append(time.perf_counter() - started)
        tiers = client.stats(tiers=True)["tiers"]
    ms = {k: round(1000 * statistics.median(v), 2) for k, v in times.items() if v}
    print(f"{sum(1 for h in hits if h)} of {len(hits)} prefixes hit ({args.pages} pages of "
          f"{layout.model} at 1/{args.scale}: {per_prefix / 2**20:.1f} MiB each); cold-tier "
          f"hits {tiers['cold']['hits']}, promotions {tiers['hot']['promoted_objects']}")
    print("| the engine's load of a cold-tier hit | median ms |\n|---|---:|")
    print(f"| without prefetch (promoted during the load) | {ms.get('cold')} |")
    print(f"| after the router's prefetch | {ms.get('prefetched')} |")
    print(f"| the prefetch itself (beside the request, before the load) | {ms.get('prefetch')} |")
    if args.results:
        write_results("prefetch", {"date": dt.date.today().isoformat(), "args": vars(args),
                                   "median_ms": ms, "prefix_mib": per_prefix / 2**20,
                                   "tiers": tiers})
    return 0


if __name__ == "__main__":
    sys.exit(main())

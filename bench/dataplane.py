"""Data-plane benchmark: GCache in its steady state (full, evicting, on the configuration a
server gets by default) against limits measured the same way in the same run.

Headline set-up: one ``gcache-server`` started with ``--memory`` only (its arena on the default
/dev/shm, NIXL offered as by default), the client in this process with its default settings
(but a 5 s IO timeout, so a slow round on a busy machine is not a miss), one thread. The
workload is ``bench/steady.py``'s: the arena is first filled past its capacity, then every
round deletes half of a working set of distinct random values (1 and 4 MiB; 64 KiB for the
latency rows), puts every key (half new, half overwrites; each put finds the arena full), and
reads them all back (``get_into``, ``get``, ``batch_get_into`` of 16). A warm-up round checks
every byte; every figure is the median over ``--rounds`` rounds, with p10 and p90.

Limits, in the same rounds over the same working set: single-thread memcpy of each value into
its own buffer (shared-memory rows), one raw loopback TCP socket to another process
(``bench/steady_limits.py``; TCP rows), Redis (SET/GET, ``maxmemory`` = the arena's size,
``allkeys-lru``), Mooncake Store over TCP (``bench/mooncake_store.py`` in ``.venv-mooncake``
from ``make mooncake``) and the bare NIXL READ/WRITE loop (``bench/nixl_bare.py``; median of
its runs). Tuned set-ups are extra rows, labelled: the arena on a tmpfs mounted
``huge=within_size`` (where this process may mount one), and ``batch_get_into`` with 1 and 2
IO threads. Prints a table and writes JSON to ``bench/results/``: ``gcache`` and ``limits``
hold the medians (the fields ``update_readme.py`` reads), ``spread`` their p10/p90, ``setup``
the run's shape, ``evictions`` what the server evicted during the timed rounds. Targets
(issue 46) are reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import c_sdk
import nixl_bare
import steady
from baselines import RedisServer, memcpy_threads_gbps
from dataplane_table import print_table, ratios
from results_file import write_results
from steady import Workload
from steady_limits import raw_socket_latency_ms, raw_socket_rounds, redis_rounds

from gcache.cli.local_cluster import LocalCluster
from gcache.config import parse_size
from gcache.sdk import Client
from gcache.server.huge_pages import huge_tmpfs
from gcache.transport import nixl

MiB = 1 << 20
SIZES = (MiB, 4 * MiB)


class GCacheStore:
    """A ``Client`` as a ``steady.Store``; a miss or a refused put fails the run."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def put(self, key: str, value: np.ndarray) -> None:
        assert self.client.put(key, value), f"put {key} failed"

    def get(self, key: str) -> int:
        got = self.client.get(key)
        return 0 if got is None else len(got)

    def get_into(self, key: str, out: np.ndarray) -> int:
        return self.client.get_into(key, out) or 0

    def batch_get_into(self, keys: Sequence[str], outs: Sequence[np.ndarray]) -> list[int]:
        return [n or 0 for n in self.client.batch_get_into(keys, outs)]

    def delete(self, key: str) -> None:
        self.client.delete(key)


def evicted(client: Client) -> dict[str, int]:
    """The server's eviction and put counters (summed over servers)."""
    tier = client.stats(tiers=True)["tiers"].get("hot", {})
    return {k: int(tier.get(k, 0)) for k in ("evicted_objects", "evicted_segments")}


def gcache_rows(client: Client, workloads: dict[int, Workload], latency: Workload | None,
                rounds: int, threads: Sequence[int]) -> tuple[dict, dict, dict]:
    """Medians and spreads of one transport, by ``<size>MiB``; and what the server evicted
    while the timed rounds ran (objects and segments per put)."""
    store = GCacheStore(client)
    medians: dict = {}
    spreads: dict = {}
    before, puts = evicted(client), 0
    for size, w in workloads.items():
        client.register_buffer(w.block)                # NIXL: once; a no-op elsewhere
        name = f"{size // MiB}MiB"
        spreads[name] = {}
        for t in threads:
            spreads[name].update(steady.rounds(store, w, rounds=rounds, threads=t))
            puts += (rounds + 1) * w.count
        medians[name] = {op: s["median"] for op, s in spreads[name].items()
                         if not op.startswith("batch_x_")}
        client.unregister_buffer(w.block)
        for key in w.keys:                             # one working set live at a time
            client.delete(key)
    after = evicted(client)
    evictions = {k: (after[k] - before[k]) / puts for k in after}
    if latency is not None:
        client.register_buffer(latency.block)
        medians["get_into_64KiB_latency"] = steady.latency_rounds(store, latency, rounds=rounds)
        client.unregister_buffer(latency.block)
    return medians, spreads, evictions


def measure_gcache(args: argparse.Namespace, workloads: dict[int, Workload],
                   latency: Workload, transports: list[str]) -> dict:
    """The headline server: ``--memory`` only, arena on /dev/shm; filled past its capacity,
    then the rounds over every transport."""
    out: dict = {"gcache": {}, "spread": {}, "evictions": {}}
    memory = parse_size(args.memory)
    print(f"measuring gcache (gcache-server --memory {args.memory}, arena on /dev/shm; filled "
          f"with {args.fill:.2f}x its size first) ...", flush=True)
    with LocalCluster(1, memory=args.memory) as cluster:
        with Client(cluster.addresses, timeout_s=5.0) as client:
            steady.fill(GCacheStore(client), workloads[4 * MiB], int(memory * args.fill))
        for transport in transports:
            with Client(cluster.addresses, timeout_s=5.0, transport=transport) as client:
                medians, spreads, evictions = gcache_rows(client, workloads, latency,
                                                          args.rounds, (1, 4))
            for name, row in medians.items():
                out["gcache"][f"{transport}/{name}"] = row
            for name, row in spreads.items():
                out["spread"][f"{transport}/{name}"] = row
            out["evictions"][transport] = evictions
        out["gcache"]["shm/batch_scaling"] = batch_scaling(cluster.addresses,
                                                           workloads[4 * MiB], args.rounds)
        if not args.no_c and c_sdk.build():
            print("measuring the C SDK (libgcache; best of 3, fresh keys) ...", flush=True)
            out["gcache"].update(c_sdk.figures(cluster.addresses[0], 3, 256 * MiB))
    return out


def batch_scaling(addresses: list[str], w: Workload, rounds: int) -> dict[str, float]:
    """Tuned: ``batch_get_into`` of the 4 MiB working set over shared memory with 1 and 2 IO
    threads (the default is 4), medians, GB/s."""
    figures = {}
    for io_threads in (1, 2):
        with Client(addresses, timeout_s=5.0, io_threads=io_threads, transport="shm") as client:
            rows = steady.rounds(GCacheStore(client), w, rounds=rounds, threads=1,
                                 ops=("put", "batch_get_into16"))
        figures[f"io_threads_{io_threads}_gbps"] = rows["batch_get_into16_t1"]["median"]
    return figures


def measure_tuned(args: argparse.Namespace, w: Workload) -> dict:
    """Tuned: the same server and rounds with the arena on a tmpfs mounted huge=within_size
    (4 MiB, one thread, tcp and shm); {} where this process may not mount one."""
    with huge_tmpfs(parse_size(args.memory) + 256 * MiB) as huge:
        if huge is None:
            print("no huge-page tmpfs (needs root): no tuned arena rows")
            return {}
        print("measuring gcache, tuned: arena on a tmpfs mounted huge=within_size ...",
              flush=True)
        rows: dict = {}
        with LocalCluster(1, memory=args.memory, arena_dir=huge) as cluster:
            with Client(cluster.addresses, timeout_s=5.0) as client:
                steady.fill(GCacheStore(client), w, int(parse_size(args.memory) * args.fill))
            for transport in ("tcp", "shm"):
                with Client(cluster.addresses, timeout_s=5.0, transport=transport) as client:
                    spreads = steady.rounds(GCacheStore(client), w, rounds=args.rounds,
                                            threads=1, ops=("put", "get_into"))
                for op, s in spreads.items():
                    rows[f"{transport} {op}@4MiB"] = s
        return {"huge tmpfs arena": rows}


def measure_limits(args: argparse.Namespace, workloads: dict[int, Workload]) -> tuple[dict, dict]:
    """Every limit in the steady rounds: medians (by the names update_readme reads) and their
    spreads."""
    print("measuring limits: memcpy, raw loopback socket, redis ...", flush=True)
    spreads: dict = {}
    for size, w in workloads.items():
        spreads[f"memcpy_{size // MiB}MiB_gbps"] = steady.memcpy_rounds(w, rounds=args.rounds)
        spreads[f"raw_socket_{size // MiB}MiB_gbps"] = raw_socket_rounds(w, rounds=args.rounds)
    spreads["memcpy_gbps"] = spreads["memcpy_4MiB_gbps"]
    limits = {name: s["median"] for name, s in spreads.items()}
    limits["raw_socket_64KiB_rtt_p50_ms"] = raw_socket_latency_ms(rounds=args.rounds)
    limits["memcpy_2threads_gbps"] = memcpy_threads_gbps(2)
    with RedisServer() as redis_server:
        if redis_server is None:
            print("redis-server not installed (make redis installs it): no Redis baseline")
        for size, w in workloads.items() if redis_server is not None else ():
            redis = redis_rounds(redis_server.port, w, rounds_n=args.rounds,
                                 memory_bytes=parse_size(args.memory),
                                 fill_bytes=int(parse_size(args.memory) * args.fill))
            for op, verb in (("put_t1", "set"), ("get_t1", "get")):
                spreads[f"redis_{verb}_{size // MiB}MiB_gbps"] = redis[op]
                limits[f"redis_{verb}_{size // MiB}MiB_gbps"] = redis[op]["median"]
            spreads[f"redis_{size // MiB}MiB_misses_per_get"] = redis["misses_per_get"]
    if nixl.available():
        print("measuring the bare NIXL loop ...", flush=True)
        limits.update(nixl_limits(args.nixl_runs))
    mooncake = mooncake_figures(args)
    if mooncake is not None:
        spreads["mooncake"] = mooncake.pop("spread")
        limits["mooncake"] = mooncake
    return limits, spreads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (after a warm-up)")
    parser.add_argument("--working-set", default="256MiB", help="bytes of distinct values, "
                        "per value size")
    parser.add_argument("--memory", default="1GiB", help="the server's --memory")
    parser.add_argument("--fill", type=float, default=1.25,
                        help="bytes put before the rounds, as a multiple of --memory")
    parser.add_argument("--nixl-runs", type=int, default=3)
    parser.add_argument("--no-tuned", action="store_true", help="skip the tuned rows")
    parser.add_argument("--no-c", action="store_true", help="skip the C SDK rows")
    parser.add_argument("--no-write", action="store_true",
                        help="print only (a trial run): bench/results/ is left as it is")
    args = parser.parse_args()
    started = time.monotonic()
    ws = parse_size(args.working_set)
    workloads = {size: Workload(size, max(16, ws // size // 16 * 16), seed=size)
                 for size in SIZES}
    latency = Workload(64 * 1024, 1024, seed=64)

    limits, limit_spreads = measure_limits(args, workloads)
    transports = ["tcp", "shm"] + (["nixl"] if nixl.available() else [])
    measured = measure_gcache(args, workloads, latency, transports)
    gcache = measured["gcache"]
    tuned = {} if args.no_tuned else measure_tuned(args, workloads[4 * MiB])
    report = {"date": dt.date.today().isoformat(), "host": platform.node(),
              "cpus": os.cpu_count(), "python": platform.python_version(),
              "mode": "steady", "arena": "/dev/shm", "repeat": args.rounds,
              "setup": {"server_flags": f"--memory {args.memory}", "arena": "/dev/shm",
                        "working_set_bytes": ws, "fill_bytes": int(parse_size(args.memory)
                                                                   * args.fill),
                        "rounds": args.rounds, "client": "default ClientConfig, timeout_s 5",
                        "sizes": [*SIZES, 64 * 1024]},
              "limits": limits, "gcache": gcache, "spread": {**measured["spread"],
                                                             "limits": limit_spreads},
              "evictions": measured["evictions"], "tuned": tuned,
              "ratios": ratios(limits, gcache, measured["spread"]),
              "seconds": time.monotonic() - started}
    print_table(report)
    if not args.no_write:
        write_results("dataplane", report, dated=True)
    return 0


MOONCAKE_VENV = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             ".venv-mooncake")
MOONCAKE_PY = os.path.join(MOONCAKE_VENV, "bin", "python")
# libibverbs unpacked into the environment (Makefile: never installed on the system)
MOONCAKE_LIBS = ":".join(os.path.join(MOONCAKE_VENV, "ibverbs", *top, "lib", "x86_64-linux-gnu")
                         for top in (("usr",), ()))


def mooncake_figures(args: argparse.Namespace) -> dict | None:
    """Mooncake Store's medians (GB/s by size and row name, and their ``spread``), from its
    own environment; None, said, when ``make mooncake`` has not made it."""
    if not os.path.exists(MOONCAKE_PY):
        print("no .venv-mooncake (make mooncake makes it): no Mooncake baseline")
        return None
    print("measuring Mooncake Store over TCP ...", flush=True)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mooncake_store.py")
    env = dict(os.environ, LD_LIBRARY_PATH=MOONCAKE_LIBS)
    done = subprocess.run([MOONCAKE_PY, script, "--rounds", str(args.rounds), "--working-set",
                           str(parse_size(args.working_set)), "--fill",
                           str(int(parse_size(args.memory) * args.fill))],
                          capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:                # a baseline's failure costs its rows, not the run
        print(f"bench/mooncake_store.py failed: no Mooncake baseline\n{done.stderr[-3000:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def nixl_limits(runs: int) -> dict[str, float]:
    """The bare NIXL READ and WRITE loop, one 4 MiB transfer (1 MiB descriptors) in flight,
    256 MiB a run: medians of ``runs`` runs."""
    measured = [nixl_bare.measure(argparse.Namespace(total_mib=256, value_mib=4, io_mib=1,
                                                     in_flight=1)) for _ in range(runs)]
    return {"nixl_bare_read_4MiB_gbps": steady.spread([r["read_gb_s"] for r in measured])["median"],
            "nixl_bare_write_4MiB_gbps": steady.spread(
                [r["write_gb_s"] for r in measured])["median"]}


def small_page_lines(gcache: dict) -> list[str]:
    """What huge pages bought, one line per transport: the reports of 2026-12-04..07 measured
    the arena on 4 KiB pages beside a huge-page one (``small_pages``); steady-state reports
    put that comparison in ``tuned`` instead, and have no such lines."""
    lines = []
    for name, small in gcache.get("small_pages", {}).items():
        transport, rest = name.split(" ", 1)
        op = rest.removesuffix("@4MiB")
        huge = gcache[f"{transport}/4MiB"][op]
        lines.append(f"{transport} {op.removesuffix('_t1')} 4 MiB, 1 thread: {small:.2f} GB/s "
                     f"with the arena on 4 KiB pages, {huge:.2f} on huge pages "
                     f"({huge / small:.2f}×)")
    return lines


if __name__ == "__main__":
    sys.exit(main())

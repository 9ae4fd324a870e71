"""Data-plane benchmark: GCache over TCP, shared memory and NIXL against limits measured in the
same run.

Limits: single-thread memcpy over 256 MiB of distinct 4 MiB blocks (and the same with two threads
at once); a raw Python loopback socket between two processes (one request byte, then ``sendall``
-> ``recv_into``: the shape of a GET); Redis GET/SET (Debian redis-server on loopback, no
persistence, redis-py + hiredis). GCache runs one real ``gcache-server`` process; the client is
this process, forced to TCP, to shared memory (same host) and to NIXL (UCX's own choice of
transports, here shared memory and TCP; buffers registered once with ``register_buffer``). TCP
figures are ratios to the raw socket and Redis, shared-memory figures to memcpy, NIXL figures to a
bare NIXL READ (for gets) or WRITE (for puts) loop between two processes over the same UCX
transports, one 4 MiB transfer of 1 MiB descriptors at a time (``bench/nixl_bare.py``), the shape
of one thread's ``get_into``. Mooncake Store over TCP (``bench/mooncake_store.py``, run in
``.venv-mooncake`` from ``make mooncake``: master, a storage process, a client that mounts no
segment) is measured in the same run on the same rows, and every TCP row shows GCache ÷
Mooncake. Every figure is the best of
``--repeat`` runs, limits included. Prints a table and writes JSON to ``bench/results/``.
Targets come from the foundation and same-host issues; they are reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import c_sdk
import nixl_bare
from baselines import (
    RedisServer,
    memcpy_gbps,
    memcpy_threads_gbps,
    raw_socket_gbps,
    raw_socket_p50_ms,
    redis_gbps,
)
from results_file import write_results
from timing import threaded_gbps

from gcache.cli.local_cluster import LocalCluster
from gcache.sdk import Client
from gcache.server.arena import ARENA_DIR
from gcache.server.huge_pages import huge_tmpfs
from gcache.transport import nixl

MiB = 1 << 20


def best_of(repeat: int, fn) -> float:
    return max(fn() for _ in range(repeat))


def gcache_figures(client: Client, size: int, repeat: int, total_bytes: int) -> dict[str, float]:
    keys = [f"bench/{size}/{i}" for i in range(16)]
    value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    assert all(client.batch_put(keys, [value] * len(keys)))
    ops = max(8, total_bytes // size)
    outs = [[np.empty(size, dtype=np.uint8) for _ in range(16)] for _ in range(4)]
    buffers = [value, *(out for row in outs for out in row)]
    for buffer in buffers:
        client.register_buffer(buffer)                 # NIXL: once each; a no-op elsewhere
    figures: dict[str, float] = {}
    for threads in (1, 4):
        n = max(4, ops // threads)

        def put(t: int, i: int) -> None:
            assert client.put(keys[(t * 4 + i) % 16], value)

        def get(t: int, i: int) -> None:
            assert client.get(keys[(t * 4 + i) % 16]) is not None

        def get_into(t: int, i: int) -> None:
            assert client.get_into(keys[(t * 4 + i) % 16], outs[t][0]) == size

        for name, op in (("put", put), ("get", get), ("get_into", get_into)):
            figures[f"{name}_t{threads}"] = best_of(
                repeat, lambda: threaded_gbps(threads, n, size, op))
        batch_n = max(1, n // 16)

        def batch(t: int, i: int) -> None:
            assert client.batch_get_into(keys, outs[t]) == [size] * 16

        figures[f"batch_get_into16_t{threads}"] = best_of(
            repeat, lambda: threaded_gbps(threads, batch_n, 16 * size, batch))
    for buffer in buffers:
        client.unregister_buffer(buffer)
    return figures


def latency_ms(client: Client, size: int, count: int = 2000) -> dict[str, float]:
    value = os.urandom(size)
    out = bytearray(size)
    assert client.put("bench/latency", value)
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        client.get_into("bench/latency", out)
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return {"p50_ms": statistics.median(samples), "p99_ms": samples[int(0.99 * len(samples))]}


def batch_scaling(addresses: list[str], repeat: int) -> dict[str, float]:
    """batch_get_into of 16 x 4 MiB over shared memory with 1 and with 2 IO threads, GB/s."""
    keys = [f"bench/scaling/{i}" for i in range(16)]
    value = np.random.default_rng(16).integers(0, 256, 4 * MiB, dtype=np.uint8)
    outs = [np.empty(4 * MiB, dtype=np.uint8) for _ in keys]
    figures = {}
    for io_threads in (1, 2):
        with Client(addresses, timeout_s=5.0, io_threads=io_threads, transport="shm") as client:
            assert all(client.batch_put(keys, [value] * 16))

            def run() -> float:
                start = time.perf_counter()
                for _ in range(8):
                    assert client.batch_get_into(keys, outs) == [4 * MiB] * 16
                return 8 * 16 * 4 * MiB / (time.perf_counter() - start) / 1e9

            figures[f"io_threads_{io_threads}_gbps"] = best_of(repeat, run)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bytes-per-run", type=int, default=256 * MiB)
    parser.add_argument("--arena-dir", help="the server's --arena-dir (default: a tmpfs "
                        "mounted huge=within_size for the run where this process may mount "
                        "one, else /dev/shm)")
    args = parser.parse_args()

    print("measuring limits: memcpy, raw loopback socket, redis ...", flush=True)
    limits: dict = {"memcpy_gbps": best_of(args.repeat, memcpy_gbps)}
    for size in (MiB, 4 * MiB):
        limits[f"raw_socket_{size // MiB}MiB_gbps"] = best_of(
            args.repeat, lambda: raw_socket_gbps(size, max(16, args.bytes_per_run // size)))
    limits["raw_socket_64KiB_rtt_p50_ms"] = min(raw_socket_p50_ms() for _ in range(args.repeat))
    with RedisServer() as redis_server:
        for size in (MiB, 4 * MiB):
            if redis_server is None:
                print("redis-server not installed (make bench installs it): no Redis baseline")
                break
            runs = [redis_gbps(redis_server.port, size, max(16, args.bytes_per_run // size))
                    for _ in range(args.repeat)]
            limits[f"redis_set_{size // MiB}MiB_gbps"] = max(r["set_gbps"] for r in runs)
            limits[f"redis_get_{size // MiB}MiB_gbps"] = max(r["get_gbps"] for r in runs)

    limits["memcpy_2threads_gbps"] = memcpy_threads_gbps(2)
    transports = ["tcp", "shm"]
    if nixl.available():
        print("measuring the bare NIXL loop ...", flush=True)
        limits.update(nixl_limits(args.repeat, args.bytes_per_run))
        transports.append("nixl")
    else:
        print("nixl-cu12 not installed (make bench installs it): no NIXL rows")
    mooncake = mooncake_figures(args.repeat, args.bytes_per_run)
    if mooncake is not None:
        limits["mooncake"] = mooncake
    gcache: dict = {}
    with contextlib.ExitStack() as stack:
        huge = None if args.arena_dir else stack.enter_context(huge_tmpfs(2 << 30))
        arena = args.arena_dir or huge or ARENA_DIR
        print(f"measuring gcache (one gcache-server process on loopback, its arena in {arena}"
              f"{', a tmpfs mounted huge=within_size' if huge else ''}) ...", flush=True)
        with LocalCluster(1, memory="1GiB", server_args=("--nixl",), arena_dir=arena) as cluster:
            for transport in transports:
                with Client(cluster.addresses, timeout_s=5.0, io_threads=4,
                            transport=transport) as client:
                    for size in (MiB, 4 * MiB):
                        gcache[f"{transport}/{size // MiB}MiB"] = gcache_figures(
                            client, size, args.repeat, args.bytes_per_run)
                    gcache[f"{transport}/get_into_64KiB_latency"] = latency_ms(client, 64 * 1024)
            gcache["shm/batch_scaling"] = batch_scaling(cluster.addresses, args.repeat)
            if c_sdk.build():
                print("measuring the C SDK (libgcache) ...", flush=True)
                gcache.update(c_sdk.figures(cluster.addresses[0], args.repeat,
                                            args.bytes_per_run))
    if huge:
        gcache["small_pages"] = small_pages(transports, args.repeat, args.bytes_per_run)

    report = {"date": dt.date.today().isoformat(), "host": platform.node(),
              "cpus": os.cpu_count(), "python": platform.python_version(),
              "arena": "tmpfs huge=within_size" if huge else arena,
              "repeat": args.repeat, "bytes_per_run": args.bytes_per_run,
              "limits": limits, "gcache": gcache, "ratios": ratios(limits, gcache)}
    print_table(report)
    write_results("dataplane", report, dated=True)
    return 0


def small_pages(transports: list[str], repeat: int, total_bytes: int) -> dict[str, float]:
    """Single-thread 4 MiB ``get_into`` and ``put`` with the arena on /dev/shm's 4 KiB pages,
    for the comparison that docs/rdma.md's advice to mount a huge-page tmpfs rests on."""
    print(f"measuring gcache with its arena in {ARENA_DIR} (4 KiB pages) ...", flush=True)
    figures: dict[str, float] = {}
    ops = max(8, total_bytes // (4 * MiB))
    value = np.random.default_rng(4).integers(0, 256, 4 * MiB, dtype=np.uint8)
    out = np.empty_like(value)
    with LocalCluster(1, memory="1GiB", server_args=("--nixl",)) as cluster:
        for transport in transports:
            with Client(cluster.addresses, timeout_s=5.0, transport=transport) as client:
                client.register_buffer(value)
                client.register_buffer(out)

                def put(t: int, i: int) -> None:
                    assert client.put(f"small/{i % 16}", value)

                def get_into(t: int, i: int) -> None:
                    assert client.get_into(f"small/{i % 16}", out) == out.nbytes

                for name, op in (("put", put), ("get_into", get_into)):
                    figures[f"{transport} {name}_t1@4MiB"] = best_of(
                        repeat, lambda: threaded_gbps(1, ops, out.nbytes, op))
                client.unregister_buffer(value)
                client.unregister_buffer(out)
    return figures


MOONCAKE_VENV = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             ".venv-mooncake")
MOONCAKE_PY = os.path.join(MOONCAKE_VENV, "bin", "python")
# libibverbs unpacked into the environment (Makefile: never installed on the system)
MOONCAKE_LIBS = ":".join(os.path.join(MOONCAKE_VENV, "ibverbs", *top, "lib", "x86_64-linux-gnu")
                         for top in (("usr",), ()))


def mooncake_figures(repeat: int, total_bytes: int) -> dict | None:
    """Mooncake Store's rows (GB/s by size and row name), from its own environment; None,
    said, when ``make mooncake`` has not made it."""
    if not os.path.exists(MOONCAKE_PY):
        print("no .venv-mooncake (make bench makes it): no Mooncake baseline")
        return None
    print("measuring Mooncake Store over TCP ...", flush=True)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mooncake_store.py")
    env = dict(os.environ, LD_LIBRARY_PATH=MOONCAKE_LIBS)
    done = subprocess.run([MOONCAKE_PY, script, "--repeat", str(repeat), "--bytes-per-run",
                           str(total_bytes)], capture_output=True, text=True, timeout=1800,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(f"bench/mooncake_store.py failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def nixl_limits(repeat: int, total_bytes: int) -> dict[str, float]:
    """The bare NIXL READ and WRITE loop, one 4 MiB transfer (1 MiB descriptors) in flight."""
    runs = [nixl_bare.measure(argparse.Namespace(
        total_mib=max(16, total_bytes // MiB // 4 * 4), value_mib=4, io_mib=1, in_flight=1))
        for _ in range(repeat)]
    return {"nixl_bare_read_4MiB_gbps": max(r["read_gb_s"] for r in runs),
            "nixl_bare_write_4MiB_gbps": max(r["write_gb_s"] for r in runs)}


def ratios(limits: dict, gcache: dict) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    if "nixl/4MiB" in gcache:
        for name, gbps in gcache["nixl/4MiB"].items():
            bare = "write" if name.startswith("put") else "read"
            out[f"nixl {name}@4MiB"] = {"gbps": gbps,
                                        "x_limit": gbps / limits[f"nixl_bare_{bare}_4MiB_gbps"],
                                        "limit": f"bare NIXL {bare.upper()}"}
    for size in ("1MiB", "4MiB"):
        raw = limits[f"raw_socket_{size}_gbps"]
        for name, gbps in gcache[f"tcp/{size}"].items():
            row = {"gbps": gbps, "x_limit": gbps / raw, "limit": "raw socket"}
            redis_key = "set" if name.startswith("put") else "get"
            if f"redis_{redis_key}_{size}_gbps" in limits:
                row["x_redis"] = gbps / limits[f"redis_{redis_key}_{size}_gbps"]
            if name in limits.get("mooncake", {}).get(size, {}):
                row["x_mooncake"] = gbps / limits["mooncake"][size][name]
            out[f"tcp {name}@{size}"] = row
        for name, gbps in gcache[f"shm/{size}"].items():
            out[f"shm {name}@{size}"] = {"gbps": gbps, "x_limit": gbps / limits["memcpy_gbps"],
                                         "limit": "memcpy"}
    out.update(c_sdk.ratios(limits, gcache))
    return out


def small_page_lines(gcache: dict) -> list[str]:
    """What the arena's huge pages bought, one line per transport (none when not measured)."""
    lines = []
    for name, small in gcache.get("small_pages", {}).items():
        transport, rest = name.split(" ", 1)
        op = rest.removesuffix("@4MiB")
        huge = gcache[f"{transport}/4MiB"][op]
        lines.append(f"{transport} {op.removesuffix('_t1')} 4 MiB, 1 thread: {small:.2f} GB/s "
                     f"with the arena on 4 KiB pages, {huge:.2f} on huge pages "
                     f"({huge / small:.2f}×)")
    return lines


TARGETS = {"tcp get_into_t1@4MiB": 0.85, "tcp put_t1@4MiB": 0.7, "tcp get_into_t1@1MiB": 0.75,
           "shm get_into_t1@4MiB": 0.85, "shm put_t1@4MiB": 0.6,
           "nixl get_into_t1@4MiB": 0.8, "nixl put_t1@4MiB": 0.7}
MOONCAKE_TARGET = 1.5      # GCache / Mooncake on every TCP row


def print_table(report: dict) -> None:
    limits, gcache = report["limits"], report["gcache"]
    print(f"\nGCache data plane, {report['date']}, {report['cpus']} CPUs, Python "
          f"{report['python']}")
    print("limits (GB/s): " + ", ".join(f"{k.removesuffix('_gbps')}={v:.2f}"
                                        for k, v in limits.items() if k.endswith("_gbps")))
    print(f"\n{'operation':<32}{'GB/s':>8}{'x limit':>9}{'x redis':>9}{'x mooncake':>11}"
          f"{'x python':>9}  target")
    for name, row in report["ratios"].items():
        targets = []
        if name in TARGETS:
            goal = TARGETS[name]
            targets.append(f">= {goal}x {row['limit']}: "
                           f"{'met' if row['x_limit'] >= goal else 'NOT met'}")
        if "x_mooncake" in row:
            targets.append(f">= {MOONCAKE_TARGET}x mooncake: "
                           f"{'met' if row['x_mooncake'] >= MOONCAKE_TARGET else 'NOT met'}")
        cells = "".join(f"{row[k]:>{w}.2f}" if k in row else f"{'-':>{w}}"
                        for k, w in (("x_redis", 9), ("x_mooncake", 11), ("x_python", 9)))
        print(f"{name:<32}{row['gbps']:>8.2f}{row['x_limit']:>9.2f}{cells}  "
              + "; ".join(targets))
    tcp = report["gcache"]["tcp/4MiB"]
    for t in (1, 4):
        batch = tcp[f"batch_get_into16_t{t}"] / tcp[f"get_into_t{t}"]
        print(f"tcp batch_get_into 16x4MiB, {t} thread(s): {batch:.2f}x of 16 single get_into "
              f"(target >= 1x: {'met' if batch >= 1 else 'NOT met'})")
    raw_ms = limits["raw_socket_64KiB_rtt_p50_ms"]
    for transport, goal in (("tcp", 0.2), ("shm", 0.08)):
        lat = gcache[f"{transport}/get_into_64KiB_latency"]
        print(f"{transport + ' get_into 64KiB latency':<32} p50={lat['p50_ms']:.3f} ms "
              f"p99={lat['p99_ms']:.3f} ms  target p50 <= {goal} ms: "
              f"{'met' if lat['p50_ms'] <= goal else 'NOT met'}")
    print(f"{'(raw socket 64KiB round trip)':<32} p50={raw_ms:.3f} ms")
    for line in small_page_lines(gcache) + c_sdk.lines(report):
        print(line)
    scaling = gcache["shm/batch_scaling"]
    ours = scaling["io_threads_2_gbps"] / scaling["io_threads_1_gbps"]
    machine = limits["memcpy_2threads_gbps"] / limits["memcpy_gbps"]
    print(f"{'shm batch_get_into 16x4MiB':<32} 1 IO thread {scaling['io_threads_1_gbps']:.2f} "
          f"GB/s, 2 IO threads {scaling['io_threads_2_gbps']:.2f} GB/s: {ours:.2f}x "
          f"(target >= 1.5x: {'met' if ours >= 1.5 else 'NOT met'}; two memcpy threads reach "
          f"{machine:.2f}x on this machine)")


if __name__ == "__main__":
    sys.exit(main())

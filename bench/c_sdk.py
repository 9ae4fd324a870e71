"""The C SDK's rows of bench/dataplane.py: libgcache (``sdk-c/``) timed the way the Python
SDK's rows are (one thread, 16 distinct values round robin, the best of ``repeat`` runs; see
``sdk-c/bench/gcache_bench.c``), against the same ``gcache-server``, over TCP and shared
memory, 1 and 4 MiB. The program is built with ``make -C sdk-c bench`` (the system compiler and
Debian's libxxhash-dev); where it cannot be, the run says so and has no C rows."""

from __future__ import annotations

import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "sdk-c", "build", "gcache_bench")
MiB = 1 << 20


def build() -> bool:
    """Build the bench program; False (said) when it cannot be built here."""
    done = subprocess.run(["make", "--no-print-directory", "-C", os.path.join(ROOT, "sdk-c"),
                           "bench"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(f"the C SDK's bench program did not build: no C rows\n{done.stderr[-2000:]}")
        return False
    return True


def figures(address: str, repeat: int, total_bytes: int) -> dict[str, dict[str, float]]:
    """``{"c-tcp/1MiB": {"put_t1": GB/s, "get_into_t1": GB/s}, ...}``."""
    out: dict[str, dict[str, float]] = {}
    for transport in ("tcp", "shm"):
        for size in (MiB, 4 * MiB):
            done = subprocess.run([PROGRAM, "--servers", address, "--transport", transport,
                                   "--size", str(size), "--ops", str(max(8, total_bytes // size)),
                                   "--repeat", str(repeat)],
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"gcache_bench {transport} {size} failed:\n{done.stderr}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            if row["transport"] != transport:
                raise RuntimeError(f"gcache_bench asked for {transport}, used {row['transport']}")
            out[f"c-{transport}/{size // MiB}MiB"] = {"put_t1": row["put_t1"],
                                                      "get_into_t1": row["get_into_t1"]}
    return out


def ratios(limits: dict, gcache: dict) -> dict[str, dict[str, object]]:
    """The C rows against the limits (raw socket for TCP, memcpy for shm) and against the
    Python SDK's same row (``x_python``)."""
    out: dict[str, dict[str, object]] = {}
    for transport in ("tcp", "shm"):
        for size in ("1MiB", "4MiB"):
            rows = gcache.get(f"c-{transport}/{size}")
            if rows is None:
                continue
            limit, name = (limits[f"raw_socket_{size}_gbps"], "raw socket") \
                if transport == "tcp" else (limits["memcpy_gbps"], "memcpy")
            for op, gbps in rows.items():
                out[f"{transport} c-sdk {op}@{size}"] = {
                    "gbps": gbps, "x_limit": gbps / limit, "limit": name,
                    "x_python": gbps / gcache[f"{transport}/{size}"][op]}
    return out


def lines(report: dict) -> list[str]:
    """One line per transport: the C SDK's figures over the Python SDK's, one thread."""
    out = []
    for transport in ("tcp", "shm"):
        cells = [f"{op.removesuffix('_t1')} {size} {row['x_python']:.2f}×"
                 for name, row in report["ratios"].items()
                 if name.startswith(f"{transport} c-sdk ")
                 for op, size in [name.split(" ", 2)[2].split("@")]]
        if cells:
            out.append(f"C SDK (libgcache) over the Python SDK, {transport}, 1 thread: "
                       + ", ".join(cells))
    return out

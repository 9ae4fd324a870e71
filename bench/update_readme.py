"""Render bench/results/dataplane-latest.json into README.md between the bench markers.

``make bench`` runs it after the benchmark, so the README always shows the latest measured
figures with their date; nothing in the table is typed by hand.
"""

from __future__ import annotations

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- bench:dataplane:start -->", "<!-- bench:dataplane:end -->"


def render(report: dict) -> str:
    limits, gcache = report["limits"], report["gcache"]
    lines = [
        f"Measured {report['date']} by `make bench` on {report['cpus']} CPUs, Python "
        f"{report['python']}: one `gcache-server` on loopback, the client in another process, "
        "forced to TCP and then over shared memory; best of 3 runs for every figure, limits "
        "included.",
        "",
        f"Limits in the same run: memcpy {limits['memcpy_gbps']:.2f} GB/s (two threads at once "
        f"{limits['memcpy_2threads_gbps']:.2f}); raw loopback socket "
        f"{limits['raw_socket_1MiB_gbps']:.2f} GB/s (1 MiB) and "
        f"{limits['raw_socket_4MiB_gbps']:.2f} GB/s (4 MiB); Redis GET "
        f"{limits.get('redis_get_4MiB_gbps', float('nan')):.2f} / SET "
        f"{limits.get('redis_set_4MiB_gbps', float('nan')):.2f} GB/s (4 MiB). TCP rows are "
        "ratios to the raw socket (and Redis), shared-memory rows to memcpy.",
        "",
        "| transport | operation | client threads | size | GB/s | × limit | × Redis |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in report["ratios"].items():
        transport, rest = name.split(" ", 1)
        op, size = rest.split("@")
        op, threads = op.rsplit("_t", 1)
        redis = f"{row['x_redis']:.2f}" if "x_redis" in row else "–"
        lines.append(f"| {transport} | {op} | {threads} | {size} | {row['gbps']:.2f} | "
                     f"{row['x_limit']:.2f} × {row['limit']} | {redis} |")
    lines.append("")
    for transport in ("tcp", "shm"):
        lat = gcache[f"{transport}/get_into_64KiB_latency"]
        lines.append(f"- 64 KiB `get_into` over {transport}: p50 {lat['p50_ms']:.3f} ms, "
                     f"p99 {lat['p99_ms']:.3f} ms.")
    lines.append(f"- Raw socket 64 KiB round trip: p50 "
                 f"{limits['raw_socket_64KiB_rtt_p50_ms']:.3f} ms.")
    scaling = gcache["shm/batch_scaling"]
    lines.append(f"- `batch_get_into` of 16 × 4 MiB over shared memory: "
                 f"{scaling['io_threads_1_gbps']:.2f} GB/s with 1 IO thread, "
                 f"{scaling['io_threads_2_gbps']:.2f} GB/s with 2 "
                 f"({scaling['io_threads_2_gbps'] / scaling['io_threads_1_gbps']:.2f}×; two "
                 f"memcpy threads reach "
                 f"{limits['memcpy_2threads_gbps'] / limits['memcpy_gbps']:.2f}× here).")
    return "\n".join(lines)


def main() -> int:
    with open(os.path.join(ROOT, "bench", "results", "dataplane-latest.json")) as fh:
        report = json.load(fh)
    path = os.path.join(ROOT, "README.md")
    with open(path) as fh:
        text = fh.read()
    if START not in text or END not in text:
        print(f"README.md lacks the markers {START} / {END}", file=sys.stderr)
        return 1
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    text = pattern.sub(lambda _: f"{START}\n{render(report)}\n{END}", text)
    with open(path, "w") as fh:
        fh.write(text)
    print(f"README.md: bench table of {report['date']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

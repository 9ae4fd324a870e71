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
    limits, lat = report["limits"], report["gcache"]["get_64KiB_latency"]
    lines = [
        f"Measured {report['date']} by `make bench` on {report['cpus']} CPUs, Python "
        f"{report['python']}; one `gcache-server` on loopback, client in another process; best "
        "of 3 runs for every figure, limits included.",
        "",
        f"Limits in the same run: memcpy {limits['memcpy_gbps']:.2f} GB/s; raw loopback socket "
        f"{limits['raw_socket_1MiB_gbps']:.2f} GB/s (1 MiB) and "
        f"{limits['raw_socket_4MiB_gbps']:.2f} GB/s (4 MiB); Redis GET "
        f"{limits.get('redis_get_4MiB_gbps', float('nan')):.2f} / SET "
        f"{limits.get('redis_set_4MiB_gbps', float('nan')):.2f} GB/s (4 MiB).",
        "",
        "| operation | threads | size | GB/s | × raw socket | × Redis |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in report["ratios"].items():
        op, size = name.split("@")
        op, threads = op.rsplit("_t", 1)
        redis = f"{row['x_redis']:.2f}" if "x_redis" in row else "–"
        lines.append(f"| {op} | {threads} | {size} | {row['gbps']:.2f} | "
                     f"{row['x_raw_socket']:.2f} | {redis} |")
    lines += ["", f"64 KiB `get` latency: p50 {lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms "
              f"(raw socket round trip p50 {limits['raw_socket_64KiB_rtt_p50_ms']:.3f} ms)."]
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

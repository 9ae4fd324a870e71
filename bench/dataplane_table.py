"""The ratios and the printed table of ``bench/dataplane.py``'s steady-state report.

A ratio is a GCache median over its limit's median from the same run: TCP rows over the raw
socket (and Redis, and Mooncake Store), shared-memory rows over memcpy of the same value size,
NIXL rows over the bare NIXL loop. Each row keeps its own p10 and p90 (GB/s) beside the median.
Targets are issue 46's, reported and never asserted.
"""

from __future__ import annotations

import c_sdk

TARGETS = {"tcp get_into_t1@4MiB": 0.85, "tcp put_t1@4MiB": 0.7, "tcp get_into_t1@1MiB": 0.75,
           "shm get_into_t1@4MiB": 0.85, "shm put_t1@4MiB": 0.6,
           "nixl get_into_t1@4MiB": 0.8, "nixl put_t1@4MiB": 0.7}
MOONCAKE_TARGET = 1.5      # GCache / Mooncake on every TCP row
LATENCY_TARGETS_MS = {"tcp": 0.2, "shm": 0.08}
OPS = ("put", "get", "get_into", "batch_get_into16")


def _row(gbps: float, limit: float, name: str, spread: dict | None) -> dict:
    row = {"gbps": gbps, "x_limit": gbps / limit, "limit": name}
    if spread is not None:
        row["p10_gbps"], row["p90_gbps"] = spread["p10"], spread["p90"]
    return row


def ratios(limits: dict, gcache: dict, spread: dict) -> dict[str, dict]:
    """``"<transport> <op>_t<threads>@<size>"`` -> gbps, x_limit, limit (its name), p10_gbps,
    p90_gbps, and x_redis / x_mooncake where those were measured."""
    out: dict[str, dict] = {}
    if "nixl/4MiB" in gcache and "nixl_bare_read_4MiB_gbps" in limits:
        for name, gbps in gcache["nixl/4MiB"].items():
            bare = "write" if name.startswith("put") else "read"
            out[f"nixl {name}@4MiB"] = _row(gbps, limits[f"nixl_bare_{bare}_4MiB_gbps"],
                                            f"bare NIXL {bare.upper()}",
                                            spread["nixl/4MiB"].get(name))
    for size in ("1MiB", "4MiB"):
        raw = limits[f"raw_socket_{size}_gbps"]
        for name, gbps in gcache[f"tcp/{size}"].items():
            row = _row(gbps, raw, "raw socket", spread[f"tcp/{size}"].get(name))
            verb = "set" if name.startswith("put") else "get"
            if name.endswith("_t1") and f"redis_{verb}_{size}_gbps" in limits:
                row["x_redis"] = gbps / limits[f"redis_{verb}_{size}_gbps"]
            if name in limits.get("mooncake", {}).get(size, {}):
                row["x_mooncake"] = gbps / limits["mooncake"][size][name]
            out[f"tcp {name}@{size}"] = row
        memcpy = limits.get(f"memcpy_{size}_gbps", limits["memcpy_gbps"])
        for name, gbps in gcache[f"shm/{size}"].items():
            out[f"shm {name}@{size}"] = _row(gbps, memcpy, "memcpy",
                                             spread[f"shm/{size}"].get(name))
    out.update(c_sdk.ratios(limits, gcache))
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def print_table(report: dict) -> None:
    limits, gcache, spread = report["limits"], report["gcache"], report["spread"]
    setup = report["setup"]
    print(f"\nGCache data plane, steady state, {report['date']}, {report['cpus']} CPUs, Python "
          f"{report['python']}: gcache-server {setup['server_flags']}, arena {setup['arena']}, "
          f"filled with {setup['fill_bytes'] / 2**30:.2f} GiB first, working set "
          f"{setup['working_set_bytes'] >> 20} MiB a size; medians of {setup['rounds']} rounds")
    print("limits (GB/s, medians): " + ", ".join(
        f"{k.removesuffix('_gbps')}={v:.2f}" for k, v in limits.items() if k.endswith("_gbps")))
    print(f"\n{'operation':<32}{'GB/s':>7}{'p10-p90':>12}{'x limit':>9}{'x redis':>9}"
          f"{'x mooncake':>11}{'x python':>9}  target")
    for name, row in report["ratios"].items():
        targets = []
        if name in TARGETS:
            targets.append(f">= {TARGETS[name]}x {row['limit']}: "
                           f"{_met(row['x_limit'] >= TARGETS[name])}")
        if "x_mooncake" in row:
            targets.append(f">= {MOONCAKE_TARGET}x mooncake: "
                           f"{_met(row['x_mooncake'] >= MOONCAKE_TARGET)}")
        band = (f"{row['p10_gbps']:.2f}-{row['p90_gbps']:.2f}" if "p10_gbps" in row else "-")
        cells = "".join(f"{row[k]:>{w}.2f}" if k in row else f"{'-':>{w}}"
                        for k, w in (("x_redis", 9), ("x_mooncake", 11), ("x_python", 9)))
        print(f"{name:<32}{row['gbps']:>7.2f}{band:>12}{row['x_limit']:>9.2f}{cells}  "
              + "; ".join(targets))
    print()
    for transport in ("tcp", "shm", "nixl"):
        for size in ("1MiB", "4MiB"):
            for t in (1, 4):
                ratio = spread.get(f"{transport}/{size}", {}).get(f"batch_x_single_t{t}")
                if ratio is not None:
                    print(f"{transport} batch_get_into 16x{size}, {t} thread(s): "
                          f"{ratio['median']:.2f}x of 16 single get_into (p10 "
                          f"{ratio['p10']:.2f}, p90 {ratio['p90']:.2f}; target >= 1x: "
                          f"{_met(ratio['median'] >= 1)})")
    for transport, goal in LATENCY_TARGETS_MS.items():
        lat = gcache[f"{transport}/get_into_64KiB_latency"]
        print(f"{transport + ' get_into 64KiB latency':<32} p50={lat['p50_ms']:.3f} ms "
              f"(rounds' p10-p90 {lat['p50_p10_ms']:.3f}-{lat['p50_p90_ms']:.3f}) "
              f"p99={lat['p99_ms']:.3f} ms  target p50 <= {goal} ms: "
              f"{_met(lat['p50_ms'] <= goal)}")
    raw_ms = limits["raw_socket_64KiB_rtt_p50_ms"]
    print(f"{'(raw socket 64KiB round trip)':<32} p50={raw_ms:.3f} ms")
    for transport, ev in report["evictions"].items():
        print(f"{transport}: per put in the rounds, the server evicted "
              f"{ev['evicted_objects']:.2f} objects and {ev['evicted_segments']:.3f} segments")
    for label, rows in report["tuned"].items():
        for name, s in rows.items():
            transport, rest = name.split(" ", 1)
            op, size = rest.split("@")
            base = gcache[f"{transport}/{size}"][op]
            print(f"tuned, {label}: {name} {s['median']:.2f} GB/s (p10 {s['p10']:.2f}, p90 "
                  f"{s['p90']:.2f}); default {base:.2f} ({s['median'] / base:.2f}x)")
    for line in c_sdk.lines(report):
        print(line)
    scaling = gcache["shm/batch_scaling"]
    ours = scaling["io_threads_2_gbps"] / scaling["io_threads_1_gbps"]
    machine = limits["memcpy_2threads_gbps"] / limits["memcpy_gbps"]
    print(f"tuned, shm batch_get_into 16x4MiB: 1 IO thread {scaling['io_threads_1_gbps']:.2f} "
          f"GB/s, 2 IO threads {scaling['io_threads_2_gbps']:.2f} GB/s: {ours:.2f}x (two "
          f"memcpy threads reach {machine:.2f}x on this machine)")
    print(f"run took {report['seconds']:.0f} s")

"""The data-plane section of docs/benchmarks/data-plane.md, rendered from the steady-state report
of ``bench/dataplane.py`` (``bench/results/dataplane-latest.json``) as the bench wrote it.

What the page shows is what the JSON holds: the run's set-up (``setup``), every GCache row as
the median of the timed rounds with the rounds' p10-p90 beside it (``ratios``), its ratio to
each limit measured in the same run (``limits``, spreads under ``spread.limits``), issue 46's
targets beside the rows they judge (issue 16's for NIXL), marked met or missed, then the batch
over single ratios per round, the 64 KiB latency, the evictions per put, Redis's misses and the
tuned set-ups (``tuned``, ``shm/batch_scaling``). A figure is never computed here except as a
ratio of two figures of the same run, and a row the JSON lacks is left out rather than filled in.

The targets come from ``dataplane_table`` (the bench prints the same marks); the 64 KiB latency
target is issue 46's shared-memory one only.
"""

from __future__ import annotations

from typing import Any

from dataplane_table import LATENCY_TARGETS_MS, MOONCAKE_TARGET, TARGETS

BATCH_TARGET = 1.0                                 # a 16-key batch over 16 single get_into, TCP
LATENCY_TARGET_MS = LATENCY_TARGETS_MS["shm"]      # issue 46: shm 64 KiB get_into p50
OP_NAMES = {"put": "`put`", "get": "`get`", "get_into": "`get_into`",
            "batch_get_into16": "`batch_get_into` of 16"}
LIMIT_NAMES = {"tcp": "raw socket", "shm": "memcpy", "nixl": "bare NIXL"}


def mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def size_name(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def split_row(name: str) -> tuple[str, str, str, str]:
    """``"tcp put_t1@4MiB"`` -> ("tcp", "put", "1", "4 MiB")."""
    transport, rest = name.split(" ", 1)
    op, size = rest.rsplit("@", 1)
    op, threads = op.rsplit("_t", 1)
    return transport, op, threads, size.replace("MiB", " MiB")


def spread_cell(median: float, spread: dict[str, float] | None) -> str:
    """``median (p10–p90)``, GB/s with two decimals."""
    if spread is None:
        return f"{median:.2f}"
    return f"{median:.2f} ({spread['p10']:.2f}–{spread['p90']:.2f})"


def target_cell(name: str, row: dict[str, Any]) -> str:
    """The issue's target for ``ratios[name]`` against its limit, and whether it was met."""
    goal = TARGETS.get(name)
    if goal is None:
        return "–"
    return f"≥ {goal:.2f}×: {mark(row['x_limit'] >= goal)}"


def render_dataplane(report: dict[str, Any]) -> str:
    if "setup" not in report:
        raise SystemExit("dataplane-latest.json has no 'setup': it was written by the bench "
                         "before the steady-state rewrite (issue 46); run bench/dataplane.py")
    parts = [intro(report), targets_table(report), limits_table(report)]
    parts += [gcache_table(report, t) for t in ("tcp", "shm", "nixl")
              if any(n.startswith(f"{t} ") for n in report["ratios"])]
    parts += [batch_table(report), latency_table(report), notes(report), tuned_table(report),
              c_sdk_table(report)]
    return "\n\n".join(p for p in parts if p)


def intro(report: dict[str, Any]) -> str:
    setup = report["setup"]
    sizes = [size_name(n) for n in setup["sizes"]]
    return (
        f"Measured {report['date']} by `bench/dataplane.py` as run, {report['seconds']:.0f} s on "
        f"{report['cpus']} CPUs, Python {report['python']}; the figures are the ones it wrote to "
        "`bench/results/dataplane-latest.json`. Set-up: one `gcache-server "
        f"{setup['server_flags']}` and no other flag, its arena on {setup['arena']}; the client "
        f"({setup['client']}) in the bench's process, with 1 or 4 threads. The server was first "
        f"filled with {setup['fill_bytes'] / 2**30:.2f} GiB of values nobody reads again, past "
        "its memory, so that every put of the rounds finds the arena full. Each round, over a "
        f"working set of {setup['working_set_bytes'] >> 20} MiB of distinct random values per "
        f"size ({' and '.join(sizes[:-1])}; {sizes[-1]} for the latency rows), deletes half of "
        "the keys, puts every key (half new, half overwrites), then reads every key back with "
        "`get_into`, `get` and `batch_get_into` of 16; a warm-up round checks every byte. Every "
        f"figure is the median of {setup['rounds']} timed rounds, in GB/s, with the rounds' "
        "p10–p90 in brackets. The limits were measured in the same run, before GCache's rounds, "
        "with the same rounds over the same working set, except where the table says otherwise.")


def target_checks(report: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, this run's figure, met) for each of issue 46's targets the report can judge
    (and issue 16's NIXL ones)."""
    ratios, spread, out = report["ratios"], report["spread"], []
    for name, goal in TARGETS.items():
        row = ratios.get(name)
        if row is None:
            continue
        transport, op, _, size = split_row(name)
        issue = " (issue 16)" if transport == "nixl" else ""
        out.append((f"{transport} {size} {OP_NAMES[op]}, 1 thread, ≥ {goal:.2f}× "
                    f"{row['limit']}{issue}", f"{row['x_limit']:.2f}×", row["x_limit"] >= goal))
    batch = spread.get("tcp/4MiB", {}).get("batch_x_single_t1")
    if batch is not None:
        out.append((f"tcp `batch_get_into` of 16 × 4 MiB ≥ {BATCH_TARGET:.1f}× of 16 single "
                    "`get_into`, 1 thread", f"{batch['median']:.2f}× ({batch['p10']:.2f}–"
                    f"{batch['p90']:.2f})", batch["median"] >= BATCH_TARGET))
    mooncake = {n: r["x_mooncake"] for n, r in ratios.items() if "x_mooncake" in r}
    if mooncake:
        short = [f"{op} {size} {threads} thread{'s' if threads != '1' else ''} {x:.2f}×"
                 for n, x in mooncake.items() if x < MOONCAKE_TARGET
                 for _, op, threads, size in [split_row(n)]]
        met = len(mooncake) - len(short)
        out.append((f"every tcp row ≥ {MOONCAKE_TARGET}× Mooncake Store",
                    f"{met} of {len(mooncake)} rows" + (f"; short: {', '.join(short)}"
                                                         if short else ""), not short))
    lat = report["gcache"].get("shm/get_into_64KiB_latency")
    if lat is not None:
        out.append((f"shm 64 KiB `get_into` p50 ≤ {LATENCY_TARGET_MS} ms",
                    f"{lat['p50_ms']:.3f} ms ({lat['p50_p10_ms']:.3f}–{lat['p50_p90_ms']:.3f})",
                    lat["p50_ms"] <= LATENCY_TARGET_MS))
    return out


def targets_table(report: dict[str, Any]) -> str:
    checks = target_checks(report)
    lines = [f"Targets (issue 46's; NIXL's from issue 16), judged on medians against limits "
             f"from the same run: {sum(ok for *_, ok in checks)} of {len(checks)} met in this "
             "run.", "",
             "| target | this run | |", "|---|---|---|"]
    lines += [f"| {what} | {figure} | {mark(ok)} |" for what, figure, ok in checks]
    return "\n".join(lines)


def limits_table(report: dict[str, Any]) -> str:
    limits, spreads = report["limits"], report["spread"]["limits"]

    def cells(key: str) -> str:
        return " | ".join(spread_cell(limits[k], spreads.get(k)) if k in limits else "–"
                          for k in (key.format(size="1MiB"), key.format(size="4MiB")))

    lines = ["| limit, same run | how | 1 MiB | 4 MiB |", "|---|---|---:|---:|",
             f"| memcpy (shm rows) | each value into its own buffer, 1 thread | "
             f"{cells('memcpy_{size}_gbps')} |",
             f"| raw loopback socket (tcp rows) | one connection from another process, a "
             f"request byte per value, `recv_into` its own buffer | "
             f"{cells('raw_socket_{size}_gbps')} |"]
    if "redis_set_4MiB_gbps" in limits:
        lines += [f"| Redis {verb.upper()} | `maxmemory` = the arena, `allkeys-lru`, filled "
                  f"the same way | {cells(f'redis_{verb}_{{size}}_gbps')} |"
                  for verb in ("set", "get")]
    mooncake, first = limits.get("mooncake", {}), True
    for op in dict.fromkeys(op for rows in mooncake.values() for op in rows):
        row = [spread_cell(mooncake[s][op], spreads.get("mooncake", {}).get(s, {}).get(op))
               if op in mooncake.get(s, {}) else "–" for s in ("1MiB", "4MiB")]
        name, threads = op.rsplit("_t", 1)
        how = ("master, a storage process and a client that mounts no segment, over TCP; "
               "1 GB segment filled the same way" if first else "the same")
        first = False
        lines.append(f"| Mooncake Store {OP_NAMES[name]}, {threads} thread"
                     f"{'s' if threads != '1' else ''} | {how} | {' | '.join(row)} |")
    for verb in ("read", "write"):
        if f"nixl_bare_{verb}_4MiB_gbps" in limits:
            lines.append(f"| bare NIXL {verb.upper()} (nixl rows) | `bench/nixl_bare.py`, one "
                         "4 MiB transfer at a time, median of runs, not the rounds | – | "
                         f"{limits[f'nixl_bare_{verb}_4MiB_gbps']:.2f} |")
    return "\n".join(lines)


def gcache_table(report: dict[str, Any], transport: str) -> str:
    """One transport's rows: median, spread, × its limit with the target beside it; TCP adds
    × Redis (one thread) and × Mooncake Store with its target."""
    tcp = transport == "tcp"
    head = (f"| size | operation | threads | GB/s (p10–p90) | × {LIMIT_NAMES[transport]} "
            "| target |" + (f" × Redis | × Mooncake Store (target ≥ {MOONCAKE_TARGET}×) |"
                            if tcp else ""))
    lines = [head, "|---|---|---:|---:|---:|---|" + ("---:|---|" if tcp else "")]
    for name, row in report["ratios"].items():
        if not name.startswith(f"{transport} ") or " c-sdk " in name:
            continue
        _, op, threads, size = split_row(name)
        band = ({"p10": row["p10_gbps"], "p90": row["p90_gbps"]} if "p10_gbps" in row
                else None)
        ratio = f"{row['x_limit']:.2f}"
        if transport == "nixl":                    # READ for gets, WRITE for puts
            ratio += f" ({row['limit'].removeprefix('bare NIXL ')})"
        cells = [size, OP_NAMES[op], threads, spread_cell(row["gbps"], band), ratio,
                 target_cell(name, row)]
        if tcp:
            cells.append(f"{row['x_redis']:.2f}" if "x_redis" in row else "–")
            cells.append(f"{row['x_mooncake']:.2f}: "
                         f"{mark(row['x_mooncake'] >= MOONCAKE_TARGET)}"
                         if "x_mooncake" in row else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def batch_table(report: dict[str, Any]) -> str:
    """``batch_x_single_t<n>``: each round's batch over its own single get_intos, median and
    spread over rounds (not the ratio of the two medians above)."""
    lines = [f"`batch_get_into` of 16 over 16 single `get_into`s, the median of each round's "
             f"ratio (p10–p90); target (tcp) ≥ {BATCH_TARGET:.1f}×:", "",
             "| transport | size | 1 thread | 4 threads |", "|---|---|---|---|"]
    for key, rows in report["spread"].items():
        if key == "limits" or "batch_x_single_t1" not in rows:
            continue
        transport, size = key.split("/")
        cells = []
        for t in (1, 4):
            s = rows.get(f"batch_x_single_t{t}")
            if s is None:
                cells.append("–")
                continue
            cell = f"{s['median']:.2f}× ({s['p10']:.2f}–{s['p90']:.2f})"
            cells.append(cell + (f": {mark(s['median'] >= BATCH_TARGET)}"
                                 if transport == "tcp" else ""))
        lines.append(f"| {transport} | {size.replace('MiB', ' MiB')} | {' | '.join(cells)} |")
    return "\n".join(lines)


def latency_table(report: dict[str, Any]) -> str:
    gcache = report["gcache"]
    lines = ["64 KiB `get_into`, each timed alone after the round's deletes and puts, in ms: "
             "the median over rounds of each round's p50 (p10–p90 of those), and the p99 of "
             "every sample.", "",
             "| transport | p50 (p10–p90) | p99 | target |", "|---|---:|---:|---|"]
    for transport in ("tcp", "shm", "nixl"):
        lat = gcache.get(f"{transport}/get_into_64KiB_latency")
        if lat is None:
            continue
        goal = (f"≤ {LATENCY_TARGET_MS} ms: {mark(lat['p50_ms'] <= LATENCY_TARGET_MS)}"
                if transport == "shm" else "–")
        lines.append(f"| {transport} | {lat['p50_ms']:.3f} ({lat['p50_p10_ms']:.3f}–"
                     f"{lat['p50_p90_ms']:.3f}) | {lat['p99_ms']:.3f} | {goal} |")
    raw = report["limits"].get("raw_socket_64KiB_rtt_p50_ms")
    if raw is not None:
        lines.append(f"| raw socket round trip (limit) | {raw:.3f} | – | – |")
    return "\n".join(lines)


def notes(report: dict[str, Any]) -> str:
    """Evictions per put and Redis's misses."""
    lines = []
    evictions = report.get("evictions", {})
    if evictions:
        lines.append("- Evicted by the server per put of the timed rounds: " + "; ".join(
            f"{t} {ev['evicted_objects']:.3f} live objects and {ev['evicted_segments']:.3f} "
            "segments" for t, ev in evictions.items()) + " (live objects: records dropped, "
            "less those re-appended on a second chance).")
    spreads = report["spread"]["limits"]
    misses = [(s, spreads[f"redis_{s}_misses_per_get"]) for s in ("1MiB", "4MiB")
              if f"redis_{s}_misses_per_get" in spreads]
    if misses:
        lines.append("- Redis's LRU is approximate: it evicted some working-set values, "
                     + ", ".join(f"{m:.2g} misses per GET at {s.replace('MiB', ' MiB')}"
                                           for s, m in misses)
                     + " (a miss counts as a full read in its figure; GCache's rounds allow "
                     "none). Redis has no read into a buffer: `get_into` and the batch are "
                     "compared with its GET.")
    return "\n".join(lines)


def tuned_table(report: dict[str, Any]) -> str:
    """Tuned set-ups, labelled, beside the default row of the same run."""
    gcache = report["gcache"]
    lines = ["Tuned set-ups (not the default; measured after the default rows, in the same run):",
             "", "| tuned | row | GB/s (p10–p90) | default, same run | × default |",
             "|---|---|---:|---:|---:|"]
    for label, rows in report.get("tuned", {}).items():
        for name, s in rows.items():
            transport, op, threads, size = split_row(name)
            base = gcache[f"{transport}/{size.replace(' ', '')}"][f"{op}_t{threads}"]
            lines.append(f"| tuned: {label} | {transport} {size} {OP_NAMES[op]}, {threads} "
                         f"thread | {spread_cell(s['median'], s)} | {base:.2f} | "
                         f"{s['median'] / base:.2f} |")
    scaling = gcache.get("shm/batch_scaling")
    default = gcache.get("shm/4MiB", {}).get("batch_get_into16_t1")
    if scaling is not None and default is not None:
        for n in (1, 2):
            gbps = scaling[f"io_threads_{n}_gbps"]
            lines.append(f"| tuned: {n} IO thread{'s' if n > 1 else ''} (default 4) | shm 4 MiB "
                         f"`batch_get_into` of 16, 1 thread | {gbps:.2f} | {default:.2f} | "
                         f"{gbps / default:.2f} |")
    if len(lines) == 4:
        return ""
    limits = report["limits"]
    if "memcpy_2threads_gbps" in limits:
        lines += ["", f"Two memcpy threads at once reach {limits['memcpy_2threads_gbps']:.2f} "
                  f"GB/s ({limits['memcpy_2threads_gbps'] / limits['memcpy_gbps']:.2f}× one "
                  "thread's 4 MiB median; best of 3 over fresh buffers, not the rounds)."]
    return "\n".join(lines)


def c_sdk_table(report: dict[str, Any]) -> str:
    """The C SDK's rows: not the steady rounds (libgcache's own bench program)."""
    rows = [(n, r) for n, r in report["ratios"].items() if " c-sdk " in n]
    if not rows:
        return ""
    lines = ["The C SDK (libgcache), timed by its own program (`sdk-c/bench/gcache_bench.c`) on "
             "the same server after the rounds: one thread, 16 distinct values round robin, "
             "best of 3 runs, not the steady rounds; × Python compares that best with the "
             "Python SDK's median, and the shm rows' limit is the 4 MiB memcpy median at "
             "both sizes.", "",
             "| transport | operation | size | GB/s | × limit | × Python SDK |",
             "|---|---|---|---:|---:|---:|"]
    for name, row in rows:
        transport, rest = name.split(" c-sdk ")
        _, op, _, size = split_row(f"{transport} {rest}")
        lines.append(f"| {transport} | {OP_NAMES[op]} | {size} | {row['gbps']:.2f} | "
                     f"{row['x_limit']:.2f} × {row['limit']} | {row['x_python']:.2f} |")
    return "\n".join(lines)

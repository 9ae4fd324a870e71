"""Render the latest benchmark JSON between each section's markers, in whichever of README.md
and docs/**/*.md holds them (``<!-- bench:NAME:start -->`` ... ``end``): the full tables live in
docs/benchmarks, and README.md has the headline table, drawn from the same results.

``make bench``, ``make bench-engine`` and ``make replay`` run it after measuring, so the pages
always show the latest figures with their date; nothing in the tables is typed by hand. A section
whose JSON is missing is left as it is; markers found in two files, or results with no markers
anywhere, are an error. ``--check`` renders everything and writes nothing (the test of this
script).
"""

from __future__ import annotations

import json
import os
import re
import sys

from render_dataplane import render_dataplane
from render_engine import render_engine, render_engine_sglang
from render_headline import PAGES, render_headline
from render_replay import render_replay, render_replay_suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def render_tiers(report: dict) -> str:
    limits, hot = report["limits"], report["hot"]
    lines = [
        f"Measured {report['date']} by `make bench` on {report['cpus']} CPUs: {report['total_mib']}"
        f" MiB in 1 MiB values on one directory. Limits in the same run: raw sequential write "
        f"with fsync {limits['raw_write_gbps']:.2f} GB/s, raw `preadv` "
        f"{limits['raw_preadv_gbps']:.2f} GB/s (from the page cache into distinct, touched memory, "
        "as promotions into the arena are).",
        "",
        "| cold format | demotion GB/s | × raw write | cold get GB/s | × raw preadv |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in report["formats"].items():
        lines.append(f"| {name} | {row['demote_gbps']:.2f} | {row['demote_x_raw_write']:.2f} | "
                     f"{row['cold_get_gbps']:.2f} | {row['cold_get_x_raw_preadv']:.2f} |")
    lines += ["", f"Hot 64 KiB `get_into` on a server with a cold tier: p50 "
              f"{hot['hot_p50_ms']:.3f} ms, p99 {hot['hot_p99_ms']:.3f} ms; while another "
              f"process writes {hot['demotion_rate_mib_s']:.0f} MiB/s and the demoter moves "
              f"{hot['demoted_during_measure']} objects to disk: p50 "
              f"{hot['hot_demoting_p50_ms']:.3f} ms, p99 "
              f"{hot['hot_demoting_p99_ms']:.3f} ms ({hot['p99_ratio']:.2f}× the p99 without)."]
    return "\n".join(lines)


def render_master(report: dict) -> str:
    beats, fail = report["heartbeats"], report["failover"]
    return (f"Measured {report['date']} by `make bench` on {report['cpus']} CPUs: three "
            f"`gcache-master`s on loopback; {beats['servers']} simulated servers beating once "
            f"a second from one process ({beats['beats_per_s']:.0f} beats/s over "
            f"{beats['seconds']:.0f} s): leader CPU {beats['leader_cpu_fraction']:.0%} of one "
            f"core, heartbeat latency p50 {beats['heartbeat_p50_ms']:.2f} ms, p99 "
            f"{beats['heartbeat_p99_ms']:.2f} ms. After a SIGKILL of the leader: first "
            f"successful cluster-map read {fail['first_map_read_s'] * 1e3:.0f} ms (followers "
            f"answer reads), new leader {fail['new_leader_s']:.2f} s.")


def render_metadata(report: dict) -> str:
    return "\n".join([
        f"Measured {report['date']} by `python bench/metadata.py --objects "
        f"{report['objects']}` on {report['cpus']} CPUs: one `gcache-server` on loopback, "
        f"{report['objects']:,} values of {report['value_bytes']} bytes put by one client "
        f"process over TCP in batches of {report['batch']}, then batched EXISTS and GETs of "
        f"{report['sample']:,} of them, then a restart on the same arena.",
        "",
        "| index memory per object | after a restart | batched put keys/s | exists keys/s | "
        "get keys/s | restart to ready |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {report['index_bytes_per_object']:.1f} B | "
        f"{report['index_bytes_per_object_after_restart']:.1f} B | "
        f"{report['put_keys_per_s']:,.0f} | {report['exists_keys_per_s']:,.0f} | "
        f"{report['get_keys_per_s']:,.0f} | {report['restart_s']:.1f} s |",
        "",
        f"Index memory is the server's anonymous memory (`RssAnon`; the arena is shared memory) "
        f"after the puts less before, per object. After the restart "
        f"{report['read_back_after_restart']} sampled values read back intact.",
    ])


def render_files(report: dict) -> str:
    limit = report["limits"]["page_cache_preadv_gbps"]
    lines = [
        f"Measured {report['date']} by `make bench` (`bench/files.py`) on {report['cpus']} "
        f"CPUs: one file of {report['file_mib']} MiB in {report['chunk_mib']} MiB chunks, "
        "pushed with `gcache.files` and pulled whole with `FileStore.get_file` into memory "
        "(every chunk checked against its digest), from 1, 2 and 3 servers on loopback; best "
        f"of {report['repeat']}. Limit in the same run: `preadv` of the same file from the page "
        f"cache into memory, {limit:.2f} GB/s. Every server shares this host's cores: more "
        "servers add streams, not the bandwidth of more hosts.",
        "",
        "| servers | transport | GB/s | × page cache |",
        "|---:|---|---:|---:|",
    ]
    for row in report["pulls"]:
        lines.append(f"| {row['servers']} | {row['transport']} | {row['gbps']:.2f} | "
                     f"{row['x_page_cache']:.2f} |")
    return "\n".join(lines)


def render_multimodal(report: dict) -> str:
    per_call = report["limits"]["encoder_s_per_call"]
    lines = [
        f"Measured {report['date']} by `make bench` (`bench/multimodal.py`) on {report['cpus']} "
        f"CPUs: a synthetic trace of {report['requests']} requests from {report['sessions']} "
        f"chat sessions that re-send their images, {report['photos']} popular photos shared "
        f"across sessions and {report['videos']} videos whose frames several requests ask "
        f"about; a stand-in encoder ({report['layers']} dense layers of {report['hidden']} over "
        "14×14 patches, cost in proportion to pixels, run for real on one core). Limit in the "
        f"same run: the encoder itself, {per_call * 1e3:.1f} ms per call on average. With "
        f"GCache, {report['instances']} engine instances (one `Client` each, requests spread "
        f"by session) share outputs through `gcache.mm.EncoderCache` on {report['servers']} "
        "local servers; every hit is checked equal to the encoder's output.",
        "",
        "| replay | items | encoder calls | served without the encoder | stored | "
        "encoder s | GCache read s | encoder time saved |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = report["rows"][0]["encoder_s"]
    for row in report["rows"]:
        lines.append(f"| {row['mode']} | {row['items']} | {row['encoder_calls']} | "
                     f"{row['hit_rate']:.0%} | {row['stored_bytes'] / 2**20:.0f} MiB | "
                     f"{row['encoder_s']:.1f} | {row['gcache_read_s']:.2f} | "
                     f"{row['encoder_s_saved'] / base:.0%} |")
    return "\n".join(lines)


def render_routing_suite(report: dict) -> str:
    """``bench/routing_suite.py``: per trace, ours with buckets against the issue-47 targets."""
    lines = [f"Measured {report['date']} by `{report['command'].strip()}` "
             f"({report['runtime_s']} s, `bench/results/routing-suite-latest.json`): the long "
             "variant of every trace of the replay suite, 8 instances of 4 lockstep ranks, "
             "offered load 0.85. `ours` is `gcache.router.policy` with buckets; a bold figure "
             "misses its target.", "",
             "| trace (long) | instances per bucket | ours: max/mean load (target ≤ 1.2) | "
             "ours: short p99 s (target ≤ half the next column) | best without buckets: short "
             "p99 s | ours: hit rate (target ≥ 0.95× the next column) | best cache-aware hit "
             "rate | best max/mean load of any policy |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for trace, entry in report["traces"].items():
        rows = entry["rows"]
        ours = next(r for r in rows if r["policy"] == "ours" and r["buckets"])
        off = min((r for r in rows if not r["buckets"]), key=lambda r: r["ttft_p99_short_s"])
        aware = max((r for r in rows if r["policy"] in ("sglang_cache_aware", "dynamo_cost")),
                    key=lambda r: r["hit_rate"])
        flat = min(rows, key=lambda r: r["max_mean_load"])

        def mark(value: float, ok: bool, fmt: str) -> str:
            return fmt.format(value) if ok else "**" + fmt.format(value) + "**"

        short_ok = ours["ttft_p99_short_s"] <= 0.5 * off["ttft_p99_short_s"]
        lines.append(
            f"| {trace} | {entry['meta']['instances_per_bucket']} | "
            f"{mark(ours['max_mean_load'], ours['max_mean_load'] <= 1.2, '{:.2f}')} | "
            f"{mark(ours['ttft_p99_short_s'], short_ok, '{:.2f}')} | "
            f"{off['ttft_p99_short_s']:.2f} ({off['policy']}) | "
            f"{mark(ours['hit_rate'], ours['hit_rate'] >= 0.95 * aware['hit_rate'], '{:.3f}')} | "
            f"{aware['hit_rate']:.3f} ({aware['policy']}, buckets "
            f"{'on' if aware['buckets'] else 'off'}) | {flat['max_mean_load']:.2f} "
            f"({flat['policy']}, buckets {'on' if flat['buckets'] else 'off'}) |")
    return "\n".join(lines)


def render_prefetch(report: dict) -> str:
    """``bench/prefetch.py --results``: the engine's load of a cold-tier hit, with and without
    the router's prefetch."""
    ms, args = report["median_ms"], report["args"]
    return "\n".join([
        f"Measured {report['date']} by `python bench/prefetch.py --results`: {args['prefixes']} "
        f"prefixes of {args['pages']} pages of MiMo-V2.5-Pro's KV (values at 1/{args['scale']}, "
        f"{report['prefix_mib']:.1f} MiB each), pushed out to one server's cold tier; medians. "
        "Disk reads come from the page cache, so the cold figure is the promotion's own cost, a "
        "lower bound for a real disk.", "",
        "| the engine's load of a cold-tier hit | ms |", "|---|---:|",
        f"| without prefetch (promoted during the load) | {ms['cold']:.1f} |",
        f"| after the router's prefetch | {ms['prefetched']:.1f} |",
        f"| the prefetch itself, beside the request before its load | {ms['prefetch']:.1f} |",
        "",
        f"A request's time to first token drops by the difference, "
        f"{ms['cold'] - ms['prefetched']:.1f} ms here, when the prefetch is done by the time its "
        "engine loads (it runs while the request travels, queues and is scheduled)."])


SECTIONS = {"dataplane": ("dataplane-latest.json", render_dataplane),
            "files": ("files-latest.json", render_files),
            "multimodal": ("multimodal-latest.json", render_multimodal),
            "metadata": ("metadata-latest.json", render_metadata),
            "master": ("master-latest.json", render_master),
            "replay": ("replay-latest.json", render_replay),
            "replay-suite": ("replay-suite-latest.json", render_replay_suite),
            "routing-suite": ("routing-suite-latest.json", render_routing_suite),
            "prefetch": ("prefetch-latest.json", render_prefetch),
            "tiers": ("tiers-latest.json", render_tiers),
            "engine": ("engine-latest.json", render_engine),
            "engine-sglang": ("engine-sglang-latest.json", render_engine_sglang)}


def targets() -> dict[str, str]:
    """Each section's file: the one of README.md and docs/**/*.md that holds its start marker."""
    paths = ["README.md"] + sorted(
        os.path.relpath(os.path.join(d, f), ROOT)
        for d, _, names in os.walk(os.path.join(ROOT, "docs")) for f in names if f.endswith(".md"))
    found: dict[str, str] = {}
    for path in paths:
        with open(os.path.join(ROOT, path)) as fh:
            text = fh.read()
        for name in re.findall(r"<!-- bench:([a-z-]+):start -->", text):
            if name in found:
                raise SystemExit(f"the markers of {name} are in both {found[name]} and {path}")
            found[name] = path
    return found


def for_file(text: str, path: str) -> str:
    """A rendering's links, written from the repository's root, made relative to ``path``; pages
    under docs/ reach bench/results through docs/results (the site holds only docs/)."""
    here = os.path.dirname(path)
    results = "docs/results" if path.startswith("docs/") else "bench/results"
    text = text.replace("](bench/results/", f"]({os.path.relpath(results, here)}/")
    return text.replace(f"]({PAGES}/", f"]({os.path.relpath(PAGES, here)}/")


def main() -> int:
    """Render every section whose results exist into its file; with --check, write nothing and
    fail when a section's markers are missing."""
    check = sys.argv[1:] == ["--check"]
    where, reports = targets(), {}
    for name, (filename, _) in SECTIONS.items():
        source = os.path.join(ROOT, "bench", "results", filename)
        if os.path.exists(source):
            with open(source) as fh:
                reports[name] = json.load(fh)
    renders = {name: SECTIONS[name][1](report) for name, report in reports.items()}
    renders["headline"] = render_headline(reports)
    missing = sorted(set(renders) - set(where))
    if missing:
        print(f"no file has the markers <!-- bench:NAME:start --> of {missing}", file=sys.stderr)
        return 1
    for path in sorted(set(where.values())):
        with open(os.path.join(ROOT, path)) as fh:
            text = fh.read()
        for name in (n for n in renders if where[n] == path):
            start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
            if end not in text:
                print(f"{path} lacks the marker {end}", file=sys.stderr)
                return 1
            pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
            body = for_file(renders[name], path)
            text = pattern.sub(lambda _, body=body: f"{start}\n{body}\n{end}", text)
            report = reports.get(name, {})
            date = report.get("date") or report.get("meta", {}).get("date", "latest")
            print(f"{path}: {name} figures of {date}")
        if not check:
            with open(os.path.join(ROOT, path), "w") as fh:
                fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

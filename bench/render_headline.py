"""The README's headline table: one line per question a newcomer asks (what a hit buys on each
engine, how fast the data plane is against its limit, how much of a trace hits), each figure
taken from the same ``bench/results/*-latest.json`` as the full table it links to. Rendered by
``bench/update_readme.py``; a benchmark whose results are missing has no line."""

from __future__ import annotations

from typing import Any

from render_dataplane import target_cell

PAGES = "docs/benchmarks"


def render_headline(reports: dict[str, Any]) -> str:
    """``reports`` maps a section name (``engine``, ``dataplane``...) to its latest JSON."""
    lines = ["| what | figure | measured | full table |", "|---|---|---|---|"]
    if "engine" in reports:
        lines += _vllm(reports["engine"])
    if "engine-sglang" in reports:
        lines += _sglang(reports["engine-sglang"])
    if "dataplane" in reports:
        lines += _dataplane(reports["dataplane"])
    if "replay" in reports:
        lines += _replay(reports["replay"])
    return "\n".join(lines)


def _vllm(report: dict[str, Any]) -> list[str]:
    rows = {(r["model"], r["length"], r["condition"]): r["ttft_s"]["p50"] for r in report["rows"]}
    out = []
    for model in dict.fromkeys(r["model"] for r in report["rows"]):
        length = max(n for m, n, _ in rows if m == model)
        computed, own, hit = (rows[(model, length, k)]
                              for k in ("computed", "prefix cache", "gcache shm"))
        out.append(f"| vLLM, {model}, {length + report['question']}-token prompt: time to first "
                   f"token of a fresh engine loading the prefix from GCache | {hit:.2f} s "
                   f"against {computed:.1f} s computed ({computed / hit:.0f}×); {hit / own:.2f}× "
                   f"the time of the engine's own prefix-cache hit | {report['date']} | "
                   f"[engines]({PAGES}/engines.md#vllm) |")
    return out


def _sglang(report: dict[str, Any]) -> list[str]:
    rows = {(r["model"], r["length"], r["condition"]): r["ttft_s"]["p50"] for r in report["rows"]}
    out = []
    for model in dict.fromkeys(r["model"] for r in report["rows"]):
        length = max(n for m, n, _ in rows if m == model)
        radix = rows.get((model, length, "radix"))
        got = [(name, rows[(model, length, key)]) for name, key in
               (("HiCache backend", "hicache"), ("linker", "linker"))
               if (model, length, key) in rows]
        if not radix or not got:
            continue
        figures = ", ".join(f"{name} {s / radix:.2f}×" for name, s in got)
        out.append(f"| SGLang, {model}, {length}-token prompt: a fresh engine's hit from GCache "
                   f"over SGLang's own radix-cache hit | {figures} | {report['date']} | "
                   f"[engines]({PAGES}/engines.md#sglang) |")
    return out


def _dataplane(report: dict[str, Any]) -> list[str]:
    """One line per transport: 4 MiB ``get_into`` on the steady-state server (full, evicting,
    ``--memory`` only), the median over rounds against its limit and its target."""
    out = []
    rounds = report["setup"]["rounds"]
    for transport, name in (("shm", "shared memory"), ("tcp", "TCP"), ("nixl", "NIXL")):
        key = f"{transport} get_into_t1@4MiB"
        row = report["ratios"].get(key)
        if row is None:
            continue
        out.append(f"| SDK `get_into` of 4 MiB over {name}, one thread, from a server kept "
                   f"full (puts evict; default set-up, median of {rounds} rounds) | "
                   f"{row['gbps']:.2f} GB/s, {row['x_limit']:.2f}× {row['limit']} in the same "
                   f"run; target {target_cell(key, row)} | {report['date']} | "
                   f"[data plane]({PAGES}/data-plane.md) |")
    return out


def _replay(report: dict[str, Any]) -> list[str]:
    rows = [r for r in report["rows"] if r["source"] == "model" and r["is_default"]]
    if not rows:
        return []
    low = min(rows, key=lambda r: r["budget_fraction"])
    meta = report["meta"]
    share = "" if low.get("of_optimal") is None else f", {low['of_optimal']:.2f} of the optimum"
    return [f"| Token hit rate (window-safe) on {meta['requests']} requests of a real "
            f"conversation trace, {meta['model']}, memory {low['budget_fraction']:.0%} of the "
            f"full-layer working set | {low['hit_rate']:.3f}{share} | {meta['date']} | "
            f"[hit rate]({PAGES}/hit-rate.md) |"]

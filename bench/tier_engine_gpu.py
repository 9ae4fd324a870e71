"""GCache under vLLM's own KV offloading on a GPU (``GCacheTier``): time to first token of a
fresh engine whose prefix comes from GCache through its CPU tier, beside computing the prompt
and beside the engine's own prefix-cache hit, measured in the same run.

``make gpu-check`` runs it on a GPU host where vLLM 0.33 is installed (``make gpu-wheels
GPU_VLLM=1`` puts it in wheelhouse/); without vLLM or CUDA it says so and writes nothing. Each
repeat is a fresh pair of ``gcache-server`` processes and two engine processes
(``tests/gpu/run_tier_engine.py``, vLLM's ``OffloadingConnector`` + ``TieringOffloadingSpec`` +
``GCacheTier``): engine A times the prompt computed, then the same prompt again (its own prefix
cache), and stays until its CPU tier has cascaded the blocks into GCache; engine B, fresh, times
the prompt (vLLM looks the blocks up in GCache, promotes them into its CPU tier and loads
them). A tiny random Llama (``engine_testing.tiny_models``) at ``--prompt-tokens``; medians of
``--repeats``. Reported, never asserted; writes ``bench/results/tier-engine-gpu-latest.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "connectors")]
from results_file import write_results  # noqa: E402  (after the path it needs)

RUNNER = ROOT / "tests" / "gpu" / "run_tier_engine.py"
BLOCK = 16


def engine(model: pathlib.Path, servers: list[str], prompt: list[int], log: pathlib.Path,
           **more) -> dict:
    from engine_testing.shm import run_group
    spec = {"model": str(model), "servers": servers, "prompt": prompt, "block_size": BLOCK,
            "new_tokens": 1, "max_model_len": 2048, **more}
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "connectors" / "vllm"), str(ROOT),
                                           os.environ.get("PYTHONPATH", "")]))
    with open(log, "w") as out:
        status = run_group([sys.executable, str(RUNNER), json.dumps(spec)], stdout=out,
                           env=env, timeout_s=600)
    text = log.read_text(errors="replace")
    if status != 0:
        raise RuntimeError(f"engine exited with {status}: {text[-3000:]}")
    return json.loads(next(x for x in text.splitlines()
                           if x.startswith("RESULT "))[len("RESULT "):])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=1536)   # the model has 2048 positions
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # a package, not the namespace that connectors/vllm (on this path) would make of the name
    missing = [name for name in ("vllm", "torch")
               if getattr(importlib.util.find_spec(name), "origin", None) is None]
    if missing:
        print(f"tier_engine_gpu: skipped, {' and '.join(missing)} not installed here "
              "(make gpu-wheels GPU_VLLM=1 puts vLLM in wheelhouse/ for make gpu-check)")
        return 0
    import torch
    if not torch.cuda.is_available():
        print("tier_engine_gpu: skipped, no CUDA device (vLLM's offloading worker runs only "
              "on CUDA and XPU)")
        return 0
    from engine_testing.tiny_models import llama, prompt_ids

    from gcache.cli.local_cluster import LocalCluster
    times: dict[str, list[float]] = {"computed": [], "prefix cache": [], "gcache tier": []}
    cached: dict[str, list[int]] = {name: [] for name in times}
    with tempfile.TemporaryDirectory(prefix="tier-engine-gpu-") as tmp:
        root = pathlib.Path(tmp)
        model = llama(root / "llama")
        words = prompt_ids(model, repeats=1)
        prompt = (words * (args.prompt_tokens // len(words) + 1))[:args.prompt_tokens]
        for repeat in range(args.repeats):
            with LocalCluster(2, memory="1GiB", log_dir=str(root / f"gcache-{repeat}")) as cl:
                first = engine(model, cl.addresses, prompt, root / f"a-{repeat}.log",
                               store=True, timed=["computed", "prefix cache"])
                second = engine(model, cl.addresses, prompt, root / f"b-{repeat}.log",
                                timed=["gcache tier"])
            for name, row in {**first["ttft"], **second["ttft"]}.items():
                times[name].append(row["s"])
                cached[name].append(row["cached"])
    p50 = {name: statistics.median(values) for name, values in times.items()}
    for name in times:
        print(f"{name:<13} TTFT p50 {p50[name] * 1e3:8.1f} ms  cached {cached[name]}")
    print(f"gcache tier over the engine's own prefix cache: "
          f"{p50['gcache tier'] / p50['prefix cache']:.2f}x; computed over gcache tier: "
          f"{p50['computed'] / p50['gcache tier']:.2f}x")
    write_results("tier-engine-gpu", {
        "date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(),
        "model": "tiny random Llama (engine_testing.tiny_models.llama)",
        "prompt_tokens": args.prompt_tokens, "repeats": args.repeats,
        "ttft_s": {name: {"p50": p50[name], "all": times[name]} for name in times},
        "cached_tokens": cached,
        "x_prefix_cache": p50["gcache tier"] / p50["prefix cache"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())

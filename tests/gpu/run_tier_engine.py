"""One real vLLM engine on CUDA with vLLM's own KV offloading and GCache as its secondary tier
(``OffloadingConnector`` + ``TieringOffloadingSpec`` + ``GCacheTier``), over one prompt; prints
``RESULT {...}``: the greedy token ids, their log-probabilities and the prompt tokens vLLM
reports as cached.

``python run_tier_engine.py SPEC_JSON``: ``model``, ``prompt`` (token ids), ``servers``,
``new_tokens``, ``block_size``, ``max_model_len``, and ``store: true`` for the engine that
computes: after its request it keeps the engine stepping (one-token requests of their own)
until GCache's bytes stop growing, so that vLLM's worker has copied the prompt's blocks to its
CPU tier and the tier has cascaded them, before the process exits. ``timed`` (names, for
``bench/tier_engine_gpu.py``): before that request, one one-token request of the prompt per
name, each timed (its time to first token) with the tokens vLLM reports cached, as ``ttft``.
"""

from __future__ import annotations

import json
import sys
import time


def gcache_bytes(servers: list[str]) -> int:
    from gcache.sdk import Client
    with Client(servers, timeout_s=5.0) as client:
        return sum(s["tier"]["bytes"] for s in client.server_stats().values() if s)


def main() -> None:
    spec = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    tier = {"type": "GCacheTier", "module_path": "gcache_vllm.tier",
            "gcache_servers": ",".join(spec["servers"]), "gcache_timeout_ms": 2000}
    transfer = KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both",
        kv_connector_extra_config={"spec_name": "TieringOffloadingSpec",
                                   "cpu_bytes_to_use": 256 << 20, "secondary_tiers": [tier]})
    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True,
              block_size=spec["block_size"], max_model_len=spec.get("max_model_len", 1024),
              seed=0,
              kv_cache_memory_bytes=256 << 20, enable_prefix_caching=True,
              kv_transfer_config=transfer)
    ttft = {}
    for name in spec.get("timed", []):
        started = time.perf_counter()
        one = llm.generate({"prompt_token_ids": spec["prompt"]},
                           SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)[0]
        ttft[name] = {"s": time.perf_counter() - started, "cached": one.num_cached_tokens or 0}
    params = SamplingParams(temperature=0.0, max_tokens=spec["new_tokens"], ignore_eos=True,
                            logprobs=1)
    reply = llm.generate({"prompt_token_ids": spec["prompt"]}, params, use_tqdm=False)[0]
    tokens = list(reply.outputs[0].token_ids)
    result = {"output_ids": tokens, "cached": reply.num_cached_tokens or 0, "ttft": ttft,
              "logprobs": [step[t].logprob for step, t in zip(reply.outputs[0].logprobs, tokens)]}
    if spec.get("store"):
        nudge = SamplingParams(temperature=0.0, max_tokens=1)
        deadline, last, steady = time.monotonic() + 120.0, -1, 0
        while steady < 3 and time.monotonic() < deadline:
            llm.generate({"prompt_token_ids": [7 + steady]}, nudge, use_tqdm=False)
            now = gcache_bytes(spec["servers"])
            steady = steady + 1 if now == last and now > 0 else 0
            last = now
            time.sleep(0.2)
        result["gcache_bytes"] = last
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

"""``GCacheTier`` under vLLM's tiering manager: cascade and promotion throughput against the SDK.

``python bench/tier_vllm.py`` in ``.venv-vllm`` (vLLM 0.33's scheduler-side tiering code; its
worker side needs a GPU, so no engine runs). Two gcache-servers on this host, default flags
but their memory. A model of 2 layers, 8 KV heads of 128, fp16, 16-token blocks, 4 blocks per
chunk: 512 KiB chunks, one GCache object each. Each round:

- cascade: a manager stores ``CHUNKS`` chunks in its CPU tier (the worker's GPU-to-CPU copy is
  played by writing them); from ``complete_store`` (which submits the cascade) to the tier's
  last finished job;
- promotion: a fresh manager (its CPU tier empty) looks the chunks up and promotes them, the way
  its scheduler does step by step (``engine_testing.vllm_tiering.promote``, 10 ms between
  steps), from the first lookup to the last HIT: the probe round, the promotions and the steps;
- the limits, in the same round: the SDK's ``batch_put`` and ``batch_get_into`` of the same
  number of values of the same size, to the same servers.

Prints each figure's median over the rounds and its ratio to the limit; writes
``bench/results/tier-vllm-latest.json``.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHUNKS = 64


def one_round(cluster, n: int, seed: int) -> dict[str, float]:
    from engine_testing.vllm_tiering import (
        build_manager,
        chunk_keys,
        promote,
        rows,
        settle,
        store,
        tier_config,
        transfer_config,
    )

    from gcache import Client
    config = transfer_config(tier_config(cluster.addresses), cpu_bytes=(2 * n) << 19)
    config["kv_connector_extra_config"]["block_size"] = 64
    geometry = {"heads": 8, "head_dim": 128, "sliding": False}
    keys = chunk_keys(n, seed=seed)
    first = build_manager(config, **geometry)
    second = None
    try:
        size = first.secondary_tiers[0].block_size_bytes
        began = time.perf_counter()
        written = store(first, f"s{seed}", keys, seed=seed)
        settle(first)
        cascade = time.perf_counter() - began
        second = build_manager(config, **geometry)
        began = time.perf_counter()
        got = promote(second, f"p{seed}", keys)
        promotion = time.perf_counter() - began
        if got != written:
            raise RuntimeError(f"{len(got)} of {n} chunks promoted, or other bytes")
        view = rows(first)
        values = [bytes(view[i * size:(i + 1) * size]) for i in range(n)]
        view.release()
    finally:
        first.shutdown()
        if second is not None:
            second.shutdown()
    limit_keys = [f"bench-tier-limit/{seed}/{i}" for i in range(n)]
    outs = [bytearray(size) for _ in range(n)]
    with Client(cluster.addresses) as client:
        began = time.perf_counter()
        client.batch_put(limit_keys, values)
        put = time.perf_counter() - began
        began = time.perf_counter()
        client.batch_get_into(limit_keys, outs)
        get = time.perf_counter() - began
        for key in limit_keys:
            client.delete(key)
    gb = n * size / 1e9
    return {"chunk_bytes": size, "cascade_gbps": gb / cascade, "promotion_gbps": gb / promotion,
            "sdk_put_gbps": gb / put, "sdk_get_into_gbps": gb / get}


def run(rounds: int, out: str) -> dict:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "connectors"))
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from gcache.cli.local_cluster import LocalCluster
    with tempfile.TemporaryDirectory(prefix="gcache-bench-tier-") as tmp, \
            LocalCluster(2, memory="512MiB", log_dir=tmp) as cluster:
        one_round(cluster, 8, seed=999)                    # warm-up: connections, first faults
        samples = [one_round(cluster, CHUNKS, seed=r) for r in range(rounds)]
    median = {k: round(statistics.median(s[k] for s in samples), 3) for k in samples[0]}
    report = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "rounds": rounds,
              "chunks": CHUNKS, **median,
              "cascade_x_sdk_put": round(median["cascade_gbps"] / median["sdk_put_gbps"], 2),
              "promotion_x_sdk_get_into": round(median["promotion_gbps"]
                                                / median["sdk_get_into_gbps"], 2)}
    print(f"GCacheTier, {CHUNKS} chunks of {median['chunk_bytes'] // 1024} KiB, median of "
          f"{rounds}: cascade {median['cascade_gbps']:.2f} GB/s "
          f"({report['cascade_x_sdk_put']:.2f}x the SDK's batch_put, "
          f"{median['sdk_put_gbps']:.2f}); promotion {median['promotion_gbps']:.2f} GB/s "
          f"({report['promotion_x_sdk_get_into']:.2f}x batch_get_into, "
          f"{median['sdk_get_into_gbps']:.2f})")
    with open(out, "w") as fh:
        json.dump(report, fh, indent=1)
    return report


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "tier-vllm-latest.json"))
    args = parser.parse_args()
    run(args.rounds, args.out)

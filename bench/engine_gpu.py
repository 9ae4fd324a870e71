"""A GCache hit on a GPU, phase by phase: the vLLM connector's worker side on CUDA KV blocks.

``make gpu-check`` runs this on a GPU host, which has CUDA torch but no vLLM: the connector's
worker half (``gcache_vllm.worker_side``, the code vLLM calls) is driven in vLLM's call order
(``start_load``, per layer ``wait_layer`` then the layer's forward, ``end_step``; for a parked
request ``get_finished`` until it reports the load) over KV blocks in FlashAttention's layout,
with two ``gcache-server`` processes on this host over shared memory. The forward pass is a
stand-in with a real layer's shapes (``--geometry``): the question's tokens' projections,
attention over the prefix read from the blocks, the MLP. Conditions, each a median of
``--repeats``:

- ``resident``: the prefix's KV is already in the blocks (the engine's own prefix-cache hit);
- ``gcache sync``: the prefix is loaded layer by layer inside the forward pass;
- ``gcache async``: loaded while the request is parked, then the forward pass.

Beside each, the phases the connector recorded (``gcache.kv.load_phases``) and, as the limits
measured in the same run, the SDK's ``batch_get_into`` of the same objects into pinned memory
and torch's pinned host-to-device copy of the same bytes. Reported, never asserted; writes
``bench/results/engine-gpu-latest.json``. ``--device cpu`` runs the same on the CPU (a check of
this script, not a GPU figure).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "connectors", "vllm")]
from results_file import write_results  # noqa: E402  (after the path it needs)

# (layers, KV heads, head dim, hidden, MLP width): the Llama of bench/engine.py, and Llama 3 8B
GEOMETRIES = {"bench-llama": (8, 4, 64, 768, 2048), "llama-3-8b": (32, 8, 128, 4096, 14336)}
QUESTION = 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), default="bench-llama")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--block", type=int, default=16, help="vLLM's GPU default")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("engine_gpu: no CUDA device; nothing measured")
        return 2
    return run(args, torch)


def run(args: argparse.Namespace, torch) -> int:
    from gcache import Client
    from gcache.cli.local_cluster import LocalCluster
    from gcache.kv import KVStore, load_phases
    from gcache.kv.layout import LayerGeometry, ModelLayout

    layers, heads, hd, hidden, inter = GEOMETRIES[args.geometry]
    dtype, device = torch.bfloat16, torch.device(args.device)
    pages = args.tokens // args.block
    blocks = pages + 2                               # block 0 is vLLM's null block
    layout = ModelLayout(model=f"engine-gpu-{args.geometry}", num_layers=layers, swa_layers=(),
                         window=0, full=LayerGeometry(heads, hd, hd, 2), swa=LayerGeometry(
                             heads, hd, hd, 2), page_size=args.block)
    kv_bytes = args.tokens * layers * layout.full.bytes_per_token
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    gen = torch.Generator().manual_seed(0)
    source = {n: torch.randn((2, blocks, args.block, heads, hd), generator=gen).to(dtype)
              .to(device) for n in names}
    target = {n: torch.zeros_like(t) for n, t in source.items()}
    weights = [{"qkv": torch.randn(hidden, hidden + 2 * heads * hd, generator=gen).to(dtype)
                .to(device) * 0.02,
                "up": torch.randn(hidden, 2 * inter, generator=gen).to(dtype).to(device) * 0.02,
                "down": torch.randn(inter, hidden, generator=gen).to(dtype).to(device) * 0.02}
               for _ in names]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ids = list(range(1, blocks - 1))
    prompt = torch.randint(10, 32000, (args.tokens,), generator=gen).tolist()
    recorder = load_phases("vllm")
    memory = max(256 << 20, 3 * kv_bytes)

    def forward_layer(i: int, caches: dict) -> None:
        """The question's pass through layer ``i``: attention over the prefix in the blocks."""
        x = torch.randn(QUESTION, hidden, generator=gen).to(dtype).to(device)
        q = (x @ weights[i]["qkv"])[:, :hidden].view(QUESTION, hidden // hd, hd).transpose(0, 1)
        kv = caches[names[i]][:, ids].reshape(2, -1, heads, hd)
        k = kv[0].transpose(0, 1).repeat_interleave(hidden // hd // heads, 0)
        v = kv[1].transpose(0, 1).repeat_interleave(hidden // hd // heads, 0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        gate, up = (a.transpose(0, 1).reshape(QUESTION, hidden) @ weights[i]["up"]).chunk(2, -1)
        (torch.nn.functional.silu(gate) * up) @ weights[i]["down"]

    with LocalCluster(2, memory=f"{memory >> 20}MiB") as cluster, \
            Client(cluster.addresses, transport="shm", timeout_s=30.0) as client:
        from gcache_vllm.worker_side import WorkerSide

        def worker(caches: dict) -> WorkerSide:
            side = WorkerSide(KVStore(client, layout), layout, dict.fromkeys(names, 0),
                              layer_index=lambda n: int(n.split(".")[2]))
            side.register(caches)
            return side

        saver = worker(source)
        meta = SimpleNamespace(loads=[], saves=[SimpleNamespace(
            req_id="save", token_ids=prompt, block_ids=(ids,))], saves_at_finish=[], idle=False)
        saver.start_load(meta)
        for name in names:
            saver.save_layer(name, meta)
        saver.wait_saves()
        saver.end_step()
        if saver.counters["saved_layers"] != layers:
            raise RuntimeError(f"the prefix was not saved: {saver.counters}")
        loader = worker(target)

        def resident() -> None:
            for i in range(layers):
                forward_layer(i, source)
            sync()

        def loaded(asynchronous: bool) -> None:
            spec = SimpleNamespace(req_id=f"r{time.perf_counter_ns()}", token_ids=prompt,
                                   skip_tokens=0, block_ids=(ids,), asynchronous=asynchronous)
            meta = SimpleNamespace(loads=[spec], saves=[], saves_at_finish=[], idle=True)
            loader.start_load(meta)
            if asynchronous:
                while spec.req_id not in loader.get_finished(meta)[1]:
                    pass
                loader.end_step()
                meta = SimpleNamespace(loads=[], saves=[], saves_at_finish=[], idle=False)
                loader.start_load(meta)
            for i, name in enumerate(names):
                loader.wait_layer(name, meta)
                forward_layer(i, target)
            loader.wait_saves()
            loader.end_step()
            sync()
            if loader.take_load_errors():
                raise RuntimeError("a load failed")

        rows = {}
        for condition, fn in (("resident", resident),
                              ("gcache sync", lambda: loaded(False)),
                              ("gcache async", lambda: loaded(True))):
            fn()                                     # warm-up: allocations, first kernels
            recorder.take()
            times, phases = [], []
            for _ in range(args.repeats):
                began = time.perf_counter()
                fn()
                times.append(time.perf_counter() - began)
                phases += list(recorder.take().values())
            rows[condition] = {"ttft_s": statistics.median(times), "phases": {
                k: statistics.median(p.get(k, 0.0) for p in phases) for k in
                ("probe", "parked", "fetch", "place", "layer_wait", "save_wait", "bytes")}
                if phases else {}}
        for name in names:
            if not torch.equal(target[name][:, ids], source[name][:, ids]):
                raise RuntimeError(f"{name}: loaded KV differs from the saved KV")
        limits = measure_limits(client, torch, device, layout, layers, pages, sync, args.repeats)
    report(args, torch, device, kv_bytes, rows, limits)
    return 0


def measure_limits(client, torch, device, layout, layers: int, pages: int, sync,
                   repeats: int) -> dict:
    """The SDK's ``batch_get_into`` of the same objects (one batch a layer, as a load issues
    them) into pinned host memory, and torch's pinned host-to-device copy of the same bytes."""
    size = layout.page_size * layout.full.bytes_per_token
    pinned = device.type == "cuda"
    outs = [[torch.empty(size, dtype=torch.uint8, pin_memory=pinned) for _ in range(pages)]
            for _ in range(layers)]
    keys = [[f"engine-gpu-limit/{layer}/{page}" for page in range(pages)]
            for layer in range(layers)]
    value = torch.randint(0, 255, (size,), dtype=torch.uint8)
    for layer_keys in keys:
        client.batch_put(layer_keys, [value] * pages)
    sdk, h2d = [], []
    host = torch.empty(size * pages * layers, dtype=torch.uint8, pin_memory=pinned)
    on_device = torch.empty_like(host, device=device)
    for _ in range(repeats):
        began = time.perf_counter()
        for layer_keys, layer_outs in zip(keys, outs):
            if None in client.batch_get_into(layer_keys, layer_outs):
                raise RuntimeError("the limit's values were evicted meanwhile")
        sdk.append(time.perf_counter() - began)
        began = time.perf_counter()
        on_device.copy_(host, non_blocking=True)
        sync()
        h2d.append(time.perf_counter() - began)
    for key in (k for layer_keys in keys for k in layer_keys):
        client.delete(key)
    return {"sdk_get_into_s": statistics.median(sdk), "h2d_copy_s": statistics.median(h2d)}


def report(args, torch, device, kv_bytes: int, rows: dict, limits: dict) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"engine_gpu: {args.geometry}, {args.tokens}-token prefix ({kv_bytes / 2**20:.0f} MiB "
          f"of KV, block {args.block}, bf16), {QUESTION}-token question, {name}, median of "
          f"{args.repeats}")
    base = rows["resident"]["ttft_s"]
    for condition, row in rows.items():
        ph = row["phases"]
        load_s = ph.get("fetch", 0.0) + ph.get("place", 0.0)
        line = f"  {condition:13s} {1000 * row['ttft_s']:8.1f} ms  {row['ttft_s'] / base:5.2f}x"
        if ph:
            line += ("  " + ", ".join(f"{k} {1000 * ph[k]:.1f} ms" for k in
                                      ("parked", "fetch", "place", "layer_wait"))
                     + f"; load {kv_bytes / load_s / 1e9:.2f} GB/s")
        print(line)
    sdk = kv_bytes / limits["sdk_get_into_s"] / 1e9
    h2d = kv_bytes / limits["h2d_copy_s"] / 1e9
    print(f"  limits: SDK batch_get_into {sdk:.2f} GB/s, pinned host-to-device {h2d:.2f} GB/s")
    write_results("engine-gpu", {
        "date": dt.date.today().isoformat(), "device": name, "geometry": args.geometry,
        "tokens": args.tokens, "block": args.block, "question": QUESTION,
        "kv_bytes": kv_bytes, "repeats": args.repeats, "rows": rows,
        "limits": {**limits, "sdk_gb_s": sdk, "h2d_gb_s": h2d}})


if __name__ == "__main__":
    sys.exit(main())

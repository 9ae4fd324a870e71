"""Multimodal benchmark: encoder outputs shared through GCache by a cluster of engine instances.

A synthetic trace (``--seed``): chat sessions whose every turn re-sends the images of the turns
before it (as chat APIs do) and sometimes adds one; product photos that many sessions share
(drawn by popularity, Zipf); and videos whose frames several requests ask about. Each image
costs its encoder work in proportion to its pixels: a stand-in encoder (``--layers`` dense
layers of ``--hidden`` on its 14×14 patches, in torch on these CPUs) that really runs, so the
time it takes is measured, not assumed.

Replayed twice, request by request:
- **without sharing**, as vLLM keeps encoder outputs today: for the request that needs them, so
  every request encodes every image it carries;
- **with GCache**: ``--instances`` engine instances (each its own ``Client``), requests spread
  over them by session; an instance asks ``gcache.mm.EncoderCache`` first, reads a hit straight
  into a tensor, and encodes and stores a miss, on a real local cluster of ``--servers``.

The limit measured in the same run is the encoder itself: the table gives encoder calls, the
items served without the encoder, bytes stored, encoder seconds, GCache read seconds and the
encoder time saved. Every hit is checked equal to the encoder's own output for that image.
Writes ``bench/results/multimodal-latest.json``; ``update_readme.py`` renders it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

from gcache.cli.local_cluster import LocalCluster
from gcache.mm import EncoderCache
from gcache.sdk import Client

PATCH = 14
SIZES = ((336, 336), (448, 448), (672, 448), (672, 672))


@dataclass(frozen=True)
class Image:
    media_hash: str
    height: int
    width: int

    @property
    def tokens(self) -> int:
        return (self.height // PATCH) * (self.width // PATCH)


def trace(seed: int, sessions: int, photos: int, videos: int) -> list[tuple[int, list[Image]]]:
    """(session, images of the request) in arrival order."""
    rng = np.random.default_rng(seed)

    def image(name: str) -> Image:
        h, w = SIZES[int(rng.integers(len(SIZES)))]
        return Image(name, h, w)

    popular = [image(f"photo-{i}") for i in range(photos)]
    weights = 1.0 / np.arange(1, photos + 1) ** 1.1
    weights /= weights.sum()
    frames = [[Image(f"video-{v}-frame-{f}", 336, 336) for f in range(8)] for v in range(videos)]
    turns: list[list[tuple[int, list[Image]]]] = []
    for s in range(sessions):
        history: list[Image] = []
        own: list[tuple[int, list[Image]]] = []
        for _ in range(int(rng.integers(2, 7))):
            kind = rng.random()
            if kind < 0.3:
                history.append(popular[int(rng.choice(photos, p=weights))])
            elif kind < 0.5 and not history:
                history.append(image(f"session-{s}-image-{len(history)}"))
            elif kind < 0.65:
                video = frames[int(rng.integers(videos))]
                start = int(rng.integers(0, 5))
                own.append((s, video[start:start + 4]))      # a question about a clip
                continue
            elif kind < 0.8:
                history.append(image(f"session-{s}-image-{len(history)}"))
            own.append((s, list(history)))
        turns.append(own)
    order: list[tuple[int, list[Image]]] = []
    cursors = [0] * sessions
    while any(c < len(t) for c, t in zip(cursors, turns)):   # sessions interleave
        live = [s for s in range(sessions) if cursors[s] < len(turns[s])]
        s = live[int(rng.integers(len(live)))]
        order.append(turns[s][cursors[s]])
        cursors[s] += 1
    return [(s, images) for s, images in order if images]


class StandInEncoder:
    """Patches through ``layers`` dense layers: work in proportion to pixels, an output of
    ``tokens × hidden`` bfloat16, the same for the same image."""

    def __init__(self, hidden: int, layers: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.embed = torch.randn(3 * PATCH * PATCH, hidden, generator=g) / 24
        self.layers = [torch.randn(hidden, hidden, generator=g) / hidden ** 0.5
                       for _ in range(layers)]
        self.calls, self.seconds = 0, 0.0

    def __call__(self, image: Image) -> torch.Tensor:
        start = time.perf_counter()
        seed = int.from_bytes(image.media_hash.encode()[-8:].rjust(8, b"\0"), "little")
        pixels = torch.rand(image.tokens, 3 * PATCH * PATCH,
                            generator=torch.Generator().manual_seed(seed % (1 << 63)))
        x = pixels @ self.embed
        for w in self.layers:
            x = torch.nn.functional.gelu(x @ w)
        out = x.to(torch.bfloat16)
        self.calls += 1
        self.seconds += time.perf_counter() - start
        return out


def without_sharing(requests, encoder: StandInEncoder) -> dict:
    items = 0
    for _, images in requests:
        for image in images:
            encoder(image)
            items += 1
    return {"mode": "without sharing", "items": items, "encoder_calls": encoder.calls,
            "served_without_encoder": 0, "stored_bytes": 0, "encoder_s": encoder.seconds,
            "gcache_read_s": 0.0}


def with_gcache(requests, encoder: StandInEncoder, servers: list[str], instances: int,
                hidden: int) -> dict:
    clients = [Client(servers, timeout_s=5.0) for _ in range(instances)]
    caches = [EncoderCache(c, encoder="stand-in-vit@bench") for c in clients]
    items = hits = stored = 0
    read_s = 0.0
    reference: dict[str, torch.Tensor] = {}
    try:
        for session, images in requests:
            cache = caches[session % instances]
            for image in images:
                items += 1
                key = cache.key(image.media_hash, {"patch": PATCH, "size": [image.height,
                                                                             image.width]})
                out = torch.empty(image.tokens, hidden, dtype=torch.bfloat16)
                start = time.perf_counter()
                found = cache.get_into(key, out)
                read_s += time.perf_counter() - start
                if found:
                    hits += 1
                    assert torch.equal(out, reference[image.media_hash]), image
                    continue
                output = encoder(image)
                reference.setdefault(image.media_hash, output)
                if cache.put(key, output):
                    stored += output.numel() * output.element_size()
    finally:
        for client in clients:
            client.close()
    return {"mode": f"GCache, {instances} instances", "items": items,
            "encoder_calls": encoder.calls, "served_without_encoder": hits,
            "stored_bytes": stored, "encoder_s": encoder.seconds, "gcache_read_s": read_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--photos", type=int, default=40, help="popular photos shared")
    parser.add_argument("--videos", type=int, default=4)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)                 # one engine's encoder on one core, both modes
    requests = trace(args.seed, args.sessions, args.photos, args.videos)
    print(f"{len(requests)} requests, {sum(len(i) for _, i in requests)} images")
    rows = [without_sharing(requests, StandInEncoder(args.hidden, args.layers))]
    with tempfile.TemporaryDirectory(prefix="gcache-bench-mm-") as logs, \
            LocalCluster(args.servers, memory="1GiB", log_dir=logs) as cluster:
        rows.append(with_gcache(requests, StandInEncoder(args.hidden, args.layers),
                                cluster.addresses, args.instances, args.hidden))
    base = rows[0]["encoder_s"]
    for row in rows:
        row["hit_rate"] = row["served_without_encoder"] / row["items"]
        row["encoder_s_saved"] = base - row["encoder_s"] - row["gcache_read_s"]
        print(f"{row['mode']}: {row['encoder_calls']} encoder calls for {row['items']} items "
              f"(hit rate {row['hit_rate']:.2f}), {row['encoder_s']:.1f} s encoding, "
              f"{row['gcache_read_s']:.2f} s reading, {row['stored_bytes'] / 2**20:.0f} MiB "
              f"stored; saved {row['encoder_s_saved']:.1f} s")
    calls = rows[0]["encoder_calls"]
    report = {"date": dt.date.today().isoformat(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "requests": len(requests),
              "sessions": args.sessions, "photos": args.photos, "videos": args.videos,
              "instances": args.instances, "servers": args.servers, "hidden": args.hidden,
              "layers": args.layers,
              "limits": {"encoder_s_per_call": rows[0]["encoder_s"] / calls},
              "rows": rows}
    write_results("multimodal", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

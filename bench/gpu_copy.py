"""GPU copy benchmark: GCache between CUDA memory and a local server's arena, against torch's
own pinned-memory copies of the same size in the same run (the limit: one DMA each way).

- ``put``: ``Client.put`` of a CUDA tensor over shared memory (a device-to-host DMA into the
  ALLOC'd extent, the checksum over the host bytes, COMMIT), against ``pinned.copy_(device)``;
- ``get_into``: ``Client.get_into`` of a CUDA tensor (LEASE, hash, a host-to-device DMA),
  against ``device.copy_(pinned)``;
- ``tcp put``/``tcp get_into``: the same over TCP (the client's pinned staging, a DMA, the
  loopback socket), against the same DMA limits: the socket, not the copy, is what they show;
- ``vllm save``/``vllm load``: the vLLM connector's staging copies (``staging.Transfers``:
  pinned pool, side streams, events), against the same torch copies.
Needs a CUDA device (``make gpu-check`` runs it); prints GB/s and ratios and writes
``bench/results/gpu-copy-latest.json``. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "connectors", "vllm"))
from results_file import write_results

MiB = 1 << 20


def rate(n_bytes: int, seconds: float) -> float:
    return n_bytes / seconds / 1e9


def timed(fn, reps: int, sync) -> float:
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - start) / reps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    import torch

    from gcache.cli.local_cluster import LocalCluster
    from gcache.sdk import Client
    from gcache_vllm.staging import Transfers

    if not torch.cuda.is_available():
        print("gpu_copy: no CUDA device; nothing measured")
        return 2
    n = args.size_mib * MiB
    device = torch.device("cuda")
    value = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
    out = torch.empty_like(value)
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    sync = torch.cuda.synchronize
    rows: dict[str, dict] = {}

    d2h = timed(lambda: pinned.copy_(value, non_blocking=True), args.reps, sync)
    h2d = timed(lambda: out.copy_(pinned, non_blocking=True), args.reps, sync)
    with LocalCluster(1, memory=f"{max(4 * args.size_mib, 256)}MiB") as cluster, \
            Client(cluster.addresses, transport="shm", timeout_s=10.0) as client:
        put = timed(lambda: client.put("gpu-bench", value), args.reps, sync)
        get = timed(lambda: client.get_into("gpu-bench", out), args.reps, sync)
        assert torch.equal(out, value)
        out.zero_()
        with Client(cluster.addresses, transport="tcp", timeout_s=10.0) as tcp:
            tcp_put = timed(lambda: tcp.put("gpu-bench-tcp", value), args.reps, sync)
            tcp_get = timed(lambda: tcp.get_into("gpu-bench-tcp", out), args.reps, sync)
    assert torch.equal(out, value)
    transfers = Transfers(device)

    def save() -> None:
        host, copied = transfers.to_host(value)
        copied.synchronize()
        transfers.release(host)

    host = transfers.host_buffer(n)
    host.copy_(pinned)

    def load() -> None:
        _, copied = transfers.to_device(host)
        copied.synchronize()

    save_s, load_s = timed(save, args.reps, sync), timed(load, args.reps, sync)
    for name, seconds, limit in (("put (device -> arena)", put, d2h),
                                 ("get_into (arena -> device)", get, h2d),
                                 ("tcp put (device -> pinned -> socket)", tcp_put, d2h),
                                 ("tcp get_into (socket -> pinned -> device)", tcp_get, h2d),
                                 ("vllm save staging (device -> pinned)", save_s, d2h),
                                 ("vllm load staging (pinned -> device)", load_s, h2d)):
        rows[name] = {"gb_s": rate(n, seconds), "limit_gb_s": rate(n, limit),
                      "ratio": limit / seconds}
    print(f"gpu copy, {args.size_mib} MiB values, {args.reps} reps, "
          f"{torch.cuda.get_device_name(device)}")
    print(f"  {'path':44s} {'GB/s':>8s} {'torch pinned GB/s':>18s} {'ratio':>6s}")
    for name, row in rows.items():
        print(f"  {name:44s} {row['gb_s']:8.2f} {row['limit_gb_s']:18.2f} {row['ratio']:6.2f}")
    write_results("gpu-copy", {"date": dt.date.today().isoformat(),
                               "device": torch.cuda.get_device_name(device),
                               "size_bytes": n, "reps": args.reps, "paths": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

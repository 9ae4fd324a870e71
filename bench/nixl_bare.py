"""The bare NIXL limit: READ and WRITE loops between two agents in two processes, over UCX.

This is what GCache's own NIXL path will be measured against (issue 16: ``get_into`` >= 0.8x and
``put`` >= 0.7x of it): one process registers a 'server' buffer and hands its agent metadata and
address over a pipe; the other registers a local buffer and moves ``--value-mib`` values with
descriptors of at most ``--io-mib``, ``--in-flight`` transfers at a time, polling completions,
and checks the bytes. It runs once per UCX transport set (``UCX_TLS``: UCX's own choice, then
``tcp``), next to a memcpy of the same bytes in the same run. Prints GB/s and writes
``bench/results/nixl-bare-latest.json``; reported, never asserted. Needs ``nixl-cu12``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

MiB = 1 << 20


def _agent(name: str):
    """An agent configured as GCache's own (``gcache.transport.nixl.waiting_agent``): with
    ``nixl_agent``'s defaults UCX's progress thread spins and takes a core from each side,
    which would make the limit a measure of that rather than of NIXL."""
    from gcache.transport.nixl import waiting_agent
    agent = waiting_agent(name)
    agent.create_backend("UCX", {})
    return agent


def _digest(array) -> str:
    return hashlib.sha256(memoryview(array)).hexdigest()


def _target(conn, size: int) -> None:
    import numpy as np
    agent = _agent("target")
    buffer = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
    agent.register_memory([(buffer.ctypes.data, size, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), buffer.ctypes.data, _digest(buffer)))
    conn.recv()                                     # the initiator is done
    conn.send(_digest(buffer))


def _run(op: str, agent, remote: str, local_base: int, remote_base: int, total: int,
         value: int, io: int, in_flight: int) -> float:
    """Seconds to move ``total`` bytes as ``value``-byte transfers of ``io``-byte descriptors."""
    starts = list(range(0, total, value))
    pending: list = []
    began = time.perf_counter()
    for offset in starts:
        chunks = range(offset, offset + value, io)
        local = agent.get_xfer_descs([(local_base + o, io, 0) for o in chunks], "DRAM")
        far = agent.get_xfer_descs([(remote_base + o, io, 0) for o in chunks], "DRAM")
        handle = agent.initialize_xfer(op, local, far, remote)
        if agent.transfer(handle) == "ERR":
            raise RuntimeError(f"NIXL {op} failed to post")
        pending.append(handle)
        while len(pending) >= in_flight or (offset == starts[-1] and pending):
            for h in list(pending):
                state = agent.check_xfer_state(h)
                if state == "ERR":
                    raise RuntimeError(f"NIXL {op} failed")
                if state == "DONE":
                    agent.release_xfer_handle(h)
                    pending.remove(h)
    return time.perf_counter() - began


def _answer(conn, target, what: str, timeout_s: float = 60.0):
    """The target's next message; RuntimeError when it died or stayed silent (the bench must
    stop by itself, not wait on a pipe for ever)."""
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.2):
        if not target.is_alive():
            raise RuntimeError(f"the target process exited ({target.exitcode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the target process sent no {what} in {timeout_s:.0f} s")
    return conn.recv()


def measure(args) -> dict:
    """One UCX configuration (this process's environment): READ and WRITE GB/s."""
    import numpy as np
    total, value, io = args.total_mib * MiB, args.value_mib * MiB, args.io_mib * MiB
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    target = ctx.Process(target=_target, args=(child, total))
    target.start()
    try:
        metadata, remote_base, served = _answer(parent, target, "agent metadata")
        agent = _agent("initiator")
        local = np.ones(total, dtype=np.uint8)          # touched: no page faults in the READs
        agent.register_memory([(local.ctypes.data, total, 0, "")], "DRAM")
        remote = agent.add_remote_agent(metadata)
        _run("READ", agent, remote, local.ctypes.data, remote_base, min(total, 4 * value),
             value, io, args.in_flight)                                   # warm-up
        read_s = _run("READ", agent, remote, local.ctypes.data, remote_base, total, value, io,
                      args.in_flight)
        if _digest(local) != served:
            raise RuntimeError("READ: the bytes read differ from the target's")
        source = np.random.default_rng(2).integers(0, 255, total, dtype=np.uint8)
        local[:] = source
        write_s = _run("WRITE", agent, remote, local.ctypes.data, remote_base, total, value, io,
                       args.in_flight)
        parent.send("done")
        if _answer(parent, target, "digest of the written bytes") != _digest(source):
            raise RuntimeError("WRITE: the target's bytes differ from those written")
    finally:
        target.join(30)
        if target.is_alive():
            target.kill()
    return {"read_gb_s": total / read_s / 1e9, "write_gb_s": total / write_s / 1e9}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mib", type=int, default=256)
    parser.add_argument("--value-mib", type=int, default=4)
    parser.add_argument("--io-mib", type=int, default=1)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.total_mib % args.value_mib or args.value_mib % args.io_mib:
        parser.error("--total-mib must be a multiple of --value-mib, and that of --io-mib")
    if args.one:                                        # a child run under one UCX_TLS
        print(json.dumps(measure(args)))
        return 0
    import numpy as np
    a = np.ones(args.total_mib * MiB, dtype=np.uint8)
    b = np.zeros_like(a)                                # touched: no page faults in the copy
    copies = []
    for _ in range(3):
        began = time.perf_counter()
        np.copyto(b, a)
        copies.append(time.perf_counter() - began)
    memcpy = a.nbytes / min(copies) / 1e9
    rows = {}
    for label, tls in (("ucx default", None), ("ucx tcp", "tcp")):
        env = dict(os.environ)
        env.pop("UCX_TLS", None)
        if tls:
            env["UCX_TLS"] = tls
        done = subprocess.run([sys.executable, __file__, "--one", *sys.argv[1:]], env=env,
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        rows[label] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"bare NIXL, {args.total_mib} MiB as {args.value_mib} MiB transfers of "
          f"{args.io_mib} MiB descriptors, {args.in_flight} in flight; memcpy {memcpy:.2f} GB/s")
    for label, row in rows.items():
        ratio = row["read_gb_s"] / memcpy
        print(f"  {label:12s} READ {row['read_gb_s']:6.2f} GB/s  "
              f"WRITE {row['write_gb_s']:6.2f} GB/s  (READ {ratio:.2f}x memcpy)")
    write_results("nixl-bare", {"date": dt.date.today().isoformat(), "memcpy_gb_s": memcpy,
                                "total_bytes": args.total_mib * MiB,
                                "value_bytes": args.value_mib * MiB,
                                "io_bytes": args.io_mib * MiB, "in_flight": args.in_flight,
                                "transports": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

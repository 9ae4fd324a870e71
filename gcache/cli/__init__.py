"""``gcache``: the operator's command line (local demo cluster, stat, put, get, status, top,
explain, tenant).

This package sits above the SDK: it uses ``gcache.sdk`` and starts ``gcache-server`` as
processes, never running server code in-process (``replay`` reads the arena's record size, a
pure function, to size arenas), so the layers below stay as ARCHITECTURE §2 draws them.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from gcache.cli import arenas, explain, plan, replay, tenants, top
from gcache.cli import files as files_cmd
from gcache.config import parse_size
from gcache.errors import GCacheError, InvalidRequest

if TYPE_CHECKING:
    from gcache.sdk import Client


def _demo(args: argparse.Namespace) -> int:
    """The KV demo (conversations through ``gcache.kv``), then the raw put/get check."""
    if not 0 < args.budget <= 1:
        raise InvalidRequest(f"--budget {args.budget} must be a fraction in (0, 1]")
    if args.conversations < 1:
        raise InvalidRequest(f"--conversations {args.conversations} must be 1 or more")
    if _kv_demo(args) != 0:
        return 1
    return 0 if args.total == "0" else _put_get_check(args)


def _kv_demo(args: argparse.Namespace) -> int:
    from gcache.cli import kv_demo
    from gcache.cli.local_cluster import LocalCluster
    from gcache.kv import ModelLayout
    from gcache.kv.trace import BLOCK_SIZE
    from gcache.sdk import Client

    layout = ModelLayout.from_config(args.model, page_size=BLOCK_SIZE)
    trace = kv_demo.demo_requests(args.trace, args.conversations, layout)
    if not trace.requests:
        raise InvalidRequest(f"--trace {args.trace} holds no conversation of 3 turns or more")
    memory, segment = replay.arena_for_budget(trace, args.scale, args.budget, args.servers)
    print(f"gcache demo: KV of {layout.model} ({len(layout.full_layers)} full-attention + "
          f"{len(layout.swa_layers)} sliding-window layers, W={layout.window}) for the "
          f"conversations of {args.trace}, on {args.servers} gcache-server(s) of "
          f"{memory / 2**20:.1f} MiB (values at 1/{args.scale})")
    with LocalCluster(args.servers, memory=str(memory),
                      server_args=("--segment-size", str(segment))) as cluster, \
            Client(cluster.addresses, timeout_s=args.timeout) as client:
        result = kv_demo.run_kv_demo(client, trace, scale=args.scale, budget=args.budget,
                                     n_conversations=args.conversations,
                                     progress=not args.quiet)
    for line in kv_demo.report(result, layout):
        print(f"gcache demo: {line}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result.to_json(), out, indent=1)
    if result.corrupt_loads or result.failed_loads or result.hit_tokens == 0:
        print("gcache demo: FAILED (a load was wrong or incomplete, or nothing hit)",
              file=sys.stderr)
        return 1
    return 0


def _put_get_check(args: argparse.Namespace) -> int:
    from gcache.cli.local_cluster import LocalCluster
    from gcache.cli.workload import run_workload
    from gcache.sdk import Client

    total, block = parse_size(args.total, key="--total"), parse_size(args.block, key="--block")
    print(f"gcache demo: raw put/get check, {args.servers} gcache-server(s) of {args.memory}")
    with LocalCluster(args.servers, memory=args.memory) as cluster, \
            Client(cluster.addresses, timeout_s=args.timeout) as client:
        raw = run_workload(client, total_bytes=total, block_bytes=block,
                           progress=not args.quiet)
        stats = client.stats()
        server_stats = client.server_stats()
    print(f"gcache demo: {raw.summary()}")
    print(f"gcache demo: misses_by_reason={stats['misses_by_reason']}")
    evicted = sum(s["tier"]["evicted_objects"] for s in server_stats.values() if s)
    print(f"gcache demo: server evictions={evicted} (the cluster holds less than was written)"
          if evicted else "gcache demo: server evictions=0")
    print("gcache demo: stopped all servers")
    if raw.corrupt or raw.hits == 0:
        print("gcache demo: FAILED (corrupt blocks or no hits)", file=sys.stderr)
        return 1
    return 0


def _client(args: argparse.Namespace) -> Client:
    from gcache.config import ClientConfig
    from gcache.config_loader import load_config
    from gcache.sdk import Client

    flags = {"servers": args.servers, "timeout_s": args.timeout, "token": args.token}
    return Client(config=load_config(ClientConfig, "client", path=args.config, flags=flags))


def _stat(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(json.dumps(client.server_stats(), indent=2))
    return 0


def _put(args: argparse.Namespace) -> int:
    data = sys.stdin.buffer.read() if args.file == "-" else open(args.file, "rb").read()
    with _client(args) as client:
        ok = client.put(args.key, data)
    print("stored" if ok else "not stored", file=sys.stderr)
    return 0 if ok else 1


def _get(args: argparse.Namespace) -> int:
    with _client(args) as client:
        value = client.get(args.key)
    if value is None:
        print("miss", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(value)
    return 0


def _status(args: argparse.Namespace) -> int:
    """Each master's view (leader, term, epoch), the servers of the cluster map and, under
    each one that has not left, its tiers' usage and reads (its STAT)."""
    import os

    from gcache.master_client import STATE_NAMES, MasterClient, parse_masters
    from gcache.proto import master_pb2 as pb

    token = args.token or os.environ.get("GCACHE_TOKEN")
    masters = parse_masters(args.master)
    servers = None
    for address in masters:
        link = MasterClient([address], token=token, timeout_s=args.timeout)
        try:
            reply = link.status()
        except GCacheError as exc:
            print(f"master {address}: {exc}")
            continue
        finally:
            link.close()
        role = "leader" if reply.is_leader else f"follower (leader {reply.leader_grpc or '?'})"
        print(f"master {address}: {role}, raft term {reply.raft_term}, epoch {reply.epoch}")
        servers = servers or reply.servers
    stats = top.stats_of([s.address for s in servers or () if s.state != pb.LEFT],
                         token=token, timeout_s=args.timeout)
    for server in servers or ():
        print(f"server {server.id}: {server.address} {STATE_NAMES.get(server.state, '?')} "
              f"capacity={server.capacity_bytes} host={server.host_id}")
        if server.address in stats:            # tiers and reads, from the server's STAT
            print("\n".join(top.tier_lines(stats[server.address])))
    return 0 if servers is not None else 1


def _drain(args: argparse.Namespace) -> int:
    """Mark a server draining and wait until it has handed its keys over and left."""
    import os
    import time

    from gcache.master_client import MasterClient, parse_masters
    from gcache.proto import master_pb2 as pb

    link = MasterClient(parse_masters(args.master),
                      token=args.token or os.environ.get("GCACHE_TOKEN"), timeout_s=5.0)
    try:
        link.drain(args.server_id)
        print(f"gcache drain: {args.server_id} is draining", file=sys.stderr)
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            servers = link.status().servers
            state = next((s.state for s in servers if s.id == args.server_id), None)
            if state == pb.LEFT:
                print(f"gcache drain: {args.server_id} handed its keys over and left")
                return 0
            time.sleep(0.5)
    finally:
        link.close()
    print(f"gcache drain: {args.server_id} has not left after {args.wait:.0f}s; see its log "
          "(handoff.*) and run drain again", file=sys.stderr)
    return 1


def _topology(args: argparse.Namespace) -> int:
    from gcache.transport.topology import choose_nics, format_choices, read_topology
    topology = read_topology(args.sys_root)

    def split(text: str | None) -> list[str]:
        return [n for n in (text or "").split(",") if n]

    nics = ", ".join(n.name for n in topology.nics) or "none"
    if not topology.gpus:
        print(f"no NVIDIA GPU under {args.sys_root}; RDMA NICs: {nics}")
        return 0
    print(f"RDMA NICs: {nics}")
    print(format_choices(choose_nics(topology, allow=split(args.allow), deny=split(args.deny))))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gcache", description="GCache command line")
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start a local cluster, serve a trace's conversations "
                          "through gcache.kv, then run a verified put/get workload")
    demo.add_argument("--servers", type=int, default=2)
    demo.add_argument("--trace", default=replay.DEFAULT_TRACE, help="JSONL trace (Mooncake)")
    demo.add_argument("--model", default="mimo-v2.5-pro",
                      help="config.json path or a shipped config name")
    demo.add_argument("--conversations", type=int, default=20,
                      help="how many conversations (of 3 turns or more) to serve")
    demo.add_argument("--budget", type=float, default=0.2,
                      help="arena size as a fraction of the full-layer working set")
    demo.add_argument("--scale", type=int, default=128, help="value size divisor")
    demo.add_argument("--json", help="write the KV demo's figures as JSON here")
    demo.add_argument("--memory", default="384MiB", help="hot tier per server (put/get check)")
    demo.add_argument("--total", default="1GiB", help="bytes to write (put/get check; 0: skip)")
    demo.add_argument("--block", default="4MiB", help="value size (put/get check)")
    demo.add_argument("--timeout", type=float, default=2.0, help="IO timeout in seconds")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    demo.set_defaults(run=_demo)
    for name, fn, helptext in (("stat", _stat, "print every server's STAT"),
                               ("put", _put, "store a file (or - for stdin) under KEY"),
                               ("get", _get, "write KEY's value to stdout")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--servers", help="HOST:PORT[,HOST:PORT...] (or GCACHE_CLIENT_SERVERS)")
        cmd.add_argument("--timeout", type=float, help="IO timeout in seconds")
        cmd.add_argument("--token", help="cluster token (prefer GCACHE_TOKEN: flags show in ps)")
        cmd.add_argument("--config", help="TOML file with a [client] section")
        if name in ("put", "get"):
            cmd.add_argument("key")
        if name == "put":
            cmd.add_argument("file")
        cmd.set_defaults(run=fn)
    status = sub.add_parser("status", help="the masters' view of the cluster, and each "
                            "server's tier usage and hit rate")
    status.add_argument("--master", required=True, help="HOST:PORT[,HOST:PORT...]")
    status.add_argument("--token", help="cluster token (prefer GCACHE_TOKEN)")
    status.add_argument("--timeout", type=float, default=2.0)
    status.set_defaults(run=_status)
    drain = sub.add_parser("drain", help="move a server's keys to their other owners, then "
                           "retire it")
    drain.add_argument("server_id")
    drain.add_argument("--master", required=True, help="HOST:PORT[,HOST:PORT...]")
    drain.add_argument("--token", help="cluster token (prefer GCACHE_TOKEN)")
    drain.add_argument("--wait", type=float, default=300.0, help="seconds to wait for it")
    drain.set_defaults(run=_drain)
    topology = sub.add_parser("topology", help="which RDMA NIC and CPUs serve each GPU "
                              "(same PCIe switch, then same NUMA node)")
    topology.add_argument("--sys-root", default="/sys", help="the sysfs tree to read")
    topology.add_argument("--allow", help="NIC names that may carry data, comma separated")
    topology.add_argument("--deny", help="NIC names that never carry data (a front-end NIC)")
    topology.set_defaults(run=_topology)
    replay.add_parser(sub)
    plan.add_parser(sub)
    arenas.add_parser(sub)
    top.add_parser(sub)
    explain.add_parser(sub)
    files_cmd.add_parser(sub)
    tenants.add_parser(sub)
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C: a command that started local servers (``demo``, ``replay
    --cluster``) stops them and removes their arenas on the way out, instead of dying with
    them left in /dev/shm."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)    # main thread only
    try:
        run: Callable[[argparse.Namespace], int] = args.run
        return run(args)
    except (GCacheError, ValueError, OSError) as exc:
        print(f"gcache {args.command}: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)

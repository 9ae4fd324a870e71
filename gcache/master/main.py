"""``gcache-master``: one member of the Raft group that tracks which data servers are alive.

The line ``gcache-master ready listen=HOST:PORT raft=HOST:PORT`` on stderr is a contract: test
fixtures and operators' scripts wait for it. SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from gcache.config import MasterConfig
from gcache.config_loader import config_from_args, redacted
from gcache.errors import GCacheError, MasterError
from gcache.master.liveness import Liveness
from gcache.master.raft import RaftGroup
from gcache.master.service import MasterService
from gcache.master.state import AnnounceMaster
from gcache.master.token_check import TokenCheck
from gcache.placement import Placement
from gcache.proto import master_pb2_grpc as pb_grpc

log = logging.getLogger("gcache.master")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gcache-master", description="GCache master")
    parser.add_argument("--listen", help="HOST:PORT of the gRPC API")
    parser.add_argument("--raft", help="HOST:PORT of this member's Raft traffic")
    parser.add_argument("--peers", help="Raft HOST:PORT of every member, self included")
    parser.add_argument("--data-dir", dest="data_dir", help="Raft journal and snapshots")
    parser.add_argument("--token-file", dest="token_file",
                        help="file holding the cluster token (a systemd credential, a Secret)")
    parser.add_argument("--token", help="cluster token (prefer GCACHE_TOKEN: flags show in ps)")
    parser.add_argument("--dead-timeout", dest="dead_timeout_s", help="seconds")
    parser.add_argument("--heartbeat-interval", dest="heartbeat_interval_s", help="seconds")
    parser.add_argument("--metrics-listen", dest="metrics_listen", help="HOST:PORT of /metrics")
    parser.add_argument("--advertise", help="gRPC HOST:PORT callers reach (default: --listen)")
    parser.add_argument("--vnodes", help="ring points per server, sent to clients in the map")
    parser.add_argument("--group-width", dest="group_width",
                        help="servers one placement group is striped over (sent in the map)")
    parser.add_argument("--config", help="TOML file with a [master] section")
    parser.add_argument("--log-level", default="INFO")
    return parser


def announce(group: RaftGroup, grpc_address: str, stop: threading.Event) -> None:
    """Record this member's gRPC address in the replicated state, so followers can name the
    leader to callers; retried until a leader takes it."""
    while not stop.is_set():
        try:
            group.submit(AnnounceMaster(group.self_addr, grpc_address))
            return
        except MasterError:
            stop.wait(0.5)


def main(argv: list[str] | None = None) -> int:
    os.umask(0o077)           # the journal, snapshots and id files are the cluster's own
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = config_from_args(MasterConfig, "master", args)
    except GCacheError as exc:
        sys.stderr.write(f"gcache-master: {exc}\n")
        return 2
    log.info("master.config %s", " ".join(f"{k}={v}" for k, v in redacted(config).items()))
    group = RaftGroup(config.raft, config.peers or (config.raft,), config.data_dir,
                      token=config.token)
    liveness = Liveness(group, config)
    if config.metrics_listen:
        from gcache.master.metrics import serve_metrics
        serve_metrics(config.metrics_listen, group, liveness, token=config.token)
    interceptors: list[grpc.ServerInterceptor] = (
        [TokenCheck(config.token, lambda: group.state.tenants)] if config.token else [])
    server = grpc.server(ThreadPoolExecutor(16, thread_name_prefix="gcache-rpc"),
                         interceptors=interceptors)
    placement = Placement(config.vnodes, config.group_width)
    # grpcio-tools generates master_pb2_grpc without annotations
    pb_grpc.add_MasterServicer_to_server(  # type: ignore[no-untyped-call]
        MasterService(group, liveness, placement, secured=config.token is not None), server)
    if server.add_insecure_port(config.listen) == 0:
        sys.stderr.write(f"gcache-master: cannot listen on {config.listen}\n")
        group.close()
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    liveness.start()
    threading.Thread(target=announce, args=(group, config.advertise or config.listen, stop),
                     daemon=True, name="gcache-announce").start()
    sys.stderr.write(f"gcache-master ready listen={config.listen} raft={config.raft}\n")
    sys.stderr.flush()
    while not stop.wait(1.0):
        pass
    log.info("master.stopping listen=%s", config.listen)
    server.stop(grace=1.0).wait(2.0)
    liveness.stop()
    group.close()
    time.sleep(0.1)
    log.info("master.stopped listen=%s", config.listen)
    return 0


if __name__ == "__main__":
    sys.exit(main())

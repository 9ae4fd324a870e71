"""``gcache-server``: parse flags, load the config, serve until SIGTERM or SIGINT.

The line ``gcache-server ready listen=HOST:PORT`` on stderr is a contract: test fixtures, the
local cluster of ``make run`` and operators' scripts wait for it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from gcache.config import ServerConfig
from gcache.config_loader import config_from_args, redacted
from gcache.errors import GCacheError
from gcache.server.daemon import DataServer

log = logging.getLogger("gcache.server")

SWITCH_INTERVAL_S = 0.0005


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gcache-server", description="GCache data server")
    parser.add_argument("--listen", help="HOST:PORT of the TCP data plane")
    parser.add_argument("--memory", help="hot-tier size, e.g. 4GiB")
    parser.add_argument("--pin-share", dest="pin_share",
                        help="most of the hot tier pinned values (files) may hold against "
                        "eviction, 0 to 0.9 (default 0.5)")
    parser.add_argument("--segment-size", dest="segment_size", help="arena segment size")
    parser.add_argument("--shm-name", dest="shm_name", help="arena file name in --arena-dir")
    parser.add_argument("--arena-dir", dest="arena_dir",
                        help="tmpfs directory of the arena (default /dev/shm; one mounted with "
                        "huge pages, docs/rdma.md)")
    parser.add_argument("--io-size", dest="io_size", help="largest single IO, e.g. 1MiB")
    parser.add_argument("--max-value-size", dest="max_value_size", help="largest value")
    parser.add_argument("--lease-ttl", dest="lease_ttl_s", help="lease TTL in seconds")
    parser.add_argument("--unreachable-sweep", dest="unreachable_sweep_s",
                        help="seconds between counts of the values whose prefix is gone "
                        "(STAT's unreachable_bytes; default 10)")
    parser.add_argument("--auth-timeout", dest="auth_timeout_s",
                        help="seconds a connection has to authenticate")
    parser.add_argument("--io-timeout", dest="io_timeout_s",
                        help="seconds one IO may stall before the connection is dropped")
    parser.add_argument("--min-transfer-rate", dest="min_transfer_rate",
                        help="bytes/s a payload must arrive at after one IO timeout, e.g. 1MiB")
    parser.add_argument("--max-held-share", dest="max_held_share",
                        help="most of the hot tier one connection may hold in leases, writes "
                        "and payloads in flight, 0 to 1 (default 0.5)")
    parser.add_argument("--max-connections", dest="max_connections",
                        help="concurrent authenticated connections")
    parser.add_argument("--max-unauthenticated", dest="max_unauthenticated",
                        help="connections yet to authenticate (the oldest is cut off)")
    parser.add_argument("--unix-socket", dest="unix_socket",
                        help="same-host socket path, or 'off' (default /tmp/<shm-name>.sock)")
    parser.add_argument("--token-file", dest="token_file",
                        help="file holding the cluster token (a systemd credential, a Secret)")
    parser.add_argument("--token", help="cluster token (prefer GCACHE_TOKEN or the config "
                        "file: flags show in ps)")
    parser.add_argument("--metrics-listen", dest="metrics_listen", help="HOST:PORT of /metrics")
    parser.add_argument("--no-prefault", dest="prefault", action="store_const", const=False,
                        help="do not touch arena pages at start")
    parser.add_argument("--no-nixl", dest="nixl", action="store_const", const=False,
                        help="do not offer the arena over NIXL (RDMA / GPU Direct)")
    parser.add_argument("--nixl", dest="nixl", action="store_const", const=True,
                        help="offer it (the default when nixl-cu12 imports)")
    parser.add_argument("--nixl-devices", dest="nixl_devices",
                        help="UCX devices for NIXL, comma separated (e.g. mlx5_0:1), or 'auto' "
                        "for every GPU's rail NIC")
    parser.add_argument("--nic-deny", dest="nic_deny",
                        help="NICs that never carry data, comma separated (a front-end NIC)")
    parser.add_argument("--disk-dir", dest="disk_dir", help="cold tier directory (NVMe)")
    parser.add_argument("--disk-capacity", dest="disk_capacity", help="cold tier size, e.g. 1TiB")
    parser.add_argument("--disk-format", dest="disk_format", choices=("segments", "blobs"),
                        help="cold values in segment files (default) or RocksDB blob files")
    parser.add_argument("--master", help="gRPC HOST:PORT[,HOST:PORT...] of the masters")
    parser.add_argument("--advertise", help="HOST:PORT clients reach (default: --listen)")
    parser.add_argument("--heartbeat-interval", dest="heartbeat_interval_s", help="seconds")
    parser.add_argument("--config", help="TOML file with a [server] section")
    parser.add_argument("--log-level", default="INFO")
    return parser


def main(argv: list[str] | None = None) -> int:
    os.umask(0o077)           # arena, id file, cold segments and RocksDB index hold keys
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = config_from_args(ServerConfig, "server", args)
        server = DataServer(config)
    except GCacheError as exc:
        sys.stderr.write(f"gcache-server: {exc}\n")
        return 2
    log.info("server.config %s", " ".join(f"{k}={v}" for k, v in redacted(config).items()))
    if config.metrics_listen:
        from gcache.server.metrics import serve_metrics
        serve_metrics(config.metrics_listen, server)
    # A request thread waiting for the GIL behind the demoter's hashing would wait up to the
    # default 5 ms switch interval; hot reads must not.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.stop.set())
    server.start()
    sys.stderr.write(f"gcache-server ready listen={server.address}\n")
    sys.stderr.flush()
    while not server.stop.wait(1.0):
        pass
    log.info("server.stopping address=%s", server.address)
    server.shutdown()
    log.info("server.stopped address=%s", server.address)
    return 0


if __name__ == "__main__":
    sys.exit(main())

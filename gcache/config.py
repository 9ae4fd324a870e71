"""Process configuration: one frozen dataclass per process, each field with its rule.

``__post_init__`` checks every range and relation and raises ``ConfigError(key, value, rule)``.
Sizes accept strings such as ``"4GiB"`` (``parse_size`` is the only parser of them). The one
loader that fills these from a file, the environment and flags is ``gcache.config_loader``.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass

from gcache.errors import ConfigError
from gcache.placement import DEFAULT_GROUP_WIDTH, DEFAULT_VNODES

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": KiB, "m": 1000**2, "mb": 1000**2,
          "mib": MiB, "g": 1000**3, "gb": 1000**3, "gib": GiB, "t": 1000**4, "tb": 1000**4,
          "tib": TiB}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
SHM_NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")   # a file in /dev/shm
SHM_NAME_TEXT = ("must be a file name in /dev/shm: letters, digits, '.', '_' and '-', not "
                 "starting with '.' (no '/')")


def parse_size(text: str | int, *, key: str = "size") -> int:
    """Parse ``"4GiB"``, ``"512 MiB"``, ``"64k"`` or a plain integer into bytes."""
    if isinstance(text, bool):
        raise ConfigError(key, text, "must be a size such as 4GiB or an integer")
    if isinstance(text, int):
        return text
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(key, text, "must be a size such as 4GiB, 512MiB or an integer")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(n_bytes: int) -> str:
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.4g}{unit}"
    return f"{n_bytes}B"


def _check(key: str, value: object, ok: bool, rule: str) -> None:
    if not ok:
        raise ConfigError(key, value, rule)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Settings of one ``gcache-server``."""

    listen: str = "127.0.0.1:7700"          # HOST:PORT of the TCP data plane
    memory: int = 1 * GiB                   # bytes of the shared-memory hot tier
    pin_share: float = 0.5                  # of the hot tier, the most pinned values (files)
                                            # may hold against eviction; 0 refuses them
    segment_size: int = 16 * MiB            # bytes per arena segment (the eviction unit)
    shm_name: str = ""                      # arena file name; "" means gcache-<port>
    arena_dir: str = "/dev/shm"             # where the arena file lives: a tmpfs; one mounted
                                            # with huge pages reads faster remotely (docs/rdma.md)
    io_size: int = 1 * MiB                  # bytes moved by one socket IO at most
    max_value_size: int = 1 * GiB           # bytes; larger values are refused
    lease_ttl_s: float = 5.0                # a read lease or pending write pins for this long
    unreachable_sweep_s: float = 10.0       # seconds between counts of the values that can no
                                            # longer hit (STAT's unreachable_bytes)
    max_connections: int = 1024             # concurrent authenticated client connections
    max_unauthenticated: int = 64           # connections yet to AUTH; the oldest goes first
    auth_timeout_s: float = 5.0             # seconds a connection has to authenticate
    io_timeout_s: float = 10.0              # seconds one IO may stall (at least lease_ttl_s)
    min_transfer_rate: int = 1 * MiB        # bytes/s a payload must arrive at, after a grace
                                            # of one IO timeout (none while room is short);
                                            # slower senders are cut off
    max_held_share: float = 0.5             # of the hot tier, the most one connection may hold
                                            # in leases, writes and payloads in flight
    prefault: bool = True                   # touch every arena page at start
    metrics_listen: str = ""                # HOST:PORT for Prometheus /metrics; "" is off
    unix_socket: str = ""                   # same-host socket path; "" is /tmp/<shm_name>.sock,
                                            # "off" disables the shared-memory transport
    token: str | None = None                # cluster token; without one, loopback only
    token_file: str = ""                    # a file holding the token (systemd credential,
                                            # Secret volume); read once at start
    disk_dir: str = ""                      # cold tier directory (NVMe); "" is no cold tier
    disk_capacity: int = 64 * GiB           # bytes the cold tier may use (oldest evicted first)
    disk_format: str = "segments"           # "segments" (files + RocksDB index) or "blobs"
    master: tuple[str, ...] = ()            # gRPC HOST:PORT of the masters; () is static mode
    advertise: str = ""                     # HOST:PORT clients reach; "" is the listen address
    heartbeat_interval_s: float = 1.0       # seconds between heartbeats to the master
    nixl: bool = True                       # offer the arena over NIXL when nixl-cu12 imports
    nixl_devices: tuple[str, ...] = ()      # UCX devices for NIXL (e.g. mlx5_0:1); () lets
                                            # UCX choose; ("auto",) every GPU's rail NIC
                                            # (``gcache topology``)
    nic_deny: tuple[str, ...] = ()          # NICs that never carry data (a front-end NIC)

    @property
    def pin_budget(self) -> int:
        """Bytes of the hot tier that spans holding pinned values may take."""
        return int(self.memory * self.pin_share)

    def __post_init__(self) -> None:
        _check("listen", self.listen, _is_address(self.listen), "must be HOST:PORT")
        _check("disk_capacity", self.disk_capacity, self.disk_capacity >= 1 * MiB,
               "must be at least 1MiB")
        _check("disk_format", self.disk_format, self.disk_format in ("segments", "blobs"),
               "must be segments or blobs")
        for address in self.master:
            _check("master", address, _is_address(address), "each must be HOST:PORT")
        _check_advertise(self.advertise, self.listen, handed_out=bool(self.master),
                         to="clients", as_what="this server's")
        _check("heartbeat_interval_s", self.heartbeat_interval_s, self.heartbeat_interval_s > 0,
               "must be positive")
        _check("segment_size", self.segment_size, self.segment_size >= 64 * KiB,
               "must be at least 64KiB")
        _check("memory", self.memory, self.memory >= 2 * self.segment_size,
               f"must hold at least two segments of {format_size(self.segment_size)}")
        _check("max_held_share", self.max_held_share, 0 < self.max_held_share <= 1,
               "must be above 0 and at most 1")
        _check("pin_share", self.pin_share, 0 <= self.pin_share <= 0.9,
               "must be between 0 and 0.9 (KV keeps the rest of the hot tier)")
        _check("io_size", self.io_size, 4 * KiB <= self.io_size <= 64 * MiB,
               "must be between 4KiB and 64MiB")
        _check("max_value_size", self.max_value_size, self.max_value_size >= 1, "must be positive")
        _check("lease_ttl_s", self.lease_ttl_s, self.lease_ttl_s > 0, "must be positive")
        _check("unreachable_sweep_s", self.unreachable_sweep_s, self.unreachable_sweep_s > 0,
               "must be positive")
        _check("max_connections", self.max_connections, self.max_connections >= 1,
               "must be positive")
        _check("max_unauthenticated", self.max_unauthenticated, self.max_unauthenticated >= 1,
               "must be positive")
        _check("auth_timeout_s", self.auth_timeout_s, self.auth_timeout_s > 0,
               "must be positive")
        _check("io_timeout_s", self.io_timeout_s, self.io_timeout_s > 0, "must be positive")
        _check("min_transfer_rate", self.min_transfer_rate, self.min_transfer_rate >= 1,
               "must be positive (bytes per second)")
        _check("arena_dir", self.arena_dir, os.path.isabs(self.arena_dir),
               "must be an absolute path (a tmpfs directory such as /dev/shm)")
        _check("shm_name", self.shm_name,
               self.shm_name == "" or bool(SHM_NAME_RULE.match(self.shm_name)), SHM_NAME_TEXT)
        _check("metrics_listen", self.metrics_listen,
               self.metrics_listen == "" or _is_address(self.metrics_listen),
               "must be HOST:PORT or empty")
        _check("token", "***", self.token is None or len(self.token) >= 16,
               "must be at least 16 characters")
        if self.token is None:
            for key, address in (("listen", self.listen), ("metrics_listen", self.metrics_listen)):
                _check(key, address, address == "" or _is_loopback(address),
                       "is not a loopback address; without a cluster token (--token, "
                       "GCACHE_TOKEN or the config file) a server listens on loopback only")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings of one SDK ``Client``."""

    servers: tuple[str, ...] = ()           # HOST:PORT of each data server (static membership)
    master: tuple[str, ...] = ()            # gRPC HOST:PORT of the masters (dynamic membership)
    map_refresh_s: float = 1.0              # seconds between cluster-map checks with a master
    timeout_s: float = 0.2                  # seconds one IO may take before it is a miss
    io_size: int = 1 * MiB                  # bytes moved by one socket IO at most
    io_threads: int = 4                     # SDK threads that do all network IO
    max_value_size: int = 1 * GiB           # bytes; larger values are refused before any IO
    group_width: int = DEFAULT_GROUP_WIDTH  # servers one placement group is striped over
                                            # (with masters, the map's value wins)
    suspect_s: float = 1.0                  # seconds a failed server is skipped (fast misses)
    verify_checksum: bool = True            # check xxh3_64 of every value read over TCP
    verify_arena_reads: bool = False        # and of values copied straight out of a server's
                                            # arena (shm, NIXL), which the server hashed at
                                            # COMMIT (docs/protocol.md, "Checksums")
    token: str | None = None                # cluster token, when the servers require one
    transport: str = "auto"                 # "auto": shm for same-host servers, NIXL where both
                                            # sides have it and this host an RDMA NIC, else
                                            # tcp; or "tcp", "shm", "nixl" forced
    transfers_in_flight: int = 8            # NIXL transfers this client runs at once
    nixl_devices: tuple[str, ...] = ()      # UCX devices for NIXL; () lets UCX choose (or,
                                            # with ``gpu``, that GPU's NIC)
    gpu: int = -1                           # the CUDA device this client serves: its NIC
                                            # (``gcache topology``) carries its NIXL transfers
                                            # and its NUMA node's CPUs run the IO threads
    nic_deny: tuple[str, ...] = ()          # NICs that never carry data (a front-end NIC)
    vnodes: int = DEFAULT_VNODES            # virtual nodes per server on the ring (with
                                            # masters, the map's value wins)
    cuda_staging_bytes: int = 1 * GiB       # pinned host memory for CUDA tensors on TCP links

    def __post_init__(self) -> None:
        for address in self.servers:
            _check("servers", address, _is_address(address), "each must be HOST:PORT")
        _check("servers", self.servers, len(set(self.servers)) == len(self.servers),
               "must not repeat an address")
        _check("timeout_s", self.timeout_s, self.timeout_s > 0, "must be positive")
        _check("io_size", self.io_size, 4 * KiB <= self.io_size <= 64 * MiB,
               "must be between 4KiB and 64MiB")
        _check("io_threads", self.io_threads, 1 <= self.io_threads <= 256,
               "must be between 1 and 256")
        _check("max_value_size", self.max_value_size, self.max_value_size >= 1, "must be positive")
        _check("group_width", self.group_width, self.group_width >= 1, "must be at least 1")
        _check("suspect_s", self.suspect_s, self.suspect_s >= 0, "must not be negative")
        _check("vnodes", self.vnodes, 1 <= self.vnodes <= 4096, "must be between 1 and 4096")
        _check("cuda_staging_bytes", self.cuda_staging_bytes,
               self.cuda_staging_bytes >= 64 * KiB, "must be at least 64KiB")
        _check("transport", self.transport, self.transport in ("auto", "tcp", "shm", "nixl"),
               "must be one of auto, tcp, shm, nixl")
        _check("gpu", self.gpu, self.gpu >= -1, "must be a CUDA device index, or -1 for none")
        _check("transfers_in_flight", self.transfers_in_flight,
               1 <= self.transfers_in_flight <= 1024, "must be between 1 and 1024")
        for address in self.master:
            _check("master", address, _is_address(address), "each must be HOST:PORT")
        _check("map_refresh_s", self.map_refresh_s, self.map_refresh_s > 0, "must be positive")


@dataclass(frozen=True, slots=True)
class MasterConfig:
    """Settings of one ``gcache-master``."""

    listen: str = "127.0.0.1:7600"          # HOST:PORT of the gRPC API
    raft: str = "127.0.0.1:7610"            # HOST:PORT this member's Raft traffic uses
    peers: tuple[str, ...] = ()             # Raft HOST:PORT of every member (self included)
    data_dir: str = ""                      # Raft journal and snapshots; required
    token: str | None = None                # cluster token; without one, loopback only
    token_file: str = ""                    # a file holding the token (systemd credential,
                                            # Secret volume); read once at start
    heartbeat_interval_s: float = 1.0       # how often servers beat
    suspect_beats: int = 3                  # missed beats before a server is suspect
    dead_timeout_s: float = 5.0             # seconds without a beat before a server is dead
    metrics_listen: str = ""                # HOST:PORT for Prometheus /metrics; "" is off
    advertise: str = ""                     # gRPC HOST:PORT the other members name to callers
                                            # as the leader's; "" is the listen address
    vnodes: int = DEFAULT_VNODES            # ring points per server, sent in the cluster map:
    group_width: int = DEFAULT_GROUP_WIDTH  # clients and draining servers place keys by them

    def __post_init__(self) -> None:
        _check("group_width", self.group_width, self.group_width >= 1, "must be at least 1")
        _check("vnodes", self.vnodes, 1 <= self.vnodes <= 4096, "must be between 1 and 4096")
        _check("metrics_listen", self.metrics_listen,
               self.metrics_listen == "" or _is_address(self.metrics_listen),
               "must be HOST:PORT or empty")
        for key in ("listen", "raft"):
            _check(key, getattr(self, key), _is_address(getattr(self, key)), "must be HOST:PORT")
        _check_advertise(self.advertise, self.listen, handed_out=bool(self.peers),
                         to="callers", as_what="the leader's")
        for address in self.peers:
            _check("peers", address, _is_address(address), "each must be HOST:PORT")
        _check("peers", self.peers, len(self.peers) in (0, 1, 3, 5),
               "must list 1, 3 or 5 members (or be empty for a single master)")
        _check("peers", self.peers, not self.peers or self.raft in self.peers,
               f"must include this member's raft address {self.raft}")
        _check("data_dir", self.data_dir, bool(self.data_dir), "is required")
        _check("token", "***", self.token is None or len(self.token) >= 16,
               "must be at least 16 characters")
        _check("heartbeat_interval_s", self.heartbeat_interval_s, self.heartbeat_interval_s > 0,
               "must be positive")
        _check("suspect_beats", self.suspect_beats, self.suspect_beats >= 1, "must be at least 1")
        _check("dead_timeout_s", self.dead_timeout_s,
               self.dead_timeout_s > self.suspect_beats * self.heartbeat_interval_s,
               "must exceed suspect_beats × heartbeat_interval_s")
        if self.token is None:
            for key in ("listen", "raft", "metrics_listen"):
                address = getattr(self, key)
                _check(key, address, address == "" or _is_loopback(address),
                       "is not a loopback address; without a cluster token (--token, "
                       "GCACHE_TOKEN or the config file) a master listens on loopback only")


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_advertise(advertise: str, listen: str, *, handed_out: bool, to: str,
                     as_what: str) -> None:
    """``advertise`` is HOST:PORT or empty, and set when ``listen`` is every address while
    others hand the address out (the masters' map, a follower's redirect)."""
    _check("advertise", advertise, not advertise or _is_address(advertise),
           "must be HOST:PORT or empty")
    _check("advertise", advertise, not (handed_out and not advertise and _is_wildcard(listen)),
           f"must name the HOST:PORT {to} reach: listen={listen} is every address, which "
           f"others would hand out as {as_what}")


def _is_wildcard(address: str) -> bool:
    """``0.0.0.0:P``, ``[::]:P``: listening on every address, reachable at none of its own."""
    host = address.rpartition(":")[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _is_address(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 <= int(port) <= 65535)

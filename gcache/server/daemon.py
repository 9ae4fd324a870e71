"""The running data server: listener, one thread per connection, lease reaper, shutdown.

Threads are named and every loop watches ``stop``; shutdown closes the listener, shuts every
client socket down (which wakes its handler), joins with a bound, and unlinks the arena.
A connection over ``max_connections`` is closed at once rather than queued, so overload shows up as
fast misses in the SDK and never as a stall. Connections that have not authenticated yet have slots
of their own (``max_unauthenticated``): when they are full the oldest of them is cut off, so
strangers that connect and stay silent can neither take the slots of authenticated clients nor keep
a legitimate newcomer from getting through its handshake. Same-host clients come in on the Unix
socket, where HELLO hands them the arena's descriptor; everything else about them is the same.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from typing import TYPE_CHECKING, NotRequired, TypedDict

from gcache.config import ServerConfig
from gcache.errors import GCacheError, TransportError
from gcache.frame import VERSION
from gcache.master_client import MasterClient, backoff_s
from gcache.placement import PlacedMap, Placement
from gcache.proto import master_pb2 as pb
from gcache.server.cold_store import ColdStore
from gcache.server.handler import ConnectionHandler
from gcache.server.handoff import Handoff
from gcache.server.huge_pages import huge_page_bytes, small_pages_reason
from gcache.server.membership import Membership, load_or_create_id
from gcache.server.mutable_keys import MutableKeys
from gcache.server.reclaim import Laggards
from gcache.server.tenant_follower import TenantFollower
from gcache.server.tenant_keys import visible
from gcache.server.tenant_stats import tenant_figures
from gcache.server.tenant_table import Tenants
from gcache.server.tier import HotTier
from gcache.server.tier_protocol import Tier, Upkeep
from gcache.server.tiered import TieredStore
from gcache.server.transfers import Transfers
from gcache.transport.shm import UnixListener, host_id
from gcache.transport.stream import StreamConnection
from gcache.transport.tcp import TcpListener

if TYPE_CHECKING:
    from gcache.server.nixl_offer import NixlFact
    from gcache.transport.nixl import NixlAgent

log = logging.getLogger(__name__)

MAP_CATCH_UP_ATTEMPTS = 12     # about 4 s of backoff for a lagging member to catch up


class HelloFacts(TypedDict):
    """What a HELLO reply tells a client about this server (as JSON)."""

    version: int
    host_id: str
    address: str
    unix_socket: str               # "" when off
    arena_bytes: int
    arena_id: str
    io_size: int
    max_value_size: int
    lease_ttl_ms: int
    parents: bool                  # takes FLAG_PARENT (a client sends it to no other server)
    prefetch: bool                 # takes PREFETCH (a client sends it to no other server)
    nixl: NotRequired[NixlFact]    # only when the arena is offered over NIXL


class DataServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        # the handlers' IO timeout (never under the lease TTL): a peer silent that long is gone
        self.listener = TcpListener(config.listen, io_size=config.io_size,
                                    unacknowledged_s=max(config.io_timeout_s, config.lease_ttl_s))
        self.address = self.listener.address
        port = self.address.rsplit(":", 1)[1]
        shm_name = config.shm_name or f"gcache-{port}"
        self.transfers = Transfers(config.min_transfer_rate)
        self.tenants = Tenants()           # from the masters (``tenant_follower``); none yet
        self.tier: Tier = open_tiers(config, shm_name, laggards=self.transfers,
                                     quotas=self.tenants)
        self._log_pages()
        self.unix_path = "" if config.unix_socket == "off" else (config.unix_socket
                                                                 or f"/tmp/{shm_name}.sock")
        self.unix_listener = (UnixListener(self.unix_path, io_size=config.io_size)
                              if self.unix_path else None)
        self.hello: HelloFacts = {
            "version": VERSION, "host_id": host_id(), "address": self.address,
            "unix_socket": self.unix_path, "arena_bytes": self.tier.arena.size_bytes,
            "arena_id": self.tier.arena.arena_id, "io_size": config.io_size,
            "max_value_size": config.max_value_size,
            "lease_ttl_ms": int(config.lease_ttl_s * 1000), "parents": True, "prefetch": True}
        self._nixl: NixlAgent | None = None
        if config.nixl:
            from gcache.server.nixl_offer import offer_arena
            offered = offer_arena(self.tier.arena, devices=config.nixl_devices,
                                  deny=config.nic_deny)
            if offered is not None:
                self._nixl, self.hello["nixl"] = offered
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: dict[StreamConnection, tuple[threading.Thread, ConnectionHandler]] = {}
        self._started_s = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._handoff: Handoff | None = None
        self.mutable = MutableKeys(None, self.tier.delete)
        self._map_epoch = -1
        self._disowning = threading.Lock()
        self.tenant_follower: TenantFollower | None = None
        self.membership = self._membership(shm_name) if config.master else None

    def start(self) -> None:
        """Take connections from now on (the arena and NIXL are ready: before this a client's
        connection is refused, a fast miss it retries) and start the background loops."""
        self.listener.listen()
        loops = [("gcache-accept-tcp", lambda: self._accept_loop(self.listener, None))]
        if isinstance(self.tier, Upkeep):
            upkeep = self.tier
            loops += [("gcache-reaper", lambda: self._reap_loop(upkeep)),
                      ("gcache-unreachable", lambda: self._sweep_loop(upkeep))]
        if (unix := self.unix_listener) is not None:
            unix.listen()
            loops.append(("gcache-accept-unix",
                          lambda: self._accept_loop(unix, self.tier.arena.fd)))
        for name, target in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        if self.membership is not None:
            self.membership.start()

    def _log_pages(self) -> None:
        """Say once whether the arena is on huge pages, and if not why: remote readers (NIXL,
        a NIC's translation entries) and copies pay per page, and the arena asked for huge
        pages (madvise) itself, so only the mount or the kernel can have refused them."""
        arena = self.tier.arena
        huge, resident = huge_page_bytes(arena.address)
        share = huge / resident if resident else 0.0
        if not resident or share >= 0.5:
            log.info("arena.pages path=%s huge_share=%.2f resident=%d", arena.path, share,
                     resident)
            return
        log.info("arena.pages path=%s huge_share=%.2f resident=%d small_pages=\"%s\": an "
                 "--arena-dir on a tmpfs mounted huge=within_size avoids them (docs/rdma.md)",
                 arena.path, share, resident, small_pages_reason(arena.path))

    def _membership(self, shm_name: str) -> Membership:
        places = [os.path.join(d, f"{shm_name}.id")
                  for d in (self.config.disk_dir, self.config.arena_dir) if d]
        server_id = load_or_create_id(places)
        self.mutable = MutableKeys(places[0].removesuffix(".id") + ".mutable", self.tier.delete)
        record = pb.Server(id=server_id, address=self.config.advertise or self.address,
                           host_id=host_id(), capacity_bytes=self.config.memory)
        link = MasterClient(self.config.master, token=self.config.token)
        self.tenant_follower = TenantFollower(self.tenants, self.tier, link)
        return Membership(link, record, interval_s=self.config.heartbeat_interval_s,
                          on_state=self._membership_changed, on_answer=self._master_answered,
                          on_tenants=self.tenant_follower.seen)

    def _master_answered(self, epoch: int, state: str) -> None:
        if state not in ("alive", "suspect"):
            self.mutable.out_of_map(state)
            return
        self.mutable.in_map(epoch)
        if epoch != self._map_epoch:
            self._map_epoch = epoch
            if self.mutable.count():
                threading.Thread(target=self._drop_disowned, args=(epoch,),
                                 name="gcache-disowned", daemon=True).start()

    def _drop_disowned(self, epoch: int) -> None:
        """After a map change to ``epoch``: delete the mutable keys another server owns now (a
        key put there next would be newer than ours, and could come back to us:
        ``mutable_keys``). Only by a map of that epoch or later: any member answers the map,
        and one that lags the leader by a few entries would still give a draining server its
        keys, so this server would drop the very keys the drain is handing it."""
        with self._disowning:                 # one pass at a time; a later change runs next
            try:
                cluster_map = self._map_at_least(epoch)
            except GCacheError as exc:
                log.warning("mutable_keys.no_map error=%s", exc)
                return
            if cluster_map is None:
                log.warning("mutable_keys.stale_map epoch<%d: nothing dropped", epoch)
                return
            placed = PlacedMap.of_map(cluster_map, Placement())
            assert self.membership is not None     # only membership's answers run this
            me = self.membership.record.id
            # placed as clients place them: by the key a tenant sees (``tenant_keys``)
            self.mutable.drop_unless(
                lambda key, group: placed.owner_id(visible(key), group) == me)

    def _map_at_least(self, epoch: int) -> pb.ClusterMap | None:
        """The masters' map once one of ``epoch`` or later answers (bounded); else None."""
        with MasterClient(self.config.master, token=self.config.token) as masters:
            for attempt in range(MAP_CATCH_UP_ATTEMPTS):
                cluster_map = masters.cluster_map()
                if cluster_map.epoch >= epoch:
                    return cluster_map
                time.sleep(backoff_s(attempt, base_s=0.05, cap_s=0.5))
        return None

    def _membership_changed(self, state: str) -> None:
        """A drain starts the handoff once; having left, the server stops (exit code 0)."""
        if state == "draining" and self._handoff is None:
            assert self.membership is not None     # membership's own callback
            link = MasterClient(self.config.master, token=self.config.token)
            self._handoff = Handoff(self.tier, link, self.membership.record.id, self.config,
                                    on_left=self.stop.set, mutable=self.mutable,
                                    tenants=self.tenants)
            self._handoff.start()

    def _accept_loop(self, listener: TcpListener | UnixListener, arena_fd: int | None) -> None:
        while not self.stop.is_set():
            try:
                conn = listener.accept(timeout_s=0.2)
            except TransportError as exc:
                if not self.stop.is_set():
                    log.error("server.accept_failed reason=%s", exc)
                    self.stop.wait(0.1)
                continue
            if conn is None:
                continue
            handler = ConnectionHandler(conn, self.tier, self.config,
                                        stat_extra=self._stat_extra,
                                        is_stopping=self.stop.is_set, hello=self.hello,
                                        arena_fd=arena_fd, mutable=self.mutable,
                                        transfers=self.transfers, tenants=self.tenants)
            with self._lock:
                waiting = [(h.opened_s, c) for c, (_, h) in self._conns.items()
                           if not h.authenticated]
                if len(self._conns) - len(waiting) >= self.config.max_connections:
                    log.warning("conn.refused peer=%s open=%d", conn.peer, len(self._conns))
                    conn.close()
                    continue
                if len(waiting) >= self.config.max_unauthenticated:
                    oldest = min(waiting, key=lambda w: w[0])[1]
                    log.warning("conn.unauthenticated_dropped peer=%s waiting=%d", oldest.peer,
                                len(waiting))
                    oldest.shutdown()            # its handler wakes and closes it
                    del self._conns[oldest]
                thread = threading.Thread(target=self._serve, args=(conn, handler),
                                          daemon=True, name=f"gcache-conn-{conn.peer}")
                self._conns[conn] = (thread, handler)
            thread.start()

    def _serve(self, conn: StreamConnection, handler: ConnectionHandler) -> None:
        try:
            handler.serve()
        finally:
            with self._lock:
                self._conns.pop(conn, None)

    def _reap_loop(self, tier: Upkeep) -> None:
        period_s = max(0.01, self.config.lease_ttl_s / 4)
        while not self.stop.wait(period_s * random.uniform(0.8, 1.2)):
            expired = tier.reap_expired()
            if expired:
                log.warning("lease.expired count=%d", expired)

    def _sweep_loop(self, tier: Upkeep) -> None:
        # A sweep reads every record that has a parent: at most one twentieth of a core, however
        # many there are (a sweep that took 1 s waits 20 s before the next).
        wait_s = self.config.unreachable_sweep_s
        while not self.stop.wait(wait_s * random.uniform(0.8, 1.2)):
            started_s = time.monotonic()
            try:
                tier.sweep_unreachable()
            except Exception:             # the thread's top level: log, keep counting
                log.exception("unreachable.sweep_failed")
            wait_s = max(self.config.unreachable_sweep_s, 20 * (time.monotonic() - started_s))

    def _stat_extra(self, tenant_id: int) -> dict[str, object]:
        """STAT's sections beside the tier's; a tenant's ``tenants`` has its own entry only."""
        with self._lock:
            connections = len(self._conns)
        extra: dict[str, object] = {
            "server": {"address": self.address, "connections": connections,
                       "uptime_s": round(time.monotonic() - self._started_s, 3),
                       "io_size": self.config.io_size,
                       "max_value_size": self.config.max_value_size,
                       "transfers_cut_off": self.transfers.cut_off}}
        tiers = self.tier.tier_stats() if isinstance(self.tier, Upkeep) else None
        if tiers is not None:
            extra["tiers"] = tiers
        extra["tenants"] = tenant_figures(self.tier, self.tenants,
                                          only=tenant_id if tenant_id else None)
        return extra

    def shutdown(self, *, join_s: float = 2.0) -> None:
        self.stop.set()
        if self.membership is not None:
            self.membership.stop()
        self.listener.close()
        if self.unix_listener is not None:
            self.unix_listener.close()
        with self._lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            conn.shutdown()
        deadline = time.monotonic() + join_s
        for thread in [t for _, (t, _h) in conns] + self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._nixl is not None:
            self._nixl.close()              # deregistered before the arena is unmapped
        self.mutable.close()
        self.tier.close(unlink=False)       # the arena outlives us: a restart re-attaches


def open_tiers(config: ServerConfig, shm_name: str, *,
               laggards: Laggards | None = None,
               quotas: Tenants | None = None) -> HotTier | TieredStore:
    """The hot tier alone, or with a cold tier in ``config.disk_dir`` behind it (``laggards``:
    the transfers a claim may cut off when room is short; ``quotas``: the tenants'). Raises
    ``ConfigError`` for a missing or unwritable directory."""
    if not config.disk_dir:
        return HotTier(name=shm_name, size_bytes=config.memory,
                       segment_size=config.segment_size, prefault=config.prefault,
                       lease_ttl_s=config.lease_ttl_s, arena_dir=config.arena_dir,
                       pin_budget_bytes=config.pin_budget, laggards=laggards, quotas=quotas)
    from gcache.server.cold_segments import check_disk_dir
    check_disk_dir(config.disk_dir)
    cold: ColdStore
    if config.disk_format == "blobs":
        from gcache.server.cold_blobs import BlobColdStore
        cold = BlobColdStore(os.path.join(config.disk_dir, "blobs"), config.disk_capacity)
    else:
        from gcache.server.cold_segments import SegmentColdStore
        os.makedirs(os.path.join(config.disk_dir, "segments"), exist_ok=True)
        cold = SegmentColdStore(os.path.join(config.disk_dir, "segments"), config.disk_capacity,
                                quotas=quotas)
    hot = HotTier(name=shm_name, size_bytes=config.memory, segment_size=config.segment_size,
                  prefault=config.prefault, lease_ttl_s=config.lease_ttl_s, cold_backed=True,
                  arena_dir=config.arena_dir, pin_budget_bytes=config.pin_budget,
                  laggards=laggards, quotas=quotas)
    segments = config.memory // config.segment_size
    # Two reusable segments at least: one for writers, one for second-chance re-appends.
    return TieredStore(hot, cold, headroom_segments=min(segments, max(2, segments // 4)))

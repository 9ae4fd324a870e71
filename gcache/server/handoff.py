"""Drain: hand every key this server holds to the key's owner in the map without it, then leave.

Started when a heartbeat answers that the server is draining (``gcache drain``). The map from
the masters already leaves this server out, so clients look each key up on its new owner from
the next map on; the handoff makes it be there. Each key is placed as clients place it: by its
own hash, or by the placement-group hash it was put with (kept in its record since the put), over
``group_width`` servers. Values go out as ordinary PUT frames with their checksum, so the owner
verifies them as any write. A key that could not be handed over (its owner down or full) is
counted and logged; the server leaves only when nothing failed, so an operator can drain again.
A tenant's key is placed by the key the tenant sees (``tenant_keys.visible``), as its clients
place it, and sent over a connection that acts as that tenant (the cluster token's AUTH for a
tenant, ``conn_auth``), so it lands in the tenant's own space there; a removed tenant's values
are not handed over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gcache.config import ServerConfig
from gcache.errors import GCacheError, NoSpace, Unavailable
from gcache.frame import (
    FLAG_CONTENT_ADDRESSED,
    FLAG_PINNED,
    HEADER_SIZE,
    Header,
    Op,
    Status,
    unpack_header,
)
from gcache.master_client import MasterClient, backoff_s
from gcache.placement import PlacedMap, Placement
from gcache.server.mutable_keys import MutableKeys
from gcache.server.tenant_keys import ADMIN, owner_of, visible
from gcache.server.tenant_table import Tenants
from gcache.server.tier_protocol import Listing, Tier
from gcache.transport.handshake import handshake
from gcache.transport.stream import StreamConnection
from gcache.transport.tcp import connect

log = logging.getLogger(__name__)

IO_TIMEOUT_S = 10.0
LEAVE_ATTEMPTS = 10


class Handoff(threading.Thread):
    def __init__(self, tier: Tier, link: MasterClient, server_id: str, config: ServerConfig, *,
                 on_left: Callable[[], None], mutable: MutableKeys,
                 tenants: Tenants | None = None) -> None:
        super().__init__(name="gcache-handoff", daemon=True)
        self.tier, self.link, self.server_id, self.config = tier, link, server_id, config
        self.on_left, self.mutable = on_left, mutable
        self.tenants = tenants or Tenants()
        self.moved = self.failed = self.dropped = 0
        self._conns: dict[tuple[str, int], StreamConnection] = {}

    def run(self) -> None:
        try:
            placed = PlacedMap.of_map(self.link.cluster_map(), Placement(),
                                      without=self.server_id)
            if not isinstance(self.tier, Listing):
                raise GCacheError("this tier cannot list its keys: nothing to hand off")
            keys = self.tier.keys_with_groups()
            log.info("handoff.start id=%s keys=%d servers=%d", self.server_id, len(keys),
                     len(placed.address_of))
            for request_id, (key, group) in enumerate(keys, 1):
                tenant = owner_of(key)
                if tenant != ADMIN and not self.tenants.exists(tenant):
                    self.dropped += 1              # a removed tenant's: nobody reads it
                    continue
                owner = placed.owner_id(visible(key), group)
                if owner is None or not self._push(placed.address_of[owner], key, group,
                                                   request_id):
                    self.failed += 1
            log.info("handoff.done id=%s moved=%d failed=%d dropped=%d", self.server_id,
                     self.moved, self.failed, self.dropped)
            if self.failed == 0:
                self._leave()
                self.on_left()
        except GCacheError as exc:
            log.error("handoff.failed id=%s error=%s", self.server_id, exc)
        except Exception:          # the thread's top level
            log.exception("handoff.crashed id=%s", self.server_id)
        finally:
            for conn in self._conns.values():
                conn.close()

    def _leave(self) -> None:
        """Tell the masters this server is done; retried through a master failover."""
        for attempt in range(LEAVE_ATTEMPTS):
            try:
                self.link.leave(self.server_id)
                return
            except Unavailable:
                if attempt == LEAVE_ATTEMPTS - 1:
                    raise
                time.sleep(backoff_s(attempt, base_s=0.5))

    def _push(self, address: str, key: bytes, group: int, request_id: int) -> bool:
        try:
            leased = self.tier.lease(key, expires=False)
        except NoSpace:
            return False      # on disk, no room to promote it now: the server must not leave
        if leased is None:
            # Gone since the snapshot: nothing to move. Still on disk (its read failed): a
            # failure, so the server does not leave without it.
            return not self.tier.exists(key)
        entry, view = leased.entry, leased.view()
        tenant = owner_of(key)
        try:
            conn = self._conn(address, tenant)
            # put as it was put here: a key put as mutable (or pinned) stays so on its new owner;
            # not its parent (FLAG_PARENT), which the new owner need not own
            flags = 0 if self.mutable.is_mutable(key) else FLAG_CONTENT_ADDRESSED
            flags |= FLAG_PINNED if entry.pinned else 0
            sent = visible(key)                  # the tenant's own key, in its own space there
            header = Header(Op.PUT, request_id & 0xFFFFFFFF, key_len=len(sent),
                            payload_len=len(view), group=group, checksum=entry.checksum,
                            flags=flags)
            conn.send((header.pack(), sent, view), timeout_s=IO_TIMEOUT_S)
            reply = unpack_header(conn.recv_exact(HEADER_SIZE, timeout_s=IO_TIMEOUT_S),
                                  max_payload=0)
            if reply.status != Status.OK:
                log.error("handoff.refused key=%r owner=%s status=%s", key[:64], address,
                          reply.status.name)
                return False
            self.moved += 1
            return True
        except GCacheError as exc:
            log.error("handoff.push_failed key=%r owner=%s error=%s", key[:64], address, exc)
            self._conns.pop((address, tenant), None)
            return False
        finally:
            view.release()
            leased.release()

    def _conn(self, address: str, tenant: int) -> StreamConnection:
        """A connection to ``address`` in ``tenant``'s space (the administrator's for 0)."""
        if (address, tenant) not in self._conns:
            conn = connect(address, timeout_s=IO_TIMEOUT_S, io_size=self.config.io_size)
            record = self.tenants.by_id(tenant)
            try:
                handshake(conn, IO_TIMEOUT_S, self.config.token,
                          as_tenant=record.name if record is not None else None)
            except BaseException:
                conn.close()
                raise
            self._conns[address, tenant] = conn
        return self._conns[address, tenant]

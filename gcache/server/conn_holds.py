"""The leases and writes one connection holds, and the arena bytes they hold.

A handle works only on the connection that obtained it (handles are not capabilities to pass
around), so each connection keeps its own ``Lease`` and ``Write`` objects by handle; whatever it
still holds when it goes is given back (``release_all``): a client that disconnects halfway
through a write leaves nothing visible and holds nothing.

The bytes a connection holds (outstanding ALLOCs, PUT payloads being received, LEASEs) are
capped at ``cap_bytes``: a hold past it is refused with NO_SPACE at once (a fast miss for the
client) instead of taking more of the arena, so one peer cannot hold the room every other client
needs, however its transfers trickle. A connection holding nothing may always take one hold of
any size the arena takes (a single large value must still be storable), and the cap never falls
below one IO.
"""

from __future__ import annotations

import logging

from gcache.errors import NoSpace
from gcache.frame import Status
from gcache.server.tier_protocol import Lease, Tier, Write

log = logging.getLogger(__name__)


class ConnectionHolds:
    def __init__(self, tier: Tier, cap_bytes: int, peer: str) -> None:
        self.tier, self.cap_bytes, self.peer = tier, cap_bytes, peer
        self.held_bytes = 0
        self._writes: dict[int, Write] = {}
        self._leases: dict[int, Lease] = {}

    def admits(self, n_bytes: int) -> bool:
        """Whether a new hold of ``n_bytes`` stays within the cap."""
        return self.held_bytes == 0 or self.held_bytes + n_bytes <= self.cap_bytes

    def claim(self, key: bytes, length: int, *, expires: bool, group: int, pinned: bool,
              parent: bytes) -> Write | None:
        """A write this connection now holds (``Tier.alloc``), or None: no room, or past the
        cap."""
        if not self.admits(length):
            log.warning("put.refused peer=%s bytes=%d held=%d: the connection's cap",
                        self.peer, length, self.held_bytes)
            return None
        try:
            write = self.tier.alloc(key, length, expires=expires, group=group, pinned=pinned,
                                    parent=parent)
        except NoSpace as exc:
            log.warning("put.no_space bytes=%d reason=%s", length, exc)
            return None
        self.add_write(write)
        return write

    def lease_key(self, key: bytes, *, expires: bool) -> Lease | Status:
        """A lease this connection now holds (``Tier.lease``), or the status a reader gets
        instead: NOT_FOUND when it is in no tier, NO_SPACE when it is on disk and memory has no
        room to promote it now, or the lease would take the connection past its cap."""
        try:
            lease = self.tier.lease(key, expires=expires)
        except NoSpace:
            return Status.NO_SPACE
        if lease is None:
            return Status.NOT_FOUND
        if not self.admits(lease.entry.length):
            lease.release()
            return Status.NO_SPACE
        self.add_lease(lease)
        return lease

    def give_back(self, lease: Lease) -> None:
        """End a lease the server took for its own transfer."""
        self.drop_lease(lease.handle)
        lease.release()

    def add_write(self, write: Write) -> None:
        self._writes[write.handle] = write
        self.held_bytes += write.entry.length

    def add_lease(self, lease: Lease) -> None:
        self._leases[lease.handle] = lease
        self.held_bytes += lease.entry.length

    def write(self, handle: int) -> Write | None:
        return self._writes.get(handle)

    def lease(self, handle: int) -> Lease | None:
        return self._leases.get(handle)

    def drop_write(self, handle: int) -> Write | None:
        """Forget a write (committed, refused, aborted or expired)."""
        write = self._writes.pop(handle, None)
        if write is not None:
            self.held_bytes -= write.entry.length
        return write

    def drop_lease(self, handle: int) -> Lease | None:
        lease = self._leases.pop(handle, None)
        if lease is not None:
            self.held_bytes -= lease.entry.length
        return lease

    def release_all(self) -> None:
        """Give back everything still held: leases released, writes aborted."""
        for lease in self._leases.values():
            lease.release()
        for write in self._writes.values():
            write.abort()
        self._leases.clear()
        self._writes.clear()
        self.held_bytes = 0

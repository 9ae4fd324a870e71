"""PREFETCH: bring keys from the cold tier into memory ahead of the read that will come.

A router that has just sent a request to an engine knows which KV pages the engine's scheduler
is about to look up; a page that sits on the cold tier costs that lookup a disk read and a
promotion on the request's critical path. PREFETCH moves that work ahead: for each key it asks
the tier (``Prefetches``) to promote the value into memory without leasing or returning it, so
it holds no arena room on anyone's behalf and the engine's lease finds it in memory.

A tier without a cold store has nothing to promote: its answer is whether the key is in memory.
A key hidden by ``mutable_keys`` (an older value than a put elsewhere) is absent, as EXISTS
says. The reply is one ``gcache.prefetched.Prefetched`` byte per key, in request order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gcache.frame import Header, Status
from gcache.prefetched import Prefetched

if TYPE_CHECKING:
    from gcache.server.handler import ConnectionHandler


@runtime_checkable
class Prefetches(Protocol):
    """A tier that can promote a key from a slower tier into memory without a lease."""

    def prefetch(self, key: bytes) -> Prefetched:
        """Have ``key`` in memory; what that took (never NOT_ASKED)."""


def prefetch(handler: ConnectionHandler, h: Header) -> None:
    keys = handler.read_keys(h)
    tier = handler.tier
    states = bytes(_one(handler, tier, key) for key in keys)
    handler.reply(h, Status.OK, payload=(states,), count=len(keys))


def _one(handler: ConnectionHandler, tier: object, key: bytes) -> int:
    if handler.mutable.hidden(key):
        return Prefetched.ABSENT
    if isinstance(tier, Prefetches):
        return tier.prefetch(key)
    return Prefetched.IN_MEMORY if handler.tier.exists(key) else Prefetched.ABSENT

"""The arena offered over NIXL: one agent registers it once at start, and the HELLO facts carry
the agent's metadata (base64) and the arena's address. Facts reach a client only in the reply
to a successful AUTH (or HELLO, on a server without a token), so a stranger never learns the
remote keys that would let it read or write the arena.

A server without ``nixl-cu12``, or whose agent fails to start (no UCX transport, a bad device
list), serves on without NIXL and says so once; clients then use TCP.
"""

from __future__ import annotations

import base64
import logging
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from gcache.server.arena import Arena
    from gcache.transport.nixl import NixlAgent

log = logging.getLogger(__name__)


class NixlFact(TypedDict):
    """The HELLO ``nixl`` fact: what a client needs to add the agent and address the arena."""

    metadata: str              # the agent's metadata, base64
    arena_address: int         # the arena's address in the server's memory


def offer_arena(arena: Arena, *, devices: tuple[str, ...],
                deny: tuple[str, ...]) -> tuple[NixlAgent, NixlFact] | None:
    """(agent, HELLO ``nixl`` fact) for ``arena``, or None when NIXL is not available.
    ``devices`` ("auto",) are the rail NICs of this host's GPUs, never a ``deny``-ed one."""
    from gcache.transport import nixl
    if not nixl.available():
        log.info("server.nixl off: nixl-cu12 is not installed")
        return None
    if devices == ("auto",):
        from gcache.transport.topology import rail_devices
        devices = rail_devices(deny=deny)
    try:
        agent = nixl.NixlAgent("server", devices=devices)
        address = arena.address
        agent.register(nixl.Region(address, arena.size_bytes))
        fact: NixlFact = {"metadata": base64.b64encode(agent.metadata()).decode(),
                          "arena_address": address}
    except Exception as exc:
        log.warning("server.nixl off: the NIXL agent did not start: %s", exc)
        return None
    log.info("server.nixl on agent=%s devices=%s", agent.name, ",".join(devices) or "ucx-default")
    return agent, fact

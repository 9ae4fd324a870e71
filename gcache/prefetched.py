"""What a PREFETCH did with each key: the byte a server answers per key, and what the SDK
reports for a key no server answered for.

A prefetch asks the server that owns a key to have it in memory before a read comes for it: a
value that sits on the cold tier is promoted (read from disk, checked, committed into the arena)
without being leased or returned, so the read that follows finds it in memory and pays no disk
read. One definition for the server (``gcache.server.prefetch_requests``) and the SDK
(``Client.prefetch``), so a byte on the wire cannot mean two things.
"""

from __future__ import annotations

import enum


class Prefetched(enum.IntEnum):
    ABSENT = 0         # in neither tier (or hidden: an older value than a put elsewhere)
    IN_MEMORY = 1      # already in memory: nothing to do
    PROMOTED = 2       # read from disk into memory by this prefetch
    NO_ROOM = 3        # on disk, but memory had no room for it within the wait
    NOT_ASKED = 255    # SDK only: no server answered for it (down, or one without PREFETCH)

    @property
    def in_memory(self) -> bool:
        """Whether a read right after finds the value in memory."""
        return self in (Prefetched.IN_MEMORY, Prefetched.PROMOTED)


WIRE = frozenset({Prefetched.ABSENT, Prefetched.IN_MEMORY, Prefetched.PROMOTED,
                  Prefetched.NO_ROOM})    # the bytes a server may answer

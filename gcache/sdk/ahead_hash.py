"""A host value's checksum, computed ahead of its copy into a server's memory.

A single put starts hashing while its ALLOC is in flight and stops as soon as the reply is
there (``until``); the copy then hashes what is left just before it moves each piece
(``through``). The round trip so costs no time of its own, and the rest of the hash stays
next to the copy: in cache over shared memory, and beside the pieces already in flight over
NIXL, where on an RDMA NIC the bytes move without this CPU. Hashing everything before the copy
would instead hold the first byte back by a whole pass over the value wherever the round trip
is shorter than that pass.
"""

from __future__ import annotations

from collections.abc import Callable

from gcache.keys import HASH_PIECE, checksum_stream


class AheadHash:
    """The xxh3 of ``value`` (a flat host buffer), fed in order; ``hashed`` bytes so far."""

    __slots__ = ("_hasher", "_value", "hashed", "length")

    def __init__(self, value: memoryview) -> None:
        self._value = value
        self._hasher = checksum_stream()
        self.length = len(value)
        self.hashed = 0

    def until(self, stop: Callable[[], bool]) -> None:
        """Hash a piece at a time until ``stop()`` says to, or to the end."""
        while self.hashed < self.length and not stop():
            self.through(self.hashed + HASH_PIECE)

    def through(self, end: int) -> None:
        """Hash the value up to byte ``end`` (a no-op where that is done already)."""
        end = min(end, self.length)
        while self.hashed < end:
            step = min(end, self.hashed + HASH_PIECE)
            self._hasher.update(self._value[self.hashed:step])
            self.hashed = step

    def digest(self) -> int:
        self.through(self.length)
        return self._hasher.intdigest()

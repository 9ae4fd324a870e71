"""How many times each key was put lately: a count-min sketch of puts that ages as the cache turns.

The eviction rule (``gcache.eviction.earns_second_chance``) gives a value one more pass when it
comes up for eviction unread but was put more than once lately: a value that was evicted and
put again is one that requests came back for after the cache had cycled past it (a document a
tenant asks about now and then, a tool loop's prefix after a slow tool), which a first-in
first-out log would drop again just before the next request. This sketch is the memory of those
puts, kept by the server's reclaim (``gcache.server.reclaim``, keyed by its index's hash) and by
the replay model (``gcache.kv.replay_model``, keyed by ``key_hash`` of its units), so both run
the rule over the same counts.

Invariants and why: ``ROWS`` rows of one-byte counters, each indexed by the key's 64-bit hash
times an odd constant of its own (multiplicative hashing: independent slots per row); a key's
count is the minimum over its rows, so it is never below the true count and exceeds it only when
the key collides with others in every row (four rows of at least 65,536 counters: a few in a
hundred million for a cache of thousands of objects). Counts saturate at 255. After
``REPUT_WINDOW`` cache-fulls of puts (the number of objects held when the window closes) every
counter is halved, so a key must keep being put to keep its passes: old popularity fades as
LFU's does in TinyLFU. ``spend`` takes one put back when a pass is granted on the strength of
the count, so one extra put buys one extra pass.
"""

from __future__ import annotations

ROWS = 4
MIN_WIDTH = 1 << 16        # counters per row, at least (collisions stay rare in small caches)
MAX_WIDTH = 1 << 22        # ... at most (4 MiB a row)
REPUT_WINDOW = 10          # puts, in cache-fulls of objects, between two halvings
_HALF = bytes(i >> 1 for i in range(256))
_U64 = (1 << 64) - 1
_MULTIPLIERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)


class PutSketch:
    def __init__(self, capacity_objects: int) -> None:
        """A sketch for a cache of about ``capacity_objects`` objects (it sizes the rows)."""
        width = min(MAX_WIDTH, max(MIN_WIDTH, 1 << (4 * max(1, capacity_objects)).bit_length()))
        self._bits = width.bit_length() - 1
        self._rows = [bytearray(width) for _ in range(ROWS)]
        self._since_halving = 0

    def _slots(self, key_hash: int) -> list[int]:
        # multiplicative hashing, one odd multiplier per row: the rows' slots are independent
        shift = 64 - self._bits
        return [((key_hash * m) & _U64) >> shift for m in _MULTIPLIERS]

    def add(self, key_hash: int, held_objects: int) -> None:
        """One put of the key hashed to ``key_hash`` (64 bits), with ``held_objects`` objects
        in the cache now (the window's measure)."""
        for row, slot in zip(self._rows, self._slots(key_hash)):
            if row[slot] < 255:
                row[slot] += 1
        self._since_halving += 1
        if self._since_halving >= REPUT_WINDOW * max(1, held_objects):
            for row in self._rows:
                row[:] = row.translate(_HALF)
            self._since_halving = 0

    def puts(self, key_hash: int) -> int:
        """The key's puts in the current window (never fewer than it had)."""
        return min(row[slot] for row, slot in zip(self._rows, self._slots(key_hash)))

    def spend(self, key_hash: int) -> None:
        """Take back one put (a pass was granted on it)."""
        for row, slot in zip(self._rows, self._slots(key_hash)):
            if row[slot]:
                row[slot] -= 1

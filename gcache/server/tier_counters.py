"""The hot tier's counters: what STAT's ``tier`` and the server's /metrics report of it.

Every field is a running total of events (a gauge is computed by the tier when asked). They are
changed under the tier's lock by the module that sees the event (the tier, ``reclaim``, the
demoter's side), and read together by ``HotTier.stats``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TierCounters:
    hits: int = 0
    misses: int = 0
    puts: int = 0
    deletes: int = 0
    checksum_failures: int = 0
    evicted_objects: int = 0
    evicted_segments: int = 0
    expired_pins: int = 0
    recovered_objects: int = 0
    demoted_objects: int = 0       # written to the cold tier on their way out of memory
    promoted_objects: int = 0      # read back from the cold tier into memory
    second_chances: int = 0        # re-appended instead of dropped or demoted: they were read
    # read values that got no second chance because this server no longer held their parent
    # (nothing below a missing page of a prefix can hit)
    unreachable_evicted: int = 0
    whole_hashes: int = 0          # commits that hashed the whole value at COMMIT (its pieces
                                   # were not announced in order as they landed)
    pin_waits_expired: int = 0     # claims whose wait for an older span's pins ran out
                                   # (they took a young span or were refused)

"""The eviction rule: which span gives up its room, and which of its values get a second chance.

One definition, called by the server's hot tier (``gcache.server.reclaim``, over the arena's
spans) and by the replay model (``gcache.kv.replay_model``, over its units), so that the model
replays what the server does. It is pure: functions over plain summaries, no memory, no clock.

The rule, in order of preference, for a claim that needs room:
1. **A free window** (nothing lives there).
2. **A span mostly made of values that can no longer hit** (at least half of it; their prefix
   is gone, so nothing can read them), the one with the largest share of such bytes. Only
   spans a sweep counted carry such bytes; a young span is never one.
3. **The oldest span**: the window whose newest occupant was claimed first.
4. **A young span** (a client committed a value in it within the last quarter arena of client
   commits), the one written least recently, and only when the caller allows it (``young_ok``):
   copies never take one, and a client's value takes one only when nothing older is left. A
   value acknowledged a moment before may be about to be read back by its writer.
A window touching a span that must not move (pinned by a lease or write, holding kept values,
or not yet on disk behind a cold tier) is never a candidate: the caller leaves it out.

Tenants' quotas come before all of that. Every span has one owner (a tenant, or the
administrator), and a window says whether it is all the claimant's own (``own``) and whether it
touches a span of another owner that has a quota and holds no more than it (``protected``:
never taken). Of the rest, a claimant at or over its quota takes its own spans first (its own
oldest values go, not anybody else's); then come spans of owners over their quota, or without
one (the memory beyond every quota is shared, and reclaimed from those over theirs first); a
claimant within its quota takes its own last. A claimant without a quota
(``claimant_over_quota`` None) is one of the sharers: its own spans and the others' surplus go
by the order above alike. The order above applies within each class; with no quotas at all
every window is in one class, and the rule is the one above, unchanged.

Second chances: a value read since it was written, whose prefix is still whole, is copied to
the young end instead of being dropped (once per read), so a prefix head that requests keep
reading stays while the pages nobody came back for go; a value whose parent is gone gets none.
One claim re-appends into at most ``rescue_bound`` extra segments (each re-append answers one
earlier read, so the work is bounded by reads over time; the cap bounds one claim's stall, and
a sweep of copies in a small arena must not turn the whole arena over within a moment).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

FREE = -1                    # the age of a window with nothing in it
NEVER_WRITTEN = -(1 << 62)   # the commit mark of a span no client committed into
YOUNG_SHARE = 4              # young: within the last 1/YOUNG_SHARE arena of client commits
RESCUE_SEGMENTS = 16         # most extra segments one claim reclaims for second chances ...
RESCUE_FRACTION = 16         # ... and at most this fraction of the arena's segments


class Candidate(NamedTuple):     # a tuple: a claim builds one per window, the model per step
    """A window a claim could reclaim: consecutive segments of the arena, or a model's unit."""

    start: int                   # the caller's handle (first segment, unit number)
    age: int                     # claim order of its newest occupant; FREE when empty
    last_write: int = NEVER_WRITTEN   # commit mark of the newest client value in it
    young: bool = False          # ``is_young`` of some member
    unreachable_bytes: int = 0   # bytes counted as unable to hit (0 when not counted)
    size_bytes: int = 0          # the window's bytes (the "mostly" threshold)
    protected: bool = False      # touches a span of another owner within its quota
    own: bool = True             # every span in it is the claimant's (a free window: vacuous)


def is_young(last_write: int, written_bytes: int, arena_bytes: int) -> bool:
    """Whether a span whose last client commit was at mark ``last_write`` (the running total
    of committed bytes then) is young now that ``written_bytes`` have been committed."""
    return written_bytes - last_write < arena_bytes // YOUNG_SHARE


def is_mostly_unreachable(candidate: Candidate) -> bool:
    return not candidate.young and candidate.unreachable_bytes >= candidate.size_bytes // 2 > 0


_OWN_STANDING = {True: 1, None: 2, False: 3}    # by ``claimant_over_quota``; others' surplus: 2


def _rank(candidate: Candidate, young_ok: bool,
          claimant_over_quota: bool | None) -> tuple[int, int, float] | None:
    """Lower goes first; None: not a victim for this claim."""
    _, age, last_write, young, unreachable, size, protected, own = candidate
    if age == FREE:
        return (0, 0, 0)
    if protected:
        return None
    standing = _OWN_STANDING[claimant_over_quota] if own else 2
    if young:
        return (standing, 3, last_write) if young_ok else None
    if unreachable and unreachable >= size // 2 > 0:      # ``is_mostly_unreachable``
        return (standing, 1, -unreachable / size)
    return (standing, 2, age)


def choose_victim(candidates: Iterable[Candidate], *, young_ok: bool,
                  claimant_over_quota: bool | None = None) -> Candidate | None:
    """The candidate the rule reclaims first (the earliest of equals), or None when none may
    go: every one is young and ``young_ok`` is false, or protected, or there are none.
    ``claimant_over_quota``: the claim would take its owner past its quota (None: the owner
    has no quota)."""
    best, best_rank = None, None
    for candidate in candidates:
        rank = _rank(candidate, young_ok, claimant_over_quota)
        if rank is None or (best_rank is not None and rank >= best_rank):
            continue
        best, best_rank = candidate, rank
        if rank[0] == 0:
            break                          # nothing beats a free window
    return best


def earns_second_chance(*, read: bool, reachable: bool) -> bool:
    """Whether an evicted value is re-appended at the young end instead of dropped: read since
    it was written, and its prefix still whole (its parent held)."""
    return read and reachable


def rescue_bound(segments: int) -> int:
    """Extra segments one claim may reclaim to re-append second chances, for an arena of
    ``segments`` segments."""
    return min(RESCUE_SEGMENTS, max(1, segments // RESCUE_FRACTION))

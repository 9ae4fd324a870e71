"""SWA store policies: at which page boundaries a save writes window tails.

Full-attention pages are always written; a window tail costs ``S·b_S·W`` bytes (for
MiMo-V2.5-Pro about three 512-token pages' worth of full-layer KV), so where tails go decides how
many prefixes a budget holds and where they can hit.

- ``tail``: only at the end of the saved sequence, the boundary the next turn of a conversation
  resumes from.
- ``checkpoint-K``: also every K pages, so a branch anywhere hits at most K pages back; costs
  a tail per K pages whether or not anything ever branches there.
- ``adaptive`` (ours): tails where they pay, at a density the budget can afford.
  * Always the end tail, and a tail at a *branch point*: the boundary up to which a save found
    pages already stored by another sequence while no tail made them a hit. Shared pages are
    evidence of reuse (a system prompt, a forked conversation), so this pays for a tail where a
    later request is likely to resume.
  * While the store is less than half full, a tail at every page: tails then cost no prefix,
    and a request can resume at any page, as full-layer storage allows.
  * Filling but not yet evicting: a checkpoint every 4 pages. Evicting: every 16 pages, since
    each tail then displaces about three pages, and sparse checkpoints keep the most prefixes
    while bounding how far back a first branch falls.
  On the conversation trace this is at or above the best fixed policy at every budget and never
  below full-layer storage (``gcache replay``; figures in the README), hence the default.
- ``full-layer``: the baseline, every layer of every page, no tails (what an L3 unaware of
  windows stores).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gcache.errors import ConfigError

DEFAULT_POLICY = "adaptive"
PRESSURE_HOLD_SAVES = 256      # saves that count as "under pressure" after an eviction is seen
ROOMY_FILL = 0.5               # below this fraction of its capacity a store is roomy


class Pressure(enum.Enum):
    ROOMY = "roomy"            # less than half full
    FILLING = "filling"        # fuller, but nothing evicted lately
    EVICTING = "evicting"      # evicted within the last PRESSURE_HOLD_SAVES saves


@dataclass(frozen=True, slots=True)
class StorePolicy:
    """Where a save writes window tails. Build with ``policy_from_name``."""

    name: str
    checkpoint_pages: int = 0      # K for checkpoint-K; 0 otherwise
    branch_points: bool = False    # adaptive: also a tail where shared pages end
    full_layer: bool = False       # baseline: page every layer, write no tails
    filling_checkpoint_pages: int = 0  # K while the store fills without evicting (0: as K)
    roomy_checkpoint_pages: int = 0    # K while the store is less than half full (0: as K)

    @property
    def reads_pressure(self) -> bool:
        return bool(self.filling_checkpoint_pages or self.roomy_checkpoint_pages)

    def tail_boundaries(self, n_pages: int, *, shared_pages: int, hit_pages: int,
                        pressure: Pressure = Pressure.EVICTING) -> list[int]:
        """Boundaries (in pages, ascending) whose tails a save of ``n_pages`` pages writes.

        ``shared_pages``: leading pages that were already stored before this save;
        ``hit_pages``: the safe boundary found before this save.
        """
        if self.full_layer or n_pages == 0:
            return []
        chosen = {n_pages}
        every = {Pressure.ROOMY: self.roomy_checkpoint_pages,
                 Pressure.FILLING: self.filling_checkpoint_pages}.get(pressure, 0) \
            or self.checkpoint_pages
        if every:
            chosen.update(range(every, n_pages, every))
        if self.branch_points and hit_pages < shared_pages <= n_pages and shared_pages > 0:
            chosen.add(shared_pages)
        return sorted(chosen)


def policy_from_name(name: str | StorePolicy) -> StorePolicy:
    """``tail``, ``checkpoint-K`` (K ≥ 1 pages), ``adaptive`` or ``full-layer``."""
    if isinstance(name, StorePolicy):
        return name
    if name == "tail":
        return StorePolicy("tail")
    if name == "adaptive":
        return StorePolicy("adaptive", checkpoint_pages=16, branch_points=True,
                           filling_checkpoint_pages=4, roomy_checkpoint_pages=1)
    if name == "full-layer":
        return StorePolicy("full-layer", full_layer=True)
    if name.startswith("checkpoint-") and name[len("checkpoint-"):].isdigit() \
            and int(name[len("checkpoint-"):]) >= 1:
        return StorePolicy(name, checkpoint_pages=int(name[len("checkpoint-"):]))
    raise ConfigError("policy", name, "must be tail, checkpoint-K (K >= 1 pages), adaptive "
                      "or full-layer")


class PressureGauge:
    """Turns a store's fill and eviction counter into the ``Pressure`` of the next saves.

    Evictions arrive in bursts (a server reclaims a whole segment at once), so one sighting
    holds for ``hold_saves`` saves instead of flipping the policy back and forth between them.
    """

    def __init__(self, hold_saves: int = PRESSURE_HOLD_SAVES) -> None:
        self.hold_saves = hold_saves
        self._evicted_seen = 0
        self._left = 0
        self._fill = 0.0

    def observe(self, *, evicted_total: int, used_bytes: int, capacity_bytes: int) -> None:
        """Report the store's eviction count so far and how full it is."""
        if evicted_total > self._evicted_seen:
            self._evicted_seen, self._left = evicted_total, self.hold_saves
        self._fill = used_bytes / capacity_bytes if capacity_bytes else 1.0

    def next_save(self) -> Pressure:
        """The pressure the save about to happen is under."""
        if self._left > 0:
            self._left -= 1
            return Pressure.EVICTING
        return Pressure.ROOMY if self._fill < ROOMY_FILL else Pressure.FILLING

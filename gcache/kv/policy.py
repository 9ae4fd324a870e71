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
  * While the store evicts nothing, a tail at every page: with room to spare, tails cost no
    prefix, and a request can then resume at any page, exactly as full-layer storage allows.
  * Under eviction pressure, a checkpoint only every 16 pages: each tail displaces about three
    pages, so sparse checkpoints keep the most prefixes while bounding how far back a first
    branch falls.
  On the conversation trace this is within 1% of the best fixed policy at every budget and
  never below full-layer storage (``gcache replay``; figures in the README), hence the default.
- ``full-layer``: the baseline, every layer of every page, no tails (what an L3 unaware of
  windows stores).
"""

from __future__ import annotations

from dataclasses import dataclass

from gcache.errors import ConfigError

DEFAULT_POLICY = "adaptive"
PRESSURE_HOLD_SAVES = 256      # saves that count as "under pressure" after an eviction is seen


@dataclass(frozen=True, slots=True)
class StorePolicy:
    """Where a save writes window tails. Build with ``policy_from_name``."""

    name: str
    checkpoint_pages: int = 0      # K for checkpoint-K; 0 otherwise
    branch_points: bool = False    # adaptive: also a tail where shared pages end
    full_layer: bool = False       # baseline: page every layer, write no tails
    roomy_checkpoint_pages: int = 0  # K while the store evicts nothing (0: always K)

    def tail_boundaries(self, n_pages: int, *, shared_pages: int, hit_pages: int,
                        under_pressure: bool = True) -> list[int]:
        """Boundaries (in pages, ascending) whose tails a save of ``n_pages`` pages writes.

        ``shared_pages``: leading pages that were already stored before this save;
        ``hit_pages``: the safe boundary found before this save.
        """
        if self.full_layer or n_pages == 0:
            return []
        chosen = {n_pages}
        every = self.checkpoint_pages
        if self.roomy_checkpoint_pages and not under_pressure:
            every = self.roomy_checkpoint_pages
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
                           roomy_checkpoint_pages=1)
    if name == "full-layer":
        return StorePolicy("full-layer", full_layer=True)
    if name.startswith("checkpoint-") and name[len("checkpoint-"):].isdigit() \
            and int(name[len("checkpoint-"):]) >= 1:
        return StorePolicy(name, checkpoint_pages=int(name[len("checkpoint-"):]))
    raise ConfigError("policy", name, "must be tail, checkpoint-K (K >= 1 pages), adaptive "
                      "or full-layer")


class PressureGauge:
    """Turns a store's eviction counter into "under pressure" for the next saves.

    Evictions arrive in bursts (a server reclaims a whole segment at once), so one sighting
    holds for ``hold_saves`` saves instead of flipping the policy back and forth between them.
    """

    def __init__(self, hold_saves: int = PRESSURE_HOLD_SAVES) -> None:
        self.hold_saves = hold_saves
        self._evicted_seen = 0
        self._left = 0

    def observe(self, evicted_total: int) -> None:
        """Report the store's eviction count so far."""
        if evicted_total > self._evicted_seen:
            self._evicted_seen, self._left = evicted_total, self.hold_saves

    def next_save(self) -> bool:
        """Whether the save about to happen is under pressure."""
        under = self._left > 0
        self._left = max(0, self._left - 1)
        return under

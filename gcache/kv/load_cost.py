"""Whether loading a hit from GCache beats recomputing it.

An L3 hit is worth loading only while moving its KV takes less time than the engine's prefill
of the same tokens; on a slow link, a loaded server or a small model it can take longer, and a
connector that loads anyway makes the request slower than a miss would have been. ``LoadCost``
keeps both estimates per token: the load's from the loads this engine actually did (an
exponentially weighted mean of seconds per token, so it follows a link that changes), the
recompute's from the engine's prefill throughput (``gcache_recompute_tokens_per_s``: measured
by the operator, e.g. from the engine's own time-to-first-token on a miss; 0 is unknown). A
load is skipped only when both are known and the load is the slower; unknown means load, since
the store cannot learn its own speed from loads it never makes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gcache.errors import ConfigError

WEIGHT = 0.2          # of the newest load in the mean: about the last five loads count
MIN_LOAD_TOKENS = 64  # a load this short is mostly round trips: no measure of the link


@dataclass(frozen=True, slots=True)
class LoadDecision:
    load: bool
    load_s: float | None         # estimated seconds to load the tokens; None: not measured yet
    recompute_s: float | None    # estimated seconds to recompute them; None: rate unknown


class LoadCost:
    """Thread-safe: loads finish on loader threads while the scheduler decides."""

    def __init__(self, recompute_tokens_per_s: float = 0.0) -> None:
        if recompute_tokens_per_s < 0:
            raise ConfigError("gcache_recompute_tokens_per_s", recompute_tokens_per_s,
                              "must be 0 (unknown) or positive")
        self.recompute_tokens_per_s = recompute_tokens_per_s
        self._lock = threading.Lock()
        self._load_s_per_token: float | None = None

    def observe(self, tokens: int, seconds: float) -> None:
        """A load of ``tokens`` took ``seconds``, start to last layer."""
        if tokens < MIN_LOAD_TOKENS or seconds <= 0:
            return
        sample = seconds / tokens
        with self._lock:
            mean = self._load_s_per_token
            self._load_s_per_token = sample if mean is None else \
                (1 - WEIGHT) * mean + WEIGHT * sample

    @property
    def load_s_per_token(self) -> float | None:
        with self._lock:
            return self._load_s_per_token

    def decide(self, tokens: int, *, recompute_tokens: int | None = None) -> LoadDecision:
        """Load ``tokens`` or recompute ``recompute_tokens`` (default the same: an engine that
        holds the head of the hit itself still fetches the whole hit, but computes only the
        rest)."""
        per_token = self.load_s_per_token
        load_s = None if per_token is None else per_token * tokens
        computed = tokens if recompute_tokens is None else recompute_tokens
        recompute_s = computed / self.recompute_tokens_per_s \
            if self.recompute_tokens_per_s > 0 else None
        slower = load_s is not None and recompute_s is not None and load_s > recompute_s
        return LoadDecision(not slower, load_s, recompute_s)

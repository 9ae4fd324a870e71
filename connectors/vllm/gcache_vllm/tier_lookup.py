"""Lookups of vLLM's offloading tiers answered without blocking the scheduler: asked keys are
probed in one batch per step, off the scheduler's thread, and answered on a later step.

vLLM's ``TieringOffloadingManager`` asks a secondary tier ``lookup(key)`` under its lock and
needs HIT, MISS or RETRY ("ask again next step") at once. A round trip to GCache there would
stall every request of the step, so a key not yet known answers RETRY and is queued; at the
step's end (``flush``) the queued keys of every request go out as one existence check (the SDK
sends one batch per server) on this module's thread, and the answers wait, per request, for
the next lookup. Every RETRY resolves: a probe that fails (a dead server, a timeout) answers
MISS for its keys. Answers are kept per request until the request finishes, so a request
deferred for other reasons does not probe again; ``forget`` turns an answer into MISS (a load
that failed must not be promoted again, or the scheduler would loop on it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from queue import Empty, Queue

log = logging.getLogger(f"vllm.{__name__}")

Probe = Callable[[Sequence[Hashable]], list[bool]]


class LookupBatcher:
    """Per request: keys asked, keys in flight, answers. Called under the tier's lock (vLLM's
    manager lock); the probe thread touches only the two queues."""

    def __init__(self, probe: Probe, *, name: str = "gcache-tier-lookup") -> None:
        self._probe = probe
        self._asked: dict[str, list[Hashable]] = {}
        self._in_flight: dict[str, set[Hashable]] = {}
        self._answers: dict[str, dict[Hashable, bool]] = {}
        self._work: Queue[tuple[str, list[Hashable]] | None] = Queue()
        self._results: Queue[tuple[str, list[Hashable], list[bool]]] = Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def answer(self, req_id: str, key: Hashable) -> bool | None:
        """True or False when known for this request; None (ask again next step) otherwise,
        with the key queued for the next ``flush``."""
        self._collect()
        known = self._answers.get(req_id, {}).get(key)
        if known is not None:
            return known
        if key not in self._in_flight.get(req_id, ()):
            asked = self._asked.setdefault(req_id, [])
            if key not in asked:
                asked.append(key)
        return None

    def flush(self) -> None:
        """Send every request's queued keys to the probe thread (one batch per request)."""
        self._collect()
        for req_id, keys in self._asked.items():
            self._in_flight.setdefault(req_id, set()).update(keys)
            self._work.put((req_id, keys))
        self._asked = {}

    def forget(self, req_id: str, keys: Sequence[Hashable]) -> None:
        """``keys`` are gone (a load of them failed): MISS from now on for this request."""
        answers = self._answers.setdefault(req_id, {})
        for key in keys:
            answers[key] = False

    def finished(self, req_id: str) -> None:
        """The request is done: its answers go (a probe still in flight is dropped on arrival)."""
        for table in (self._asked, self._in_flight, self._answers):
            table.pop(req_id, None)

    def pending(self) -> bool:
        """Whether some key waits for a flush or a probe (the engine must keep stepping)."""
        self._collect()
        return bool(self._asked) or any(self._in_flight.values())

    def close(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=30)

    def _collect(self) -> None:
        while True:
            try:
                req_id, keys, found = self._results.get_nowait()
            except Empty:
                return
            in_flight = self._in_flight.get(req_id)
            if in_flight is None:
                continue                                  # the request finished meanwhile
            in_flight.difference_update(keys)
            answers = self._answers.setdefault(req_id, {})
            for key, present in zip(keys, found):
                answers.setdefault(key, present)          # a forget() meanwhile wins

    def _serve(self) -> None:
        while True:
            task = self._work.get()
            if task is None:
                return
            req_id, keys = task
            try:
                found = list(self._probe(keys))
                if len(found) != len(keys):
                    raise RuntimeError(f"{len(found)} answers for {len(keys)} keys")
            except Exception:
                log.exception("gcache tier: lookup of %d keys for %s failed; answering MISS",
                              len(keys), req_id)
                found = [False] * len(keys)
            self._results.put((req_id, keys, found))

"""What a test run leaves in /dev/shm: the arenas and sidecars (and other shared memory) it made
and never removed. A run must leave /dev/shm as it found it.

Other suites may run beside this one (``make test``'s lanes), so a file counts as left behind
only when it was not there at the start, is open in no process, and is still there a moment
later (a neighbour that just stopped its server removes its files within that moment). An
arena's sidecar (``<arena>.key`` and the like) is read once at start and held open by nobody,
so it counts only when its arena is gone: beside a running neighbour's arena it is that
neighbour's, and an arena left behind is named itself.
"""

from __future__ import annotations

import os
import time

from gcache.cli.arenas import SIDECARS

SHM = "/dev/shm"
SETTLE_S = 3.0


def snapshot() -> set[str]:
    return set(os.listdir(SHM))


def _open_anywhere() -> set[str]:
    """Every /dev/shm file some process holds open (a file descriptor or a mapping)."""
    held: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(SHM + "/"):
                    held.add(target[len(SHM) + 1:].removesuffix(" (deleted)"))
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    if f" {SHM}/" in line:
                        held.add(line.split(f" {SHM}/", 1)[1].strip())
        except OSError:
            continue                  # gone meanwhile, or not ours to read
    return held


def left_behind(before: set[str], *, settle_s: float = SETTLE_S) -> list[str]:
    """The files created since ``before`` that nobody holds and nobody removed."""
    new = snapshot() - before
    if not new:
        return []
    time.sleep(settle_s)
    now = snapshot()
    return sorted(name for name in (new & now) - _open_anywhere()
                  if not _beside_an_arena(name, now))


def _beside_an_arena(name: str, present: set[str]) -> bool:
    """Whether ``name`` is a sidecar of an arena that is still there."""
    return any(name.endswith(suffix) and name[:-len(suffix)] in present for suffix in SIDECARS)

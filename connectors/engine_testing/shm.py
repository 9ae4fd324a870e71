"""Engines' files in ``/dev/shm``: whose they are, and what a test run leaves there.

vLLM and SGLang keep shared memory blocks (``psm_*``: Python's ``SharedMemory``; SGLang's
``sglang_*``, ``sgl_shm_*``) and POSIX named semaphores (``sem.*``: ``multiprocessing`` under
the spawn start method, whose ``sem.mp-*`` stay linked while in use) there. A process that
exits cleanly removes its own; one killed (a test's SIGKILL, a process group killed after a
grace period, a scheduler ended by SIGTERM) cannot, and neither can multiprocessing's resource
tracker when it dies in the same group. So the tests remove them, and only them: the files a
process group they started used (``GroupFiles``: the group's engine), once no live process
uses them, never a file that was there before. The engine shapes only (``ENGINE_FILES``): an
engine also maps GCache's arena, which its server owns.

A file is known by its inode, not its name: glibc creates a semaphore under a temporary name
(``sem.XXXXXX``) and links it to its real one, so ``/proc/PID/maps`` shows the temporary name
(deleted); a name-based match misses every semaphore (it did: SGLang's README test left a
``sem.mp-*`` behind each run).

``run_group`` runs a command (an engine) that way, start to end.
``assert_left_nothing`` is the suites' session check (their ``conftest.py``): engine files that
appeared during the run and that no process uses fail it, by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from typing import IO

SHM = "/dev/shm"
# vllm_offload_*.mmap: the CPU tier of vLLM's OffloadingConnector (GCacheTier sits under it)
ENGINE_FILES = ("psm_", "sem.", "sglang_", "sgl_shm_", "vllm_offload_")
SETTLE_S = 5.0          # a killed group's processes finish exiting, a resource tracker unlinks


def names() -> set[str]:
    return set(os.listdir(SHM))


def _inodes(shm_names: Iterable[str]) -> dict[int, str]:
    out = {}
    for name in shm_names:
        try:
            out[os.stat(os.path.join(SHM, name)).st_ino] = name
        except OSError:
            pass                                   # removed meanwhile
    return out


def _pids(pgid: int | None = None) -> list[int]:
    """Every live process, or those of process group ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        if pgid is not None:
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[2]) != pgid:  # pgrp
                        continue
            except (OSError, IndexError, ValueError):
                continue                           # gone meanwhile
        out.append(int(entry))
    return out


def _used_inodes(pids: Iterable[int]) -> set[int]:
    """Inodes of /dev/shm files the processes map or hold open."""
    shm_dev = os.stat(SHM).st_dev
    used: set[int] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[5].startswith(SHM + "/"):
                        used.add(int(fields[4]))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.st_dev == shm_dev:
                    used.add(target.st_ino)
        except (OSError, ValueError):
            continue                               # gone meanwhile, or not ours to read
    return used


def is_engine_file(name: str) -> bool:
    return name.startswith(ENGINE_FILES)


def unused(shm_names: Iterable[str]) -> set[str]:
    """Those of ``shm_names`` that exist and that no live process maps or holds open."""
    inodes = _inodes(shm_names)
    return set(inodes.values()) - {inodes[i] for i in _used_inodes(_pids()) if i in inodes}


class GroupFiles:
    """The engine files in /dev/shm that the processes of process group ``pgid`` use (an
    engine started in a session of its own), gathered by ``collect`` while it runs; ``remove``
    unlinks those no process uses once the group is gone, except files in ``before`` (the
    names there before the engine started: ``names()``)."""

    def __init__(self, pgid: int, before: set[str]) -> None:
        self.pgid, self.before = pgid, before
        self.seen: set[str] = set()

    def collect(self) -> None:
        inodes = _inodes(n for n in names() if is_engine_file(n))
        self.seen.update(inodes[i] for i in _used_inodes(_pids(self.pgid)) if i in inodes)

    def kill(self) -> None:
        """SIGKILL what is left of the group, once its files are collected. A SIGTERM would
        add nothing: SGLang's launch_server takes its scheduler's death by the signal for a
        crash and sleeps 5 s, and the same files are left."""
        self.collect()
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def end(self, proc: subprocess.Popen) -> list[str]:
        """Kill the group (``proc`` leads it; it may be gone already) at once and ``remove``
        its files."""
        self.kill()
        proc.wait(timeout=30)
        return self.remove()

    def remove(self) -> list[str]:
        """Unlink the group's files that outlived it; returns their names."""
        deadline = time.monotonic() + SETTLE_S
        while _pids(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)                        # a killed group's last processes exiting
        removed = []
        for name in sorted(unused(self.seen - self.before)):
            try:
                os.unlink(os.path.join(SHM, name))
                removed.append(name)
            except FileNotFoundError:
                pass
        return removed


def run_group(args: list[str], *, stdout: IO[bytes] | IO[str], env: dict[str, str],
              timeout_s: float) -> int:
    """Run ``args`` in a session of its own (an engine, its workers) to its end; returns its
    exit status. Whatever of the group is left when it ends or times out (``TimeoutExpired``)
    is killed, and the engine files it used (seen every 2 s while it runs) are removed once no
    process uses them: an engine that crashes or is killed leaves its own."""
    before = names()
    proc = subprocess.Popen(args, stdout=stdout, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    files = GroupFiles(proc.pid, before)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                return proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                files.collect()
                if time.monotonic() > deadline:
                    raise
    finally:
        files.end(proc)


def leftovers(before: set[str]) -> set[str]:
    """Engine files that appeared since ``before`` and that no process uses, after giving
    exiting processes ``SETTLE_S`` to remove their own."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        left = unused(n for n in names() - before if is_engine_file(n))
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def assert_left_nothing(before: set[str]) -> None:
    """Raises ``AssertionError`` naming the ``leftovers`` since ``before``."""
    left = leftovers(before)
    assert not left, (f"this test run left in {SHM}: {', '.join(sorted(left))} (engine files "
                      "that appeared during the run and that no process uses: an engine it "
                      "started did not remove them, or a suite running beside it)")


"""``engine_testing.shm`` on a real killed process group: what an engine killed with its
resource tracker leaves in /dev/shm (a ``SharedMemory`` block and a spawn-context semaphore) is
what the session check names, and what ``GroupFiles`` removes; a file that was there before the
group started is never removed, even one the group used and no process uses any more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from multiprocessing import shared_memory

from engine_testing import shm

CHILD = """
import multiprocessing, sys, time
from multiprocessing import shared_memory
older = shared_memory.SharedMemory(name=sys.argv[1])
lock = multiprocessing.get_context("spawn").Lock()     # sem.mp-*, linked while in use
block = shared_memory.SharedMemory(create=True, size=4096)
print(block.name, flush=True)
time.sleep(120)
"""


def test_what_a_killed_group_leaves_is_named_then_removed_and_older_files_are_kept():
    older = shared_memory.SharedMemory(create=True, size=4096)
    older.close()                                    # there before, and nobody's now
    try:
        before = shm.names()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, older.name],
                                stdout=subprocess.PIPE, start_new_session=True, text=True)
        files = shm.GroupFiles(proc.pid, before)
        try:
            block = proc.stdout.readline().strip()
            files.collect()
            new = shm.names() - before
            assert block in new and any(n.startswith("sem.mp-") for n in new), new
            assert files.seen == new | {older.name}  # the semaphore too: known by inode
        finally:
            os.killpg(proc.pid, signal.SIGKILL)      # with its resource tracker
            proc.wait(timeout=30)
            proc.stdout.close()
        assert shm.leftovers(before) == new          # what the session check names
        assert sorted(files.remove()) == sorted(new)
        assert not shm.leftovers(before)
        assert older.name in shm.names()
    finally:
        older.unlink()

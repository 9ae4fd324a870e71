"""``engine_testing.forkserver`` with real forked children: each run is its engine's own
process (``python SCRIPT`` or ``python -m MODULE``: its arguments, environment, ``__main__``, a
session of its own, its output in its log, its exit status), the server's imports stay out of a
reply, children overlap, a run past its time is killed with its group, and what a killed run
left in /dev/shm is removed."""

from __future__ import annotations

import os
import pathlib

import pytest
from engine_testing import shm
from engine_testing.forkserver import Forkserver

SCRIPT = """
import os, sys
from multiprocessing import shared_memory
print("argv", sys.argv[1:], "env", os.environ.get("FORKED_VALUE"), "main", __name__,
      "leader", os.getpgrp() == os.getpid(), flush=True)
if sys.argv[1] == "hang":
    block = shared_memory.SharedMemory(create=True, size=4096)
    print(block.name, flush=True)
    import time
    time.sleep(120)
sys.exit(int(sys.argv[1]))
"""

NOISY_IMPORT = 'print("an import that prints")\n'


@pytest.fixture
def server(tmp_path):
    (tmp_path / "noisy_import.py").write_text(NOISY_IMPORT)
    (tmp_path / "child.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), str(pathlib.Path(__file__).resolve().parents[2])]))
    started = Forkserver(["noisy_import", "json"], env=env, log=tmp_path / "server.log")
    yield started
    started.close()
    assert "an import that prints" in (tmp_path / "server.log").read_text()


def test_each_run_is_its_engines_own_process_with_its_status(server, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    for status, argv in ((0, [str(tmp_path / "child.py"), "0"]), (3, ["-m", "child", "3"])):
        log = tmp_path / f"run-{status}.log"
        env["FORKED_VALUE"] = f"value-{status}"
        assert server.run(argv, env=env, log=log, timeout_s=60) == status
        assert (f"argv ['{status}'] env value-{status} main __main__ leader True"
                in log.read_text())


def test_children_overlap_and_a_run_past_its_time_is_killed_and_its_files_removed(
        server, tmp_path):
    script = str(tmp_path / "child.py")
    before = shm.names()
    alive = server.start([script, "hang"], env=dict(os.environ), log=tmp_path / "alive.log")
    assert alive.poll() is None
    with pytest.raises(TimeoutError):
        server.run([script, "hang"], env=dict(os.environ), log=tmp_path / "hang.log",
                   timeout_s=3)
    block = (tmp_path / "hang.log").read_text().splitlines()[1]
    assert block.startswith("psm_") and block not in shm.names()
    assert alive.poll() is None                      # the other child is untouched
    alive_block = (tmp_path / "alive.log").read_text().splitlines()[1]
    assert shm.GroupFiles(alive.pid, before).end(alive) == [alive_block]
    assert alive.poll() == -9                        # SIGKILLed with its group
    assert not shm.leftovers(before)
    # the server goes on serving after killed runs
    assert server.run([script, "0"], env=dict(os.environ), log=tmp_path / "after.log",
                      timeout_s=60) == 0

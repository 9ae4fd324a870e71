"""The NIXL agent as a process holds it: idle, it costs no CPU (UCX's progress thread waits for
events instead of polling flat out)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gcache.transport import nixl

pytestmark = pytest.mark.skipif(not nixl.available(), reason="nixl-cu12 is not installed")

IDLE = """
import os, time
from gcache.transport.nixl import NixlAgent, Region
import numpy as np
agent = NixlAgent("idle")
memory = np.zeros(1 << 20, dtype=np.uint8)
agent.register(Region(memory.ctypes.data, memory.nbytes), owner=memory)
agent.metadata()
time.sleep(0.5)                       # past start-up
before, began = os.times(), time.monotonic()
time.sleep(2.0)
after, ended = os.times(), time.monotonic()
busy = (after.user - before.user) + (after.system - before.system)
print(f"{busy / (ended - began):.3f}")
"""


def test_an_idle_agent_costs_no_cpu():
    # nixl_agent's own config fixes the progress thread's delay at 0: a busy loop that took a
    # whole core per process (on two cores, the server's and the client's took both).
    done = subprocess.run([sys.executable, "-c", IDLE], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    share = float(done.stdout.strip().splitlines()[-1])
    assert share < 0.25, f"an idle NIXL agent used {share:.0%} of a core"


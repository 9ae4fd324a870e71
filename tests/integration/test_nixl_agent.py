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



def test_a_peer_that_does_not_answer_stalls_neither_transfers_nor_close(monkeypatch):
    """Adding a peer whose NIXL address does not answer takes a kernel connect timeout inside
    NIXL (minutes): meanwhile the agent's other transfers find their regions at once, and the
    client's close gives up on the agent after ``CLOSE_WAIT_S``. The stuck add is injected by
    holding NIXL's own add call (no peer here can be made not to answer)."""
    import threading
    import time

    import numpy as np

    from gcache.sdk import nixl_peers
    from gcache.sdk.nixl_peers import NixlPeers

    peers = NixlPeers(io_size=1 << 20, timeout_s=1.0, in_flight=2, devices=(),
                      staging=lambda: None)
    memory = np.zeros(1 << 20, dtype=np.uint8)
    peers.register(memory)
    agent, _ = peers._started()
    release = threading.Event()
    real_add = agent._agent.add_remote_agent

    def unanswered(metadata):
        release.wait(60)
        return real_add(metadata)

    monkeypatch.setattr(agent._agent, "add_remote_agent", unanswered)
    real_close = agent.close
    monkeypatch.setattr(agent, "close", lambda: (release.wait(60), real_close()))
    monkeypatch.setattr(nixl_peers, "CLOSE_WAIT_S", 0.5)
    peer = nixl.NixlAgent("peer")
    adding = threading.Thread(target=agent.add_remote, args=(peer.metadata(),), daemon=True)
    adding.start()
    started = time.monotonic()
    assert agent.covering(memory.ctypes.data, memory.nbytes) is not None
    assert time.monotonic() - started < 0.5
    started = time.monotonic()
    peers.close()
    assert time.monotonic() - started < 3.0
    release.set()
    adding.join(10)
    peer.close()

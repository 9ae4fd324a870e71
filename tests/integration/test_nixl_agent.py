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


def test_pinned_staging_buffers_are_registered_while_the_pool_holds_them(cluster_factory):
    # What the vLLM connector's staging does on a GPU host (pin=True there): every buffer the
    # pool makes is registered with the client, so NIXL moves from and to it directly; one the
    # pool drops to make room is unregistered.
    torch = pytest.importorskip("torch")
    from gcache.sdk import Client
    from gcache.transport.pinned import PinnedPool

    cluster = cluster_factory(1, server_args=("--nixl",))
    with Client(cluster.addresses, transport="nixl", timeout_s=5.0) as client:
        pool = PinnedPool(pin=False, cap_bytes=4 << 20, on_new=client.register_buffer,
                          on_drop=client.unregister_buffer)
        value = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8)
        assert client.put("warm", value)                     # the agent exists from here
        before = client.stats()["nixl_regions"]
        staged = pool.take(1 << 20)
        staged.copy_(value)
        assert client.stats()["nixl_regions"] == before + 1
        assert client.put("staged", staged)
        landing = pool.take(1 << 20)
        assert client.get_into("staged", landing) == 1 << 20 and torch.equal(landing, value)
        assert client.stats()["nixl_regions"] == before + 2
        pool.give(staged)
        pool.give(landing)
        big = pool.take(3 << 20)          # a 4 MiB buffer: under the cap only if both go
        assert client.stats()["nixl_regions"] == before + 1   # two dropped, one made
        assert client.get_into("staged", big[:1 << 20]) == 1 << 20
        assert client.stats()["misses_by_reason"] == {}

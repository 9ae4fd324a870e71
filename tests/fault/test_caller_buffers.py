"""Once a batch read into the caller's buffers has returned, the SDK neither writes into them nor
keeps a view of them, whatever happened to the servers meanwhile.

An engine lends the SDK its own memory (vLLM's CPU offload tier, SGLang's host pool) and reuses a
buffer for other KV as soon as the call returns: a receive that landed later would be wrong KV,
and a view kept alive (an exception's traceback in a log record that a handler keeps) stops the
engine from unmapping that memory at shutdown.
"""

from __future__ import annotations

import logging
import mmap
import os
import signal
import threading

import pytest

from gcache import Client
from tests.fault.test_server_death import SETUP_TIMEOUT_S, process_state
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)
VALUE = 64 << 10


def _warm(client: Client, keys: list[str]) -> None:
    """Links to every server, held in the pool: the fault then strikes a batch mid-exchange,
    not its connect."""
    scratch = [bytearray(VALUE) for _ in keys]
    assert client.batch_get_into(keys, scratch) == [VALUE] * len(keys)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_failed_batch_read_keeps_no_view_of_the_callers_memory(cluster_factory, caplog,
                                                                 transport, fault):
    cluster = cluster_factory(2)
    keys = [f"held/{i}" for i in range(16)]
    with Client(cluster.addresses, timeout_s=SETUP_TIMEOUT_S) as setup:
        assert all(setup.batch_put(keys, [bytes([i + 1]) * VALUE for i in range(16)]))
    caplog.set_level(logging.WARNING, logger="gcache")       # records kept, as a handler may
    memory = mmap.mmap(-1, len(keys) * VALUE)                 # the engine's own, mapped memory
    pid = cluster.servers[0].pid
    assert pid is not None
    with Client(cluster.addresses, timeout_s=0.3, transport=transport) as client:
        _warm(client, keys)
        if fault == "kill":
            cluster.kill(0)
        else:
            os.kill(pid, signal.SIGSTOP)
            wait_until(lambda: process_state(pid) == "T", timeout_s=5)
        try:
            whole = memoryview(memory)
            outs = [whole[i * VALUE:(i + 1) * VALUE] for i in range(len(keys))]
            got = client.batch_get_into(keys, outs)
            assert None in got and VALUE in got                  # one server failed, one served
            assert any(r.getMessage().startswith("sdk.miss") for r in caplog.records)
            for view in [*outs, whole]:
                view.release()
            memory.close()          # BufferError while anything still holds a view of it
        finally:
            if fault == "stop":
                os.kill(pid, signal.SIGCONT)


def _stop_mid_receive(cluster, keys: list[str],
                      outs: list[bytearray]) -> tuple[list, list[bytes]] | None:
    """A batch read over TCP with the server stopped once the first bytes of its reply have
    landed: what it returned and the buffers as they were then, before the server resumed;
    None when the whole reply had landed before the stop took (a busy machine). The server
    is running again on return."""
    pid = cluster.servers[0].pid
    assert pid is not None
    got: list[int | None] = []
    with Client(cluster.addresses, timeout_s=0.5, transport="tcp") as client:
        assert client.exists(keys[0])                           # connected before the read
        reader = threading.Thread(target=lambda: got.extend(client.batch_get_into(keys, outs)))
        reader.start()
        try:
            wait_until(lambda: outs[0][0] != 0 or not reader.is_alive(), timeout_s=30,
                       period_s=0.0005)
            os.kill(pid, signal.SIGSTOP)
            reader.join(timeout=30)
            assert not reader.is_alive()
            returned = [bytes(out) for out in outs]
        finally:
            os.kill(pid, signal.SIGCONT)
    return (got, returned) if outs[0][0] != 0 and not any(outs[-1]) else None


def test_a_batch_read_that_timed_out_mid_receive_writes_nothing_after_it_returned(
        cluster_factory):
    """Over TCP the values arrive straight into the caller's buffers. The server is stopped
    once the reply has begun to land, so the receive stalls part-way; the call returns its
    misses after the IO timeout. Then the server resumes and would send the rest: none of it
    may reach the buffers (the link was closed when the call gave up). Over shared memory a
    read's copy is local to the client and has nothing to stall on."""
    cluster = cluster_factory(1, memory="256MiB")
    n, size = 16, 4 << 20            # 64 MiB in one reply: far more than the sockets buffer
    keys = [f"late/{i}" for i in range(n)]
    with Client(cluster.addresses, timeout_s=SETUP_TIMEOUT_S) as setup:
        for i, key in enumerate(keys):
            assert setup.put(key, bytes([0xA0 + i]) * size)
    for _ in range(3):                                          # bounded: tries of a race
        outs = [bytearray(size) for _ in keys]
        stalled = _stop_mid_receive(cluster, keys, outs)
        if stalled is not None:
            break
    assert stalled is not None, "the stop never landed mid-receive in 3 tries"
    got, returned = stalled
    assert got == [None] * n                                    # the request timed out
    with Client(cluster.addresses, timeout_s=SETUP_TIMEOUT_S) as probe:
        # it runs again, and had its chance to send the rest of that reply (to a closed socket)
        wait_until(lambda: probe.get(keys[-1]) == bytes([0xA0 + n - 1]) * size, timeout_s=10)
    assert [bytes(out) for out in outs] == returned

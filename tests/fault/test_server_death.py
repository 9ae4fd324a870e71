"""A dead server is a fast miss, never an exception or a stall."""

import time

from gcache import Client
from gcache.placement import Ring
from tests.helpers import sdk_metric, wait_until

TIMEOUT_S = 0.2
# What the tests set up and what they read back from a live server goes through a client with a
# test's timeout, or is retried: 0.2 s is the contract for a dead server, and the two cores also
# run engines beside this suite (a live server's reply took longer once, and the set-up failed).
SETUP_TIMEOUT_S = 5.0


def process_state(pid: int) -> str:
    """The one-letter state in /proc/PID/stat (T once a SIGSTOP has taken effect)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def keys_owned_by(address: str, servers: list[str], n: int) -> list[str]:
    ring = Ring.uniform(servers)
    keys = (f"death/{i}" for i in range(100_000))
    return [k for k in keys if ring.owner(k.encode()) == address][:n]


def test_killed_server_turns_into_misses_within_two_timeouts(cluster_factory):
    cluster = cluster_factory(2, memory="64MiB")
    servers = cluster.addresses
    doomed = keys_owned_by(servers[0], servers, 20)
    alive = keys_owned_by(servers[1], servers, 20)
    with Client(servers, timeout_s=SETUP_TIMEOUT_S) as setup:
        assert all(setup.batch_put(doomed + alive, [b"x" * 4096] * 40))
    with Client(servers, timeout_s=TIMEOUT_S) as client:
        before = sdk_metric("gcache_sdk_misses_total")
        cluster.kill(0)
        for key in doomed:
            start = time.monotonic()
            assert client.get(key) is None                    # a miss, not an exception
            assert time.monotonic() - start < 2 * TIMEOUT_S
        # the other server is untouched (retried: a slow reply is a miss and a short suspicion)
        wait_until(lambda: client.batch_get(alive) == [b"x" * 4096] * 20, timeout_s=10)
        assert client.batch_get(doomed) == [None] * 20
        assert client.put(doomed[0], b"y") is False
        assert client.exists(doomed[0]) is False
        assert sdk_metric("gcache_sdk_misses_total") >= before + 20
        assert servers[0] in client.stats()["suspect_servers"]


def test_a_restarted_server_is_used_again_after_the_suspect_window(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")
    with Client(cluster.addresses, timeout_s=TIMEOUT_S, suspect_s=0.3) as client:
        wait_until(lambda: client.put("k", b"v"), timeout_s=10)
        cluster.kill(0)
        assert client.get("k") is None
        cluster.restart(0)
        time.sleep(0.35)
        wait_until(lambda: client.put("k", b"back") and client.get("k") == b"back", timeout_s=10)


def test_a_stopped_server_costs_one_timeout_then_fast_misses(cluster_factory):
    import os
    import signal

    cluster = cluster_factory(1, memory="64MiB")
    pid = cluster.servers[0].pid
    with Client(cluster.addresses, timeout_s=SETUP_TIMEOUT_S) as setup:
        assert setup.put("frozen", b"v")
    with Client(cluster.addresses, timeout_s=TIMEOUT_S) as client:
        os.kill(pid, signal.SIGSTOP)                 # alive but silent: only a timeout finds it
        try:
            wait_until(lambda: process_state(pid) == "T", timeout_s=5)   # delivery is async
            start = time.monotonic()
            assert client.get("frozen") is None
            assert time.monotonic() - start < 2 * TIMEOUT_S
            start = time.monotonic()
            assert client.get("frozen") is None      # suspect now: no second wait
            assert time.monotonic() - start < TIMEOUT_S / 2
            assert client.stats()["misses_by_reason"].keys() >= {"timeout", "suspect"}
        finally:
            os.kill(pid, signal.SIGCONT)


def test_unreachable_servers_at_start_are_misses(tmp_path):
    with Client(["127.0.0.1:1"], timeout_s=TIMEOUT_S) as client:
        assert client.get("k") is None and client.put("k", b"v") is False
        assert client.stats()["misses_by_reason"]["unreachable"] == 1

"""A server that was out of the map comes back: while it was dead, clients put its keys on
another server; a key overwritten then must read back the newer value or miss, never the value
the returning server kept (``gcache.server.mutable_keys``). Content-addressed keys are the
exception that costs nothing: the returning server still serves them."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.sdk import Client
from tests.helpers import wait_until

MASTER_ARGS = ("--dead-timeout", "2.0", "--heartbeat-interval", "0.5")
N_KEYS = 60


def _old(i: int) -> bytes:
    return f"old-{i}".encode() * 100


def _new(i: int) -> bytes:
    return f"new-{i}".encode() * 100


def _page(i: int) -> bytes:
    return f"page-{i}".encode() * 100


def _back_in_map(client: Client, address: str) -> bool:
    return address in client.stats()["servers"]


@contextmanager
def _two_servers(tmp_path) -> Iterator[tuple[LocalCluster, Client]]:
    """Two servers under one master that declares a server dead after 2 s of silence."""
    with LocalMasters(1, args=MASTER_ARGS, log_dir=str(tmp_path / "m")) as masters, \
            LocalCluster(2, memory="64MiB", master=masters.spec,
                         log_dir=str(tmp_path / "s")) as cluster, \
            Client(master=masters.spec, timeout_s=1.0, map_refresh_s=0.2) as client:
        wait_until(lambda: len(client.stats()["servers"]) == 2, 15)
        yield cluster, client


def _through_an_absence(tmp_path, away, back) -> None:
    """Keys put, server 0 taken away (``away``) until the map drops it, the mutable keys put
    again, server 0 brought back (``back``) until the map has it again; then the reads."""
    with _two_servers(tmp_path) as (cluster, client):
        returning = cluster.addresses[0]
        mutable = [f"doc/{i}" for i in range(N_KEYS)]
        pages = [f"page/{i}" for i in range(N_KEYS)]
        assert all(client.batch_put(mutable, [_old(i) for i in range(N_KEYS)]))
        assert all(client.batch_put(pages, [_page(i) for i in range(N_KEYS)],
                                    content_addressed=True))
        held = client.server_stats()[returning]["tier"]["objects"]
        assert held >= N_KEYS // 4                        # both kinds live on it
        away(cluster)
        wait_until(lambda: not _back_in_map(client, returning), 15)
        assert all(client.batch_put(mutable, [_new(i) for i in range(N_KEYS)]))
        back(cluster)
        wait_until(lambda: _back_in_map(client, returning), 15)
        wait_until(lambda: client.server_stats()[returning] is not None, 10)

        got = client.batch_get(mutable)
        stale = [k for k, v, i in zip(mutable, got, range(N_KEYS)) if v == _old(i)]
        assert stale == [], f"{len(stale)} keys read back values older than their last put"
        assert all(v in (None, _new(i)) for i, v in enumerate(got))
        assert any(v is None for v in got)                # the returning server's share
        assert client.batch_get(pages) == [_page(i) for i in range(N_KEYS)]   # all still served
        # and the returning server takes mutable puts again, served as usual
        assert all(client.batch_put(mutable, [_new(i) for i in range(N_KEYS)]))
        assert client.batch_get(mutable) == [_new(i) for i in range(N_KEYS)]


def test_a_key_overwritten_while_its_server_was_dead_never_reads_back_older(tmp_path):
    _through_an_absence(tmp_path, away=lambda c: c.kill(0), back=lambda c: c.restart(0))


def test_a_key_overwritten_while_its_server_was_cut_off_never_reads_back_older(tmp_path):
    """Stopped, not killed: the process keeps its state and learns from its first heartbeat
    answer that the map dropped it."""
    pid: list[int] = []

    def away(cluster: LocalCluster) -> None:
        pid.append(cluster.servers[0].pid)
        os.kill(pid[0], signal.SIGSTOP)

    def back(cluster: LocalCluster) -> None:
        os.kill(pid[0], signal.SIGCONT)

    _through_an_absence(tmp_path, away=away, back=back)


def test_a_key_whose_owner_came_back_is_not_served_again_by_the_one_that_stood_in(tmp_path):
    """Server 1 stands in for server 0 while it is dead and takes puts of its keys; server 0
    returns and takes puts of them again; server 0 dies once more: server 1 must not serve
    the values it took the first time."""
    with _two_servers(tmp_path) as (cluster, client):
        returning = cluster.addresses[0]
        keys = [f"doc/{i}" for i in range(N_KEYS)]
        assert all(client.batch_put(keys, [_old(i) for i in range(N_KEYS)]))
        cluster.kill(0)
        wait_until(lambda: not _back_in_map(client, returning), 15)
        assert all(client.batch_put(keys, [_old(i) + b"2" for i in range(N_KEYS)]))
        cluster.restart(0)
        wait_until(lambda: _back_in_map(client, returning), 15)
        wait_until(lambda: all(client.batch_put(keys, [_new(i) for i in range(N_KEYS)])), 10)
        cluster.kill(0)
        wait_until(lambda: not _back_in_map(client, returning), 15)
        got = client.batch_get(keys)
        older = [k for k, v, i in zip(keys, got, range(N_KEYS)) if v == _old(i) + b"2"]
        assert older == [], f"{len(older)} keys read back the stand-in's older values"
        assert all(v in (None, _new(i)) for i, v in enumerate(got))
        assert any(v == _new(i) for i, v in enumerate(got))      # server 1's own keys


def test_a_quick_restart_keeps_every_key(tmp_path):
    """Back before the map dropped it: nothing moved, so mutable keys are served again too."""
    with LocalMasters(1, args=("--dead-timeout", "10.0", "--heartbeat-interval", "0.5"),
                      log_dir=str(tmp_path / "m")) as masters, \
            LocalCluster(1, memory="64MiB", master=masters.spec,
                         log_dir=str(tmp_path / "s")) as cluster, \
            Client(master=masters.spec, timeout_s=1.0, map_refresh_s=0.2) as client:
        wait_until(lambda: len(client.stats()["servers"]) == 1, 15)
        keys = [f"doc/{i}" for i in range(N_KEYS)]
        assert all(client.batch_put(keys, [_old(i) for i in range(N_KEYS)]))
        cluster.kill(0)
        cluster.restart(0)
        wait_until(lambda: client.batch_get(keys) == [_old(i) for i in range(N_KEYS)], 10)

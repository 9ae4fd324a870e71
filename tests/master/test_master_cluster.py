"""Three real masters and real data servers on loopback: membership, failures, failover."""

import time

import pytest

from gcache import Client
from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.errors import Unavailable
from gcache.master_client import MasterClient
from gcache.proto import master_pb2 as pb
from tests.helpers import wait_until

FAST = ("--dead-timeout", "2.0", "--heartbeat-interval", "0.5")


@pytest.fixture
def masters(tmp_path):
    with LocalMasters(3, args=FAST, log_dir=str(tmp_path / "masters")) as group:
        yield group


def status(address: str) -> pb.StatusReply:
    link = MasterClient([address], timeout_s=1.0)
    try:
        return link.status()
    finally:
        link.close()


def leader_index(masters: LocalMasters) -> int | None:
    for member in masters.members:
        if member.is_running():
            try:
                if status(member.listen).is_leader:
                    return member.index
            except Exception:
                continue
    return None


def map_states(masters: LocalMasters) -> dict[str, str]:
    """Address -> state of every server in the map; {} while no member serves one (no member
    has caught up with an elected leader yet)."""
    link = MasterClient(masters.addresses, timeout_s=1.0)
    try:
        reply = link.cluster_map()
    except Unavailable:
        return {}
    finally:
        link.close()
    names = {pb.ALIVE: "alive", pb.SUSPECT: "suspect", pb.DEAD: "dead",
             pb.DRAINING: "draining", pb.LEFT: "left"}
    return {s.address: names[s.state] for s in reply.servers}


def test_three_masters_elect_one_leader_that_every_member_names(masters):
    wait_until(lambda: leader_index(masters) is not None, timeout_s=10)
    # A follower learns the leader from its first append entries, a heartbeat after the
    # election (a busy machine made that visible: one member still naming none).
    wait_until(lambda: all(status(a).leader_raft for a in masters.addresses), timeout_s=10)
    replies = [status(a) for a in masters.addresses]
    assert sum(r.is_leader for r in replies) == 1
    assert len({r.leader_raft for r in replies}) == 1
    wait_until(lambda: all(status(a).leader_grpc for a in masters.addresses), timeout_s=10)


def test_servers_join_and_clients_follow_the_map(masters, tmp_path):
    with LocalCluster(3, memory="64MiB", master=masters.spec,
                      log_dir=str(tmp_path / "servers")) as cluster:
        wait_until(lambda: sorted(map_states(masters)) == sorted(cluster.addresses), 15)
        with Client(master=masters.spec, timeout_s=1.0) as client:
            assert sorted(client.stats()["servers"]) == sorted(cluster.addresses)
            keys = [f"k{i}" for i in range(60)]
            assert all(client.batch_put(keys, [k.encode() * 10 for k in keys]))
            assert client.batch_get(keys) == [k.encode() * 10 for k in keys]
            per_server = [s["tier"]["objects"] for s in client.server_stats().values()]
            assert len(per_server) == 3 and all(n > 0 for n in per_server)


def test_a_killed_server_leaves_the_map_and_costs_misses_not_errors(masters, tmp_path):
    with LocalCluster(3, memory="64MiB", master=masters.spec,
                      log_dir=str(tmp_path / "servers")) as cluster:
        wait_until(lambda: len(map_states(masters)) == 3, 15)
        with Client(master=masters.spec, timeout_s=0.5, map_refresh_s=0.2) as client:
            keys = [f"k{i}" for i in range(90)]
            assert all(client.batch_put(keys, [b"v"] * 90))
            dead = cluster.addresses[1]
            cluster.kill(1)
            started = time.monotonic()
            wait_until(lambda: map_states(masters)[dead] == "dead", timeout_s=10)
            assert time.monotonic() - started < 2.0 + 2.5       # dead timeout + a check period
            wait_until(lambda: dead not in client.stats()["servers"], timeout_s=5)
            got = client.batch_get(keys)                        # never raises
            assert 0 < got.count(None) < 90 and all(v in (None, b"v") for v in got)
            assert all(client.batch_put([f"new{i}" for i in range(30)], [b"n"] * 30))
            assert client.batch_get([f"new{i}" for i in range(30)]) == [b"n"] * 30


def test_a_restarted_server_rejoins_with_its_id_and_its_data(masters, tmp_path):
    with LocalCluster(2, memory="64MiB", master=masters.spec,
                      log_dir=str(tmp_path / "servers")) as cluster:
        wait_until(lambda: len(map_states(masters)) == 2, 15)
        ids_before = {s.address: s.id for s in status(masters.addresses[0]).servers}
        with Client(master=masters.spec, timeout_s=1.0, map_refresh_s=0.2) as client:
            keys = [f"k{i}" for i in range(40)]
            # content-addressed, as KV pages are: a mutable key of a server that was out of the
            # map while the epoch moved is purged on its return (docs/protocol.md, "Overwritten
            # keys across failures"), and whether the master saw this server gone before the
            # restart depends on how busy the machine is (it did once, and the keys went)
            assert all(client.batch_put(keys, [b"x"] * 40, content_addressed=True))
            cluster.kill(0)
            cluster.restart(0)
            wait_until(lambda: map_states(masters)[cluster.addresses[0]] == "alive", 10)
            ids_after = {s.address: s.id for s in status(masters.addresses[0]).servers}
            assert ids_after == ids_before
            try:
                wait_until(lambda: client.batch_get(keys) == [b"x"] * 40, timeout_s=20)
            except AssertionError:
                # failed once in a clean-clone make test (beside the vLLM engine suite) and not
                # in 14 runs beside 2 and 6 busy processes: say what the client saw and what
                # the restarted server logged, since the run's logs are gone by the time one looks
                got = client.batch_get(keys)
                with open(cluster.servers[0].log_path, errors="replace") as log:
                    tail = log.read()[-4000:]
                raise AssertionError(f"missing {[k for k, v in zip(keys, got) if v != b'x']}; "
                                     f"client {client.stats()}; map {map_states(masters)}; "
                                     f"server 0 log:\n{tail}") from None


def test_a_leader_kill_elects_a_new_leader_and_io_never_fails(tmp_path):
    # The default dead timeout (5 s): a loaded test machine must not turn a late beat into a
    # death, which would move keys and make this test about something else.
    with LocalMasters(3, args=("--heartbeat-interval", "0.5"),
                      log_dir=str(tmp_path / "masters")) as masters, \
            LocalCluster(2, memory="64MiB", master=masters.spec,
                      log_dir=str(tmp_path / "servers")):
        wait_until(lambda: len(map_states(masters)) == 2, 15)
        with Client(master=masters.spec, timeout_s=1.0, map_refresh_s=0.2) as client:
            wait_until(lambda: leader_index(masters) is not None, 10)
            old = leader_index(masters)
            masters.kill(old)
            killed_at, failures, ops, new_leader_s = time.monotonic(), 0, 0, None
            while time.monotonic() - killed_at < 7.0:
                key = f"during{ops}"
                failures += not client.put(key, b"d") or client.get(key) != b"d"
                ops += 1
                if new_leader_s is None and leader_index(masters) not in (None, old):
                    new_leader_s = time.monotonic() - killed_at
            assert failures == 0 and ops > 50, client.stats()
            assert new_leader_s is not None and new_leader_s < 5.0
            assert set(map_states(masters).values()) <= {"alive", "suspect"}
            assert client.stats()["misses"] == 0


def test_a_restarted_member_serves_no_map_older_than_the_one_it_missed(tmp_path):
    # A member restarted after the map moved replays its journal (an old map) before the leader
    # reaches it. A client whose first question went to it placed every key on that old map
    # (here: no servers at all): reads of acknowledged keys missed (a fault-suite failure).
    with LocalMasters(3, args=FAST, log_dir=str(tmp_path / "masters")) as masters:
        wait_until(lambda: leader_index(masters) is not None, 10)
        down = next(m.index for m in masters.members if m.index != leader_index(masters))
        masters.kill(down)
        with LocalCluster(2, memory="64MiB", master=masters.spec,
                          log_dir=str(tmp_path / "servers")):
            wait_until(lambda: len(map_states(masters)) == 2, 15)
            expected = status(masters.members[leader_index(masters)].listen).epoch
            masters.restart(down)
            link = MasterClient([masters.members[down].listen], timeout_s=1.0)
            answers, refused, deadline = [], 0, time.monotonic() + 15
            try:
                while time.monotonic() < deadline and not answers:
                    try:
                        answers.append(link.cluster_map())
                    except Unavailable as exc:       # catching up (or slow, on a busy box)
                        assert "catching up" in str(exc) or "deadline" in str(exc), exc
                        refused += 1
                        time.sleep(0.02)
            finally:
                link.close()
            assert answers, f"the restarted member never served a map ({refused} refusals)"
            assert answers[0].epoch >= expected and len(answers[0].servers) == 2, answers[0]


def test_with_every_master_down_clients_keep_their_map(masters, tmp_path):
    with LocalCluster(2, memory="64MiB", master=masters.spec,
                      log_dir=str(tmp_path / "servers")) as cluster:
        wait_until(lambda: len(map_states(masters)) == 2, 15)
        with Client(master=masters.spec, timeout_s=1.0, map_refresh_s=0.2) as client:
            for i in range(3):
                masters.kill(i)
            time.sleep(1.0)
            keys = [f"k{i}" for i in range(40)]
            assert all(client.batch_put(keys, [b"m"] * 40))
            assert client.batch_get(keys) == [b"m"] * 40
            assert sorted(client.stats()["servers"]) == sorted(cluster.addresses)


def test_a_master_serves_prometheus_metrics(tmp_path):
    import urllib.request

    from gcache.cli.ports import free_port
    metrics = f"127.0.0.1:{free_port()}"
    with LocalMasters(1, args=("--metrics-listen", metrics), log_dir=str(tmp_path)) as group:
        wait_until(lambda: leader_index(group) == 0, timeout_s=10)
        text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
    assert "gcache_master_is_leader 1.0" in text
    assert 'gcache_master_servers{state="alive"} 0.0' in text


def test_gcache_status_prints_the_masters_and_the_map(masters, tmp_path):
    import subprocess
    import sys
    with LocalCluster(1, memory="64MiB", master=masters.spec,
                      log_dir=str(tmp_path / "servers")) as cluster:
        wait_until(lambda: len(map_states(masters)) == 1, 15)
        out = subprocess.run([sys.executable, "-m", "gcache.cli", "status", "--master",
                              masters.spec], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("leader,") == 1 and out.stdout.count("follower") == 2
    assert f"{cluster.addresses[0]} alive" in out.stdout


def test_a_group_that_cannot_start_every_member_ends_the_ones_it_started(tmp_path):
    import socket

    from gcache.errors import StartFailed
    group = LocalMasters(3, args=FAST, log_dir=str(tmp_path / "masters"), ready_timeout_s=10.0)
    host, port = group.members[2].listen.rsplit(":", 1)
    with socket.socket() as squatter:                # member 2's gRPC port, taken
        squatter.bind((host, int(port)))
        squatter.listen()
        with pytest.raises(StartFailed, match="gcache-master 2"), group:
            pass
    assert [m.is_running() for m in group.members] == [False] * 3
    assert all(m.proc is not None and m.proc.returncode is not None for m in group.members)

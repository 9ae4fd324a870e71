"""The cluster token on master RPCs and the loopback rule for masters without one."""

import os
import subprocess
import sys

import pytest

from gcache import Client
from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.errors import MasterError
from gcache.master_client import MasterClient
from tests.helpers import wait_until

TOKEN = "a-cluster-token-of-32-characters"


@pytest.fixture
def secured(tmp_path):
    with LocalMasters(3, env={"GCACHE_TOKEN": TOKEN}, log_dir=str(tmp_path / "m")) as group:
        yield group


def call_status(masters: LocalMasters, token: str | None):
    link = MasterClient(masters.addresses, token=token, timeout_s=2.0)
    try:
        return link.status()
    finally:
        link.close()


def test_the_right_token_is_served(secured):
    wait_until(lambda: call_status(secured, TOKEN).leader_raft, timeout_s=10)


@pytest.mark.parametrize("token, message", [(None, "cluster token missing"),
                                            ("a-wrong-token-of-32-characters!!", "token wrong")])
def test_a_missing_or_wrong_token_is_refused_with_a_reason(secured, token, message):
    with pytest.raises(MasterError, match=message):
        call_status(secured, token)


def test_servers_and_clients_with_the_token_work_end_to_end(secured, tmp_path, monkeypatch):
    monkeypatch.setenv("GCACHE_TOKEN", TOKEN)          # inherited by the server processes
    with LocalCluster(2, memory="64MiB", master=secured.spec,
                      log_dir=str(tmp_path / "s")) as cluster:
        wait_until(lambda: len(call_status(secured, TOKEN).servers) == 2, timeout_s=15)
        with Client(master=secured.spec, token=TOKEN, timeout_s=1.0) as client:
            assert client.put("k", b"v") and client.get("k") == b"v"
            assert sorted(client.stats()["servers"]) == sorted(cluster.addresses)


def test_a_server_with_a_wrong_token_is_refused_and_says_why(secured, tmp_path, monkeypatch):
    monkeypatch.setenv("GCACHE_TOKEN", "a-wrong-token-of-32-characters!!")
    with LocalCluster(1, memory="64MiB", master=secured.spec,
                      log_dir=str(tmp_path / "s")) as cluster:
        wait_until(lambda: "token wrong" in cluster.tail(cluster.servers[0], 50), timeout_s=10)
    assert call_status(secured, TOKEN).servers == []


def test_a_master_without_a_token_refuses_a_non_loopback_address(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GCACHE_TOKEN"}
    proc = subprocess.run([sys.executable, "-m", "gcache.master.main", "--listen",
                           "0.0.0.0:7999", "--raft", "127.0.0.1:7998", "--data-dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert "0.0.0.0:7999" in proc.stderr and "loopback" in proc.stderr


def test_a_heartbeat_from_an_unknown_server_is_not_registered(secured):
    from gcache.errors import NotLeader, NotRegistered
    wait_until(lambda: call_status(secured, TOKEN).leader_raft, timeout_s=10)
    link = MasterClient(secured.addresses, token=TOKEN, timeout_s=2.0)

    def answered() -> bool:
        """A member that knows the leader answers (an election can still be settling)."""
        try:
            link.heartbeat("no-such-server")
        except NotLeader:
            return False
        except NotRegistered:
            pass
        return True

    try:
        wait_until(answered, timeout_s=10)
        with pytest.raises(NotRegistered, match="not registered"):
            link.heartbeat("no-such-server")
    finally:
        link.close()

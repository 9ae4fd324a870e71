"""Every entry point behind the cluster token, and nothing the daemons write open to others.

Raft: pysyncobj unpickles what reaches its port, so a stranger's pickle would run in the
master; with a token the channel is encrypted and authenticated before anything is unpickled.
/metrics answers only with the token. Files the daemons create are 0600 and their directories
0700, and neither the token nor a value's bytes reach a log.
"""

from __future__ import annotations

import os
import pickle
import socket
import stat
import struct
import time
import urllib.error
import urllib.request
import zlib

import pytest

from gcache import Client
from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.cli.ports import free_port
from gcache.master_client import MasterClient
from gcache.proto import master_pb2 as pb
from tests.helpers import wait_until

TOKEN = "security-suite-cluster-token-0123"


class _RunsCode:
    """Unpickling this creates a directory: proof that the receiver ran a stranger's code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def pysyncobj_frame(message: object) -> bytes:
    """A message as pysyncobj's TCP transport frames it: length, then zlib of the pickle."""
    data = zlib.compress(pickle.dumps(message), 3)
    return struct.pack("i", len(data)) + data


def status(masters: LocalMasters) -> pb.StatusReply:
    link = MasterClient(masters.addresses, token=TOKEN, timeout_s=2.0)
    try:
        return link.status()
    finally:
        link.close()


@pytest.fixture
def secured_masters(tmp_path):
    with LocalMasters(3, env={"GCACHE_TOKEN": TOKEN}, log_dir=str(tmp_path / "m")) as group:
        wait_until(lambda: status(group).leader_raft, timeout_s=15)
        yield group


def test_a_strangers_pickle_on_the_raft_port_runs_nothing(secured_masters, tmp_path):
    marker = tmp_path / "ran-a-strangers-code"
    for member in secured_masters.members:
        host, port = member.raft.rsplit(":", 1)
        for message in (_RunsCode(str(marker)), [_RunsCode(str(marker)), "x"]):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(pysyncobj_frame(message))
                sock.sendall(pysyncobj_frame(member.raft))     # then pose as a member
                time.sleep(0.3)
    time.sleep(1.0)
    assert not marker.exists(), "a master unpickled an unauthenticated message"
    reply = status(secured_masters)
    assert reply.leader_raft and all(m.is_running() for m in secured_masters.members)


def test_metrics_answer_only_with_the_token(tmp_path):
    port = free_port()
    with LocalCluster(1, memory="64MiB", server_args=(
            "--segment-size", "4MiB", "--token", TOKEN, "--metrics-listen", f"127.0.0.1:{port}"),
            log_dir=str(tmp_path / "s")):
        url = f"http://127.0.0.1:{port}/metrics"
        for header in (None, "Bearer not-the-token", f"Basic {TOKEN}"):
            request = urllib.request.Request(url, headers={"Authorization": header} if header
                                             else {})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=5)
            assert refused.value.code == 401
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert b"gcache_server_hits_total" in answer.read()


def test_master_metrics_answer_only_with_the_token(tmp_path):
    port = free_port()
    with LocalMasters(1, env={"GCACHE_TOKEN": TOKEN}, args=("--metrics-listen",
                                                          f"127.0.0.1:{port}"),
                      log_dir=str(tmp_path / "m")):
        url = f"http://127.0.0.1:{port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 401
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert b"gcache_master" in answer.read()


def modes_under(root: str) -> dict[str, int]:
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            found[path] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def test_daemon_files_are_private_and_logs_hold_no_secrets(tmp_path, secured_masters,
                                                           monkeypatch):
    monkeypatch.setenv("GCACHE_TOKEN", TOKEN)
    disk = tmp_path / "disk"
    disk.mkdir()
    payload = b"PAYLOAD-THAT-MUST-NOT-BE-LOGGED-" * 2048
    with LocalCluster(1, memory="16MiB", master=secured_masters.spec, server_args=(
            "--segment-size", "4MiB", "--disk-dir", str(disk), "--disk-capacity", "64MiB"),
            log_dir=str(tmp_path / "s")) as cluster:
        wait_until(lambda: len(status(secured_masters).servers) == 1, timeout_s=15)
        with Client(cluster.addresses, token=TOKEN, timeout_s=2.0) as client:
            for i in range(40):                          # 2.5x memory: demotion writes to disk
                assert client.put(f"secret{i}", payload)
            with Client(cluster.addresses, token="wrong-token-wrong-token") as stranger:
                assert stranger.get("secret0") is None
            wait_until(lambda: client.get("secret0") == payload, timeout_s=10)
        shm = cluster.servers[0].shm_name
        created = modes_under(str(disk))
        for path in (f"/dev/shm/{shm}", f"/dev/shm/{shm}.key"):
            created[path] = stat.S_IMODE(os.stat(path).st_mode)
        created[f"/tmp/{shm}.sock"] = stat.S_IMODE(os.stat(f"/tmp/{shm}.sock").st_mode)
        logs = [cluster.servers[0].log_path]
    for member in secured_masters.members:
        created.update(modes_under(member.data_dir))
        logs.append(member.log_path)
    assert len(created) > 6
    loose = {path: oct(mode) for path, mode in created.items()
             if mode & 0o077 or (os.path.isdir(path) and mode != 0o700)}
    assert not loose, loose
    for path in logs:
        with open(path, "rb") as fh:
            text = fh.read()
        assert TOKEN.encode() not in text and b"PAYLOAD-THAT-MUST" not in text, path

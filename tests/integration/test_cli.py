"""The gcache command line against a real server."""

import json
import os
import subprocess
import sys


def gcache(*args: str, stdin: bytes = b"", env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcache.cli", *args], input=stdin,
                          capture_output=True, timeout=60, env=env)


def test_put_get_and_stat(cluster_factory):
    cluster = cluster_factory(1)
    servers = cluster.addresses[0]
    assert gcache("put", "--servers", servers, "cli-key", "-", stdin=b"hello").returncode == 0
    got = gcache("get", "--servers", servers, "cli-key")
    assert got.returncode == 0 and got.stdout == b"hello"
    assert gcache("get", "--servers", servers, "absent").returncode == 1
    stat = gcache("stat", "--servers", servers)
    assert json.loads(stat.stdout)[servers]["tier"]["objects"] == 1


def test_token_from_the_environment(cluster_factory):
    token = "a-token-for-the-cli-test"
    cluster = cluster_factory(1, server_args=("--segment-size", "4MiB", "--token", token))
    env = {**os.environ, "GCACHE_TOKEN": token, "GCACHE_CLIENT_SERVERS": cluster.addresses[0]}
    assert gcache("put", "k", "-", stdin=b"x", env=env).returncode == 0
    assert gcache("get", "k", env={**env, "GCACHE_TOKEN": "wrong-token-wrong"}).returncode == 1


def test_bad_arguments_are_clear_errors():
    result = gcache("stat", "--servers", "nonsense")
    assert result.returncode == 2 and b"HOST:PORT" in result.stderr


def test_arenas_tells_live_from_stopped_and_removes_only_stopped_ones(cluster_factory):
    cluster = cluster_factory(2)
    live, stopped = (s.shm_name for s in cluster.servers)
    cluster.kill(1)                                    # a crash: its arena stays behind
    listed = json.loads(gcache("arenas", live, stopped, "--json").stdout)["arenas"]
    by_name = {a["name"]: a for a in listed}
    assert by_name[live]["state"] == "live" and by_name[live]["pid"] == cluster.servers[0].pid
    assert by_name[stopped]["state"] == "stopped" and by_name[stopped]["pid"] == 0
    assert by_name[live]["size_bytes"] > 0
    shown = gcache("arenas", live, stopped)
    assert b"1 stopped" in shown.stdout and b"--remove-stopped" in shown.stdout
    done = json.loads(gcache("arenas", live, stopped, "--remove-stopped", "--json").stdout)
    assert done["removed"] == [stopped]
    assert not os.path.exists(f"/dev/shm/{stopped}")
    assert not os.path.exists(f"/dev/shm/{stopped}.key")
    assert os.path.exists(f"/dev/shm/{live}") and os.path.exists(f"/dev/shm/{live}.key")
    servers = cluster.addresses[0]                     # the live one still serves
    assert gcache("put", "--servers", servers, "after", "-", stdin=b"v").returncode == 0
    assert gcache("get", "--servers", servers, "after").stdout == b"v"
    missing = gcache("arenas", "no-such-arena")
    assert missing.returncode == 2 and b"no arena named no-such-arena" in missing.stderr

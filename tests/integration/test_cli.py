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

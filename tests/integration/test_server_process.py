"""gcache-server as an operator meets it: ready line, clean SIGTERM, clear start errors, metrics."""

import os
import re
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from gcache import Client
from gcache.cli.ports import free_port
from gcache.frame import Op
from gcache.sdk.protocol import Channel
from gcache.server.huge_pages import huge_tmpfs
from gcache.transport import nixl
from gcache.transport.tcp import connect
from tests.helpers import wait_until


def run_server(*args: str, timeout_s: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcache.server.main", *args],
                          capture_output=True, text=True, timeout=timeout_s)


def test_sigterm_shuts_down_cleanly_and_keeps_the_arena_for_a_restart(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")
    server = cluster.servers[0]
    with Client(cluster.addresses) as client:
        assert client.put("k", b"v")
        assert cluster.terminate(0) == 0
    assert os.path.exists(f"/dev/shm/{server.shm_name}")
    assert not os.path.exists(f"/tmp/{server.shm_name}.sock")
    assert "server.stopped" in cluster.tail(server)
    cluster.restart(0)
    with Client(cluster.addresses) as client:
        assert client.get("k") == b"v"


def test_an_arena_on_a_huge_page_tmpfs_serves_every_transport_and_survives_a_restart(
        cluster_factory):
    value = np.random.default_rng(7).integers(0, 256, 5 << 20, dtype=np.uint8)
    transports = ["tcp", "shm", *(["nixl"] if nixl.available() else [])]
    with huge_tmpfs(128 << 20) as where:
        if where is None:
            pytest.skip("this process may not mount a tmpfs (needs root and CAP_SYS_ADMIN)")
        cluster = cluster_factory(1, arena_dir=where, server_args=(
            "--segment-size", "4MiB", *(("--nixl",) if "nixl" in transports else ())))
        try:
            server = cluster.servers[0]
            assert os.path.exists(os.path.join(where, server.shm_name))
            share = re.search(r"arena.pages path=(\S+) huge_share=([\d.]+)", cluster.tail(server))
            assert share and share[1] == os.path.join(where, server.shm_name)
            assert float(share[2]) == 1.0
            for transport in transports:
                with Client(cluster.addresses, transport=transport) as client:
                    assert client.put(f"k-{transport}", value), transport
                    out = np.empty_like(value)
                    assert client.get_into("k-tcp", out) == value.nbytes, transport
                    assert np.array_equal(out, value), transport
            assert cluster.terminate(0) == 0
            cluster.restart(0)
            with Client(cluster.addresses) as client:
                assert all(client.get(f"k-{t}") == value.tobytes() for t in transports)
        finally:
            cluster.stop()                      # the mount goes next: nothing may map it


def test_bad_flags_are_clear_errors_at_start():
    result = run_server("--listen", "127.0.0.1:0", "--memory", "lots")
    assert result.returncode == 2 and "memory='lots': must be a size" in result.stderr
    result = run_server("--listen", "127.0.0.1:0", "--memory", "1MiB")
    assert result.returncode == 2 and "at least two segments" in result.stderr


def test_unknown_config_file_key_is_a_clear_error(tmp_path):
    path = tmp_path / "server.toml"
    path.write_text("[server]\nmemory = \"64MiB\"\nlisten_on = \"x\"\n")
    result = run_server("--config", str(path))
    assert result.returncode == 2 and "listen_on" in result.stderr


def test_a_busy_port_is_a_clear_error(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")
    result = run_server("--listen", cluster.addresses[0], "--memory", "64MiB",
                        "--shm-name", "gcache-busy-port-test")
    assert result.returncode == 2 and "cannot listen on" in result.stderr


def test_metrics_endpoint_serves_tier_counters(cluster_factory):
    port = free_port()
    cluster = cluster_factory(1, memory="64MiB",
                              server_args=("--metrics-listen", f"127.0.0.1:{port}"))
    with Client(cluster.addresses) as client:
        client.put("m", b"v")
        client.get("m")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "gcache_server_hits_total 1.0" in body and "gcache_server_objects 1.0" in body


def test_a_dead_clients_lease_stops_pinning_after_the_ttl(cluster_factory):
    cluster = cluster_factory(1, memory="64MiB")            # lease TTL is 1 s in the fixture
    with Client(cluster.addresses) as client:
        assert client.put("leased", b"x" * 1000)
        conn = connect(cluster.addresses[0], timeout_s=2, io_size=1 << 20)
        channel = Channel(conn, timeout_s=2)
        assert channel.reply(channel.request(Op.LEASE, key=b"leased")).handle > 0
        pins = lambda: client.server_stats()[cluster.addresses[0]]["tier"]["pins"]  # noqa: E731
        assert pins() == 1
        wait_until(lambda: pins() == 0, timeout_s=5)        # TTL, while the socket stays open
        conn.close()


def test_a_connection_is_refused_or_answered_never_accepted_before_the_server_can_answer(
        tmp_path):
    """The server binds its port at once but listens only once its arena and NIXL are ready:
    before, a client that connected in between got no answer within its timeout and marked a
    healthy server suspect. Every connection that gets through here is answered in time."""
    import socket
    import time

    from gcache.frame import HEADER_SIZE, Header, Status, unpack_header
    port = free_port()
    name = f"gcache-ready-{os.getpid()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "gcache.server.main", "--listen", f"127.0.0.1:{port}",
         "--memory", "1GiB", "--segment-size", "16MiB", "--shm-name", name, "--unix-socket",
         "off", "--nixl"], stderr=open(tmp_path / "server.log", "w"))
    answered = refused = 0
    try:
        deadline = time.monotonic() + 30
        while answered == 0 and time.monotonic() < deadline and server.poll() is None:
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
            except OSError:
                refused += 1
                time.sleep(0.005)
                continue
            with sock:
                sock.settimeout(0.2)                  # a Client(timeout_s=0.2)'s patience
                sock.sendall(Header(Op.HELLO, 1).pack())
                reply = unpack_header(sock.recv(HEADER_SIZE, socket.MSG_WAITALL),
                                      max_payload=1 << 20)
                assert reply.status == Status.OK
                answered += 1
        assert answered == 1, (answered, refused)
    finally:
        server.terminate()
        server.wait(20)
        for suffix in ("", ".key"):
            if os.path.exists(f"/dev/shm/{name}{suffix}"):
                os.unlink(f"/dev/shm/{name}{suffix}")

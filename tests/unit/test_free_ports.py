"""Ports chosen ahead: distinct within a pick, never handed out again while reserved, and
reserved across processes (two suites side by side drew the same port: a vLLM engine's
/health was answered by another suite's gRPC master)."""

import json
import random
import socket
import subprocess
import sys
import time

import pytest

from gcache.cli import ports
from gcache.cli.ports import free_port, free_ports


@pytest.fixture(autouse=True)
def registry(tmp_path, monkeypatch):
    path = tmp_path / "ports.json"
    monkeypatch.setattr(ports, "registry_path", str(path))
    return path


def test_a_port_drawn_twice_is_taken_once(monkeypatch):
    low = ports.ephemeral_low()
    draws = iter([low - 7, low - 7, low - 7, low - 9])
    monkeypatch.setattr(random, "randrange", lambda *_: next(draws))
    assert free_ports(2) == [low - 7, low - 9]


def test_no_reserved_port_is_handed_out_again():
    picked = free_ports(6) + [free_port() for _ in range(6)]
    assert len(set(picked)) == len(picked)
    low = ports.ephemeral_low()
    assert all(max(1024, low - ports.SPAN) <= p < low for p in picked)


def test_a_port_in_use_is_skipped(monkeypatch, registry):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        other = free_port()
        registry.write_text("{}")
        draws = iter([taken, other])
        monkeypatch.setattr(random, "randrange", lambda *_: next(draws))
        assert free_ports(1) == [other]


def test_another_process_does_not_draw_a_port_reserved_here(registry):
    mine = free_port()
    # the other process draws our port first, then the next one
    child = (
        "import random, sys\n"
        "from gcache.cli import ports\n"
        f"ports.registry_path = {str(registry)!r}\n"
        f"draws = iter([{mine}, {mine}, {mine + 1}])\n"
        "random.randrange = lambda *_: next(draws)\n"
        "print(ports.free_port())\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert int(out) == mine + 1
    assert set(json.loads(registry.read_text())) == {str(mine), str(mine + 1)}


def test_a_lapsed_reservation_frees_its_port(registry, monkeypatch):
    low = ports.ephemeral_low()
    registry.write_text(json.dumps({str(low - 5): time.time() - ports.RESERVED_S - 1}))
    monkeypatch.setattr(random, "randrange", lambda *_: low - 5)
    assert free_port() == low - 5


def test_a_torn_registry_is_started_over(registry):
    registry.write_text('{"123')
    port = free_port()
    assert list(json.loads(registry.read_text())) == [str(port)]

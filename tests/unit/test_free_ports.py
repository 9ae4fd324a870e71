"""Ports chosen ahead for Raft members: distinct within a group, and not handed out again by one
process while recent (a member's gRPC port drawn equal to another's Raft port kept it from
starting)."""

import random
import socket
from collections import deque

from gcache.cli import local_masters
from gcache.cli.local_masters import free_port, free_ports


def test_a_port_drawn_twice_is_taken_once(monkeypatch):
    low = local_masters._ephemeral_low()
    draws = iter([low - 7, low - 7, low - 7, low - 9])
    monkeypatch.setattr(random, "randrange", lambda *_: next(draws))
    monkeypatch.setattr(local_masters, "_handed_out", deque(maxlen=8))
    assert free_ports(2) == [low - 7, low - 9]


def test_no_recent_port_is_handed_out_again():
    ports = free_ports(6) + [free_port() for _ in range(6)]
    assert len(set(ports)) == len(ports)
    low = local_masters._ephemeral_low()
    assert all(max(1024, low - 12000) <= p < low for p in ports)


def test_a_port_in_use_is_skipped(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        other = free_port()
        draws = iter([taken, other])
        monkeypatch.setattr(random, "randrange", lambda *_: next(draws))
        monkeypatch.setattr(local_masters, "_handed_out", deque(maxlen=8))
        assert free_ports(1) == [other]

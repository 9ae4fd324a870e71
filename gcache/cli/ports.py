"""Ports chosen ahead, for processes that must know their address before they start (Raft
members, engines announced by URL, metrics listeners in tests and demos).

A port is free when it is chosen and bound by its process seconds later; whatever else picks a
port in between can take it. Two things close that window: the ports are drawn below the
kernel's ephemeral range, so no outgoing connection's source port and no bind to port 0 takes
one; and every pick is written, under a file lock, into a registry shared by all processes of
this user on this machine, so two test suites running side by side never draw the same port (a
vLLM engine's port drawn by another suite's master was answered by that master's gRPC).
A reservation lapses after ``RESERVED_S``; a restarted member keeps its address meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator

from gcache.errors import StartFailed

RESERVED_S = 1800.0
# Enough for hours of soak; a quarter of the 12,000 ports below the ephemeral range.
MAX_RESERVED = 3000
SPAN = 12000

# Tests point this at a file of their own.
registry_path = os.path.join(tempfile.gettempdir(), f"gcache-ports-{os.getuid()}.json")


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` that is free now (see ``free_ports``)."""
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports of ``host``, free now, below the ephemeral range and reserved
    against every other pick on this machine for ``RESERVED_S``. The probes stay bound until
    all ``n`` are chosen: picked one by one, two members of one group drew the same port."""
    low = ephemeral_low()
    probes: list[socket.socket] = []
    with _reservations() as held:
        try:
            for _ in range(200 + n):
                if len(probes) == n:
                    break
                port = random.randrange(max(1024, low - SPAN), low)
                if port in held:
                    continue
                probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    probe.bind((host, port))
                except OSError:
                    probe.close()
                    continue
                probes.append(probe)
            if len(probes) < n:
                raise StartFailed(f"no {n} free ports found below the ephemeral range")
            ports = [probe.getsockname()[1] for probe in probes]
        finally:
            for probe in probes:
                probe.close()
        now = time.time()
        held.update(dict.fromkeys(ports, now))
        return ports


def ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@contextlib.contextmanager
def _reservations() -> Iterator[dict[int, float]]:
    """The live reservations, locked against every other process for the block, and written
    back after it."""
    fd = os.open(registry_path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            stored = json.loads(f.read() or "{}")
            held = {int(port): float(at) for port, at in stored.items()}
        except (ValueError, AttributeError, TypeError):
            held = {}  # a torn or foreign file: start over rather than refuse every pick
        now = time.time()
        held = {port: at for port, at in held.items() if now - at < RESERVED_S}
        yield held
        newest = sorted(held.items(), key=lambda item: item[1])[-MAX_RESERVED:]
        f.seek(0)
        f.truncate()
        f.write(json.dumps(dict(newest)))

"""Real ``gcache-server`` processes on loopback, for ``make run``, benchmarks and tests.

Each server listens on port 0 and reports its real address in its ready line, so there is no
race for free ports. Every process started here is ended here, by its PID, and its
shared-memory file is removed, also after a SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from gcache.cli.arenas import SHM_DIR, SIDECARS
from gcache.errors import InvalidRequest, StartFailed

READY = "gcache-server ready listen="


@dataclass
class ServerProcess:
    index: int
    shm_name: str
    log_path: str
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """``n_servers`` data servers of ``memory`` each on 127.0.0.1. A context manager."""

    def __init__(self, n_servers: int = 2, *, memory: str = "256MiB",
                 server_args: tuple[str, ...] = (), log_dir: str | None = None,
                 ready_timeout_s: float = 30.0, master: str | None = None,
                 hosts: list[tuple[str, str]] | None = None, arena_dir: str = SHM_DIR) -> None:
        """``hosts``: per server, a network namespace and the address it listens on there
        (``ip netns exec``: the server's PID is the Popen's), instead of 127.0.0.1.
        ``arena_dir``: where the servers' arenas live (``--arena-dir``)."""
        if hosts is not None and len(hosts) != n_servers:
            raise InvalidRequest(f"{len(hosts)} hosts for {n_servers} servers")
        self.hosts = hosts
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="gcache-cluster-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.ready_timeout_s = ready_timeout_s
        self.arena_dir = arena_dir
        tag = uuid.uuid4().hex[:8]
        self.servers = [
            ServerProcess(i, f"gcache-{tag}-{i}", os.path.join(self.log_dir, f"server-{i}.log"),
                          ["--memory", memory, "--arena-dir", arena_dir, *server_args,
                           *(("--master", master, "--heartbeat-interval", "0.5")
                             if master else ())])
            for i in range(n_servers)]

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    def start(self) -> None:
        """Start every server; if one fails to, end the others (a caller's ``with`` never got
        the cluster to end it)."""
        try:
            for server in self.servers:
                ip = self.hosts[server.index][1] if self.hosts else "127.0.0.1"
                self._launch(server, listen=f"{ip}:0")
            for server in self.servers:
                self._wait_ready(server)
        except BaseException:
            self.stop()
            raise

    def _launch(self, server: ServerProcess, *, listen: str) -> None:
        log = open(server.log_path, "ab")
        cmd = [sys.executable, "-m", "gcache.server.main", "--listen", listen,
               "--shm-name", server.shm_name, *server.args]
        if self.hosts:
            cmd = ["ip", "netns", "exec", self.hosts[server.index][0], *cmd]
        server.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        server.extra["log_offset"] = os.path.getsize(server.log_path)

    def _wait_ready(self, server: ServerProcess) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        offset = server.extra.get("log_offset", 0)
        while time.monotonic() < deadline:
            with open(server.log_path, encoding="utf-8", errors="replace") as fh:
                fh.seek(offset)
                for line in fh:
                    if line.startswith(READY):
                        server.address = line[len(READY):].strip()
                        return
            if not server.is_running():
                assert server.proc is not None     # launched above
                raise StartFailed(f"gcache-server {server.index} exited with "
                                  f"{server.proc.returncode}; log: {self.tail(server)}")
            time.sleep(0.02)
        raise StartFailed(f"gcache-server {server.index} not ready after "
                          f"{self.ready_timeout_s}s; log: {self.tail(server)}")

    def tail(self, server: ServerProcess, lines: int = 20) -> str:
        with open(server.log_path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])

    def kill(self, index: int) -> None:
        """SIGKILL one server (a crash); its address stays known for a restart."""
        server = self.servers[index]
        if server.is_running():
            assert server.proc is not None         # is_running() says so
            os.kill(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)

    def restart(self, index: int) -> None:
        """Start a stopped server again on its old address."""
        server = self.servers[index]
        self._launch(server, listen=server.address)
        self._wait_ready(server)

    def terminate(self, index: int, *, timeout_s: float = 10.0) -> int:
        """SIGTERM one server and wait; returns its exit code (SIGKILL after ``timeout_s``)."""
        server = self.servers[index]
        if not server.is_running():
            return server.proc.returncode if server.proc else 0
        assert server.proc is not None             # is_running() says so
        os.kill(server.proc.pid, signal.SIGTERM)
        try:
            return server.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(server.proc.pid, signal.SIGKILL)
            return server.proc.wait(10)

    def stop(self) -> None:
        for server in self.servers:
            if server.proc is not None:
                self.terminate(server.index)
            arena = os.path.join(self.arena_dir, server.shm_name)
            for leftover in (arena, *(arena + suffix for suffix in SIDECARS),
                             f"/tmp/{server.shm_name}.sock"):
                try:
                    os.unlink(leftover)       # what a SIGKILLed server could not remove
                except FileNotFoundError:
                    pass

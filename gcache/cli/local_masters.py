"""Real ``gcache-master`` processes on loopback forming one Raft group, for tests and demos.

Raft members must know each other's addresses before they start, so ports are chosen ahead:
free ones below the kernel's ephemeral range (a launch that still loses one fails loudly). Every
process started here is ended here, by its PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from gcache.cli.ports import free_ports
from gcache.errors import StartFailed

READY = "gcache-master ready listen="


@dataclass
class MasterProcess:
    index: int
    listen: str
    raft: str
    data_dir: str
    log_path: str
    proc: subprocess.Popen[bytes] | None = None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalMasters:
    """``n`` masters (1, 3 or 5) on 127.0.0.1 (or on ``host``, an address of this network
    namespace). A context manager."""

    def __init__(self, n: int = 3, *, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, log_dir: str | None = None,
                 ready_timeout_s: float = 30.0, host: str = "127.0.0.1") -> None:
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="gcache-masters-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.args, self.env, self.ready_timeout_s = args, env, ready_timeout_s
        ports = free_ports(2 * n, host)
        self.members = [
            MasterProcess(i, f"{host}:{ports[2 * i]}", f"{host}:{ports[2 * i + 1]}",
                          os.path.join(self.log_dir, f"m{i}"),
                          os.path.join(self.log_dir, f"master-{i}.log"))
            for i in range(n)]

    @property
    def addresses(self) -> list[str]:
        return [m.listen for m in self.members]

    @property
    def spec(self) -> str:
        """The ``--master`` / ``master=`` value naming every member."""
        return ",".join(self.addresses)

    def __enter__(self) -> LocalMasters:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start every member; if one fails to, end the others (a caller's ``with`` never got
        the group to end it: a member that could not bind its port left two running)."""
        try:
            for member in self.members:
                self._launch(member)
            for member in self.members:
                self._wait_ready(member)
        except BaseException:
            self.stop()
            raise

    def _launch(self, member: MasterProcess) -> None:
        peers = ",".join(m.raft for m in self.members)
        cmd = [sys.executable, "-m", "gcache.master.main", "--listen", member.listen,
               "--raft", member.raft, "--peers", peers, "--data-dir", member.data_dir,
               *self.args]
        env = dict(os.environ, **(self.env or {}))
        with open(member.log_path, "ab") as log:
            member.proc = subprocess.Popen(cmd, stdout=log, stderr=log,
                                           stdin=subprocess.DEVNULL, env=env)

    def _wait_ready(self, member: MasterProcess) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            with open(member.log_path, encoding="utf-8", errors="replace") as fh:
                if any(line.startswith(READY) for line in fh):
                    return
            if not member.is_running():
                assert member.proc is not None     # launched above
                raise StartFailed(f"gcache-master {member.index} exited with "
                                  f"{member.proc.returncode}; log: {self.tail(member)}")
            time.sleep(0.02)
        raise StartFailed(f"gcache-master {member.index} not ready; log: {self.tail(member)}")

    def tail(self, member: MasterProcess, lines: int = 20) -> str:
        with open(member.log_path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])

    def kill(self, index: int) -> None:
        member = self.members[index]
        if member.is_running():
            assert member.proc is not None         # is_running() says so
            os.kill(member.proc.pid, signal.SIGKILL)
            member.proc.wait(10)

    def restart(self, index: int) -> None:
        member = self.members[index]
        with open(member.log_path, "a") as fh:
            fh.write("--- restart ---\n")
        self._launch(member)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            with open(member.log_path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            if READY in text.rsplit("--- restart ---", 1)[-1]:
                return
            time.sleep(0.02)
        raise StartFailed(f"gcache-master {index} not ready after restart")

    def terminate(self, index: int, *, timeout_s: float = 10.0) -> int:
        member = self.members[index]
        if not member.is_running():
            return member.proc.returncode if member.proc else 0
        assert member.proc is not None             # is_running() says so
        os.kill(member.proc.pid, signal.SIGTERM)
        try:
            return member.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(member.proc.pid, signal.SIGKILL)
            return member.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM every member at once, then wait; whatever is still running at the end (or
        when the wait is interrupted, say by a test timeout) is SIGKILLed."""
        try:
            for member in self.members:
                if member.is_running():
                    assert member.proc is not None     # is_running() says so
                    os.kill(member.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10.0
            for member in self.members:
                if member.proc is not None:
                    try:
                        member.proc.wait(max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
        finally:
            for member in self.members:
                if member.is_running():
                    assert member.proc is not None     # is_running() says so
                    os.kill(member.proc.pid, signal.SIGKILL)
                    member.proc.wait(10)

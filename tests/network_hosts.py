"""Hosts as network namespaces: ``NetworkHosts(n)`` makes ``n`` namespaces, each with one end of
a veth pair whose other end is on a bridge in the test's own namespace, so that processes in them
talk over a real interface with an address of its own (``10.R.S.i/24``; the test process is
``.254``) instead of loopback. Everything it creates is removed on exit, by name. Needs root and
``ip``; ``available()`` says whether this machine can (the tests skip with the reason if not).
Names carry the test process's PID, so concurrent runs never share one."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

_made = itertools.count()


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2)"
    probe = f"gcache-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class NetworkHosts:
    def __init__(self, n: int) -> None:
        pid = os.getpid()
        tag = f"{pid % 10000:04d}{next(_made) % 10}"
        self.bridge = f"gcb{tag}"
        self.names = [f"gcache-{tag}-{i}" for i in range(n)]
        self._veths = [f"gcv{tag}{i}" for i in range(n)]
        subnet = f"10.{200 + pid % 50}.{(pid // 50) % 250}"
        self.addresses = [f"{subnet}.{i + 1}" for i in range(n)]
        self.own_address = f"{subnet}.254"

    def __enter__(self) -> NetworkHosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.own_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name, veth, address in zip(self.names, self._veths, self.addresses):
                _ip("netns", "add", name)
                _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
                _ip("link", "set", f"{veth}p", "netns", name)
                _ip("link", "set", veth, "master", self.bridge, "up")
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", f"{veth}p")
                _ip("-n", name, "link", "set", f"{veth}p", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.names:                  # removing a namespace removes its veth pair
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)

    def hosts(self) -> list[tuple[str, str]]:
        """(namespace, address) per host: ``LocalCluster(hosts=...)``."""
        return list(zip(self.names, self.addresses))

    def run_in(self, index: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``index`` (bounded: ``timeout`` defaults to 60 s)."""
        kwargs.setdefault("timeout", 60)
        return subprocess.run(["ip", "netns", "exec", self.names[index], *argv], **kwargs)

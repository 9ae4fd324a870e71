"""Hosts as network namespaces: ``NetworkHosts(n)`` makes ``n`` namespaces, each with one end of
a veth pair whose other end is on a bridge in the test's own namespace, so that processes in them
talk over a real interface with an address of its own (``198.18.X.i/24``, the benchmarking range
that no real network routes; the test process is ``.254``) instead of loopback. It removes
exactly what it created, by name, on exit. ``cut(i)`` drops every frame to and from host ``i``
(a ``clsact`` qdisc with a direct-action classic-BPF filter that drops all: this kernel has
neither ``netem`` nor the ``drop`` action module) and ``heal(i)`` lifts it; ``limit(i, rate)``
caps what host ``i`` sends and receives with ``tbf``. Needs root and ``ip`` (and ``tc`` for
those three); ``available()`` says whether
this machine can (the tests skip with the reason if not). Names and subnets derive from one tag
claimed at creation: a name another run holds is skipped, never removed."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

_made = itertools.count()


def available() -> str | None:
    """None when namespaces, bridges and ``ip netns exec`` work here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2)"
    probe = f"gcache-probe-{os.getpid()}"
    steps = [["netns", "add", probe], ["netns", "exec", probe, "true"],
             ["link", "add", f"gcq{os.getpid() % 100000}", "type", "bridge"]]
    try:
        for step in steps:
            done = subprocess.run(["ip", *step], capture_output=True, text=True, timeout=30)
            if done.returncode:
                return f"ip {' '.join(step[:2])} failed: {done.stderr.strip()}"
        return None
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", f"gcq{os.getpid() % 100000}"],
                       capture_output=True, timeout=30)


# classic BPF "ret #2" in direct-action mode: TC_ACT_SHOT for every frame (no act_gact needed)
_DROP_ALL = "1,6 0 0 2"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _tc(*args: str, netns: str | None = None) -> subprocess.CompletedProcess:
    where = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*where, "tc", *args], check=True, capture_output=True, text=True,
                          timeout=30)


class NetworkHosts:
    def __init__(self, n: int) -> None:
        self.n = n
        self._created: list[tuple[str, ...]] = []    # undo commands, in creation order

    def _claim(self) -> None:
        """A tag whose bridge name is free (created here: the claim); names and subnet follow."""
        for _ in range(50):
            number = (os.getpid() * 10 + next(_made)) % 512
            self.bridge = f"gcbr{number}"          # the number is the claim: one run each
            if subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"],
                              capture_output=True, timeout=30).returncode == 0:
                break
        else:
            raise RuntimeError("no free bridge name for the test's network hosts")
        self._created.append(("link", "del", self.bridge))
        self.names = [f"gcache-net{number}-{i}" for i in range(self.n)]
        self._veths = [f"gcv{number}x{i}" for i in range(self.n)]
        subnet = f"198.{18 + number // 256}.{number % 256}"
        self.addresses = [f"{subnet}.{i + 1}" for i in range(self.n)]
        self.own_address = f"{subnet}.254"

    def __enter__(self) -> NetworkHosts:
        try:
            self._claim()
            _ip("addr", "add", f"{self.own_address}/24", "dev", self.bridge)
            # bridged frames skip iptables (a Docker host's FORWARD policy would drop them)
            subprocess.run(["ip", "link", "set", self.bridge, "type", "bridge",
                            "nf_call_iptables", "0"], capture_output=True, timeout=30)
            _ip("link", "set", self.bridge, "up")
            for name, veth, address in zip(self.names, self._veths, self.addresses):
                _ip("netns", "add", name)
                self._created.append(("netns", "del", name))
                _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
                self._created.append(("link", "del", veth))
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
        for undo in reversed(self._created):      # a veth already gone with its namespace fails
            subprocess.run(["ip", *undo], capture_output=True, timeout=30)
        self._created = []

    def cut(self, index: int) -> None:
        """Drop every frame host ``index`` sends or would receive, at once, until ``heal``."""
        veth = self._veths[index]
        _tc("qdisc", "add", "dev", veth, "clsact")
        for direction in ("ingress", "egress"):
            _tc("filter", "add", "dev", veth, direction, "bpf", "da", "bytecode", _DROP_ALL)

    def heal(self, index: int) -> None:
        subprocess.run(["tc", "qdisc", "del", "dev", self._veths[index], "clsact"],
                       capture_output=True, timeout=30)

    def limit(self, index: int, rate: str) -> None:
        """Cap host ``index``'s traffic both ways at ``rate`` (tc's units: "40mbit"). Gone with
        the namespace and the veth on exit."""
        veth = self._veths[index]
        for netns, dev in ((None, veth), (self.names[index], f"{veth}p")):
            _tc("qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kb",
                "latency", "500ms", netns=netns)

    def hosts(self) -> list[tuple[str, str]]:
        """(namespace, address) per host: ``LocalCluster(hosts=...)``."""
        return list(zip(self.names, self.addresses))

    def run_in(self, index: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``index`` (bounded: ``timeout`` defaults to 60 s)."""
        kwargs.setdefault("timeout", 60)
        return subprocess.run(["ip", "netns", "exec", self.names[index], *argv], **kwargs)

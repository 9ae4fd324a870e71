"""Which RDMA NIC serves which GPU, read from a sysfs tree (a pure function of the tree).

A GPU host has one NIC per GPU rail (under the GPU's own PCIe switch) and usually a front-end
NIC for everything else. A GPU's KV should leave through its rail NIC: a transfer through a NIC
behind another switch crosses the CPU's root complex (or the socket link, for another NUMA
node) and halves what the rail can carry. For each GPU, in order of preference:
1. a NIC under the same PCIe switch (``same-switch``: the same rail);
2. a rail NIC (one that shares a switch with some GPU) on the GPU's NUMA node, the least used;
3. any rail NIC, the least used;
4. a front-end NIC (no GPU under its switch) on the GPU's NUMA node, then any front-end NIC.
``deny`` removes NICs outright (a front-end NIC that must never carry data); a non-empty
``allow`` keeps only those. The choice gives the UCX device list of the GPU's NIXL agent
(``UCX_NET_DEVICES``) and the CPUs the IO threads serving that GPU bind to (its NUMA node's).

What is read: ``class/infiniband/<nic>/device`` (a link to the NIC's PCI device),
``bus/pci/devices/<address>`` with ``vendor`` and ``class`` (NVIDIA display and 3D controllers
are GPUs, in PCI address order: CUDA's order under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and no
``CUDA_VISIBLE_DEVICES``; a GPU bound to ``vfio-pci`` is counted too), each device's
``numa_node``, and ``devices/system/node/node<N>/cpulist``. A PCI device's path under
``devices/`` lists the bridges above it, so two devices under one switch share the path below
the root port. (Behind Intel VMD every device shares the VMD domain's path: all look alike.)
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gcache.errors import InvalidRequest

SYS_ROOT = "/sys"                # this host's sysfs (the tests point it at fixture trees)

NVIDIA = "0x10de"
PCI_ROOT = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$")      # devices/pci0000:00
GPU_CLASSES = ("0x0300", "0x0302")       # VGA and 3D controllers


@dataclass(frozen=True)
class Device:
    name: str                     # the NIC's name (mlx5_0) or the GPU's PCI address
    pci: str
    numa: int                     # -1: the kernel does not say
    path: tuple[str, ...]         # PCI bridges from the root complex down to the device


@dataclass(frozen=True)
class Choice:
    gpu: int                      # CUDA index (PCI bus order)
    gpu_pci: str
    nic: str | None
    reason: str                   # same-switch, rail-same-numa, rail, front-end-same-numa, ...
    cpus: tuple[int, ...]

    @property
    def ucx_devices(self) -> str:
        """``UCX_NET_DEVICES`` for this GPU's agent (port 1 of its NIC), or "" for UCX's own."""
        return f"{self.nic}:1" if self.nic else ""


@dataclass(frozen=True)
class Topology:
    nics: tuple[Device, ...]
    gpus: tuple[Device, ...]
    cpus_by_numa: dict[int, tuple[int, ...]]


def read_topology(sys_root: str = "/sys") -> Topology:
    pci_dir = os.path.join(sys_root, "bus", "pci", "devices")
    ib_dir = os.path.join(sys_root, "class", "infiniband")
    nics = tuple(sorted((_device(os.path.join(ib_dir, nic, "device"), nic)
                         for nic in _listdir(ib_dir)), key=lambda d: d.name))
    gpus = []
    for address in sorted(_listdir(pci_dir)):
        where = os.path.join(pci_dir, address)
        if _read(where, "vendor") == NVIDIA and _read(where, "class")[:6] in GPU_CLASSES:
            gpus.append(_device(where, address))
    node_dir = os.path.join(sys_root, "devices", "system", "node")
    cpus = {int(n[4:]): parse_cpulist(_read(os.path.join(node_dir, n), "cpulist"))
            for n in _listdir(node_dir) if n.startswith("node") and n[4:].isdigit()}
    return Topology(nics, tuple(gpus), cpus)


def choose_nics(topology: Topology, *, allow: Sequence[str] = (),
                deny: Sequence[str] = ()) -> list[Choice]:
    """One ``Choice`` per GPU (see the module docstring for the order of preference)."""
    nics = [n for n in topology.nics if n.name not in set(deny)
            and (not allow or n.name in set(allow))]
    rail = {n.name for n in nics if any(_same_switch(n, g) for g in topology.gpus)}
    used: Counter[str] = Counter()
    out = []
    for index, gpu in enumerate(topology.gpus):
        tiers = [("same-switch", [n for n in nics if _same_switch(n, gpu)]),
                 ("rail-same-numa", [n for n in nics if n.name in rail and n.numa == gpu.numa]),
                 ("rail", [n for n in nics if n.name in rail]),
                 ("front-end-same-numa", [n for n in nics
                                          if n.name not in rail and n.numa == gpu.numa]),
                 ("front-end", [n for n in nics if n.name not in rail])]
        reason, nic = "none", None
        for reason, candidates in tiers:
            if candidates:
                if reason == "same-switch":     # the deepest common switch: the nearest NIC
                    nic = min(candidates, key=lambda n: (-_shared_depth(n, gpu), used[n.name],
                                                         n.name))
                else:                           # the least used, nearest among equals
                    nic = min(candidates, key=lambda n: (used[n.name], -_shared_depth(n, gpu),
                                                         n.name))
                break
        else:
            reason = "none"
        if nic is not None:
            used[nic.name] += 1
        out.append(Choice(index, gpu.pci, nic.name if nic else None, reason,
                          topology.cpus_by_numa.get(gpu.numa, ())))
    return out


def for_gpu(gpu: int, *, deny: Sequence[str] = ()) -> Choice:
    """The choice for CUDA device ``gpu`` on this host (``SYS_ROOT``): its UCX device and its
    IO threads' CPUs. Raises InvalidRequest (a ValueError) when the host has no such GPU."""
    choices = choose_nics(read_topology(SYS_ROOT), deny=deny)
    if not 0 <= gpu < len(choices):
        raise InvalidRequest(f"gpu={gpu}, but {SYS_ROOT} shows {len(choices)} NVIDIA GPUs")
    return choices[gpu]


def rail_devices(*, deny: Sequence[str] = ()) -> tuple[str, ...]:
    """The UCX devices of every GPU's chosen NIC on this host (a server's agent serves them
    all); () on a host without GPUs or RDMA NICs, which leaves UCX its own choice."""
    chosen = {c.ucx_devices for c in choose_nics(read_topology(SYS_ROOT), deny=deny)}
    return tuple(sorted(d for d in chosen if d))


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``0-3,8,10-11`` -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return tuple(cpus)


def format_cpulist(cpus: Sequence[int]) -> str:
    """(0, 1, 2, 3, 8, 10, 11) -> ``0-3,8,10-11`` (``parse_cpulist``'s inverse; "-" if none)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs) or "-"


def format_choices(choices: Sequence[Choice]) -> str:
    lines = [f"{'gpu':>3s}  {'pci':12s}  {'nic':12s}  {'why':20s}  cpus"]
    for c in choices:
        lines.append(f"{c.gpu:3d}  {c.gpu_pci:12s}  {c.nic or '-':12s}  {c.reason:20s}  "
                     f"{format_cpulist(c.cpus)}")
    return "\n".join(lines)


# ---- sysfs ------------------------------------------------------------------------------------


def _device(link: str, name: str) -> Device:
    real = os.path.realpath(link)
    parts = real.split(os.sep)
    roots = [i for i, p in enumerate(parts) if PCI_ROOT.match(p)]
    chain = tuple(parts[roots[0]:]) if roots else (real,)
    numa = _read(real, "numa_node")
    return Device(name, chain[-1], int(numa) if numa.lstrip("-").isdigit() else -1, chain)


def _shared_depth(a: Device, b: Device) -> int:
    depth = 0
    for x, y in zip(a.path, b.path):
        if x != y:
            break
        depth += 1
    return depth


def _same_switch(nic: Device, gpu: Device) -> bool:
    """Under one switch: a common bridge below the root port (root complex, root port, then
    the switch's upstream port)."""
    return _shared_depth(nic, gpu) >= 3


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read(directory: str, name: str) -> str:
    try:
        with open(os.path.join(directory, name), encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""

"""``gcache.transport.topology`` on sysfs trees built here as the kernel lays them out: PCI
devices under ``devices/pci<domain>:<bus>/<root port>/<switch up>/<switch down>/<device>``,
links from ``bus/pci/devices`` and ``class/infiniband``, NUMA nodes with their CPUs."""

from __future__ import annotations

import os

from gcache.transport.topology import (
    choose_nics,
    format_choices,
    format_cpulist,
    parse_cpulist,
    read_topology,
)

GPU, NIC = ("0x10de", "0x030200"), ("0x15b3", "0x020700")


class Tree:
    """A fake ``/sys``: ``add(kind, root, switch, slot, numa, name)`` puts a device under
    switch ``switch`` (None: straight on a root port) of root complex ``root``."""

    def __init__(self, root) -> None:
        self.root = root
        for node, cpus in ((0, "0-31,64-95"), (1, "32-63,96-127")):
            path = root / "devices" / "system" / "node" / f"node{node}"
            path.mkdir(parents=True)
            (path / "cpulist").write_text(cpus + "\n")
        (root / "bus" / "pci" / "devices").mkdir(parents=True)
        (root / "class" / "infiniband").mkdir(parents=True)

    def add(self, kind, root: int, switch: int | None, slot: int, numa: int,
            name: str | None = None) -> str:
        domain = f"pci0000:{root:02x}"
        port = 0x1f if switch is None else switch + 1
        chain = [domain, f"0000:{root:02x}:{port:02x}.0"]
        if switch is not None:                           # upstream and downstream ports
            chain += [f"0000:{root + 1:02x}:{switch:02x}.0", f"0000:{root + 2:02x}:{slot:02x}.0"]
        address = f"0000:{root + 3:02x}:{switch:02x}.{slot}" if switch is not None else \
            f"0000:{root + 0x40:02x}:00.{slot}"
        device = self.root.joinpath("devices", *chain, address)
        device.mkdir(parents=True)
        vendor, cls = kind
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(cls + "\n")
        (device / "numa_node").write_text(f"{numa}\n")
        os.symlink(device, self.root / "bus" / "pci" / "devices" / address)
        if name:
            (self.root / "class" / "infiniband" / name).mkdir()
            os.symlink(device, self.root / "class" / "infiniband" / name / "device")
        return address


def test_eight_gpus_with_eight_rail_nics_over_two_numa_nodes(tmp_path):
    tree = Tree(tmp_path)
    for i in range(8):
        root, numa = (0x00, 0) if i < 4 else (0x80, 1)
        tree.add(GPU, root, i, 0, numa)
        tree.add(NIC, root, i, 1, numa, f"mlx5_{i}")
    tree.add(NIC, 0x00, None, 0, 0, "mlx5_fe")            # the front-end NIC, on a root port
    choices = choose_nics(read_topology(str(tmp_path)))
    assert [c.nic for c in choices] == [f"mlx5_{i}" for i in range(8)]
    assert {c.reason for c in choices} == {"same-switch"}
    assert choices[0].cpus == parse_cpulist("0-31,64-95")
    assert choices[7].cpus == parse_cpulist("32-63,96-127") and choices[7].ucx_devices == "mlx5_7:1"
    assert "same-switch" in format_choices(choices) and "0-31,64-95" in format_choices(choices)


def test_eight_gpus_sharing_four_nics_take_the_one_under_their_switch(tmp_path):
    tree = Tree(tmp_path)
    for i in range(8):
        switch = i // 2
        root, numa = (0x00, 0) if switch < 2 else (0x80, 1)
        tree.add(GPU, root, switch, i % 2, numa)
    for switch in range(4):
        root, numa = (0x00, 0) if switch < 2 else (0x80, 1)
        tree.add(NIC, root, switch, 2, numa, f"mlx5_{switch}")
    choices = choose_nics(read_topology(str(tmp_path)))
    assert [c.nic for c in choices] == [f"mlx5_{i // 2}" for i in range(8)]
    assert {c.reason for c in choices} == {"same-switch"}


def test_the_front_end_nic_never_carries_data_while_a_rail_nic_is_left(tmp_path):
    """GPUs 0-3 have rail NICs; GPUs 4-7 (NUMA 1) have none under their switches, and the only
    NIC on their NUMA node is the front-end one: they share the rail NICs instead."""
    tree = Tree(tmp_path)
    for i in range(8):
        root, numa = (0x00, 0) if i < 4 else (0x80, 1)
        tree.add(GPU, root, i, 0, numa)
        if i < 4:
            tree.add(NIC, root, i, 1, numa, f"mlx5_{i}")
    tree.add(NIC, 0x80, None, 0, 1, "mlx5_fe")
    topology = read_topology(str(tmp_path))
    choices = choose_nics(topology)
    assert [c.nic for c in choices[:4]] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert all(c.reason == "rail" for c in choices[4:])
    assert sorted(c.nic for c in choices[4:]) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert choose_nics(topology, deny=["mlx5_fe"]) == choices
    # with the rail NICs denied the front-end NIC is what is left; denied too, nothing is
    rails = [f"mlx5_{i}" for i in range(4)]
    fallback = choose_nics(topology, deny=rails)
    assert {c.nic for c in fallback} == {"mlx5_fe"}
    assert fallback[4].reason == "front-end-same-numa" and fallback[0].reason == "front-end"
    assert {c.nic for c in choose_nics(topology, deny=rails + ["mlx5_fe"])} == {None}
    assert {c.nic for c in choose_nics(topology, allow=["mlx5_2"])} == {"mlx5_2"}


def test_a_host_without_rdma_or_gpus_reads_as_empty(tmp_path):
    topology = read_topology(str(tmp_path / "nothing"))
    assert topology.nics == () and topology.gpus == () and choose_nics(topology) == []
    assert parse_cpulist("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpulist(parse_cpulist("0-3,8,10-11")) == "0-3,8,10-11"
    assert format_cpulist(()) == "-"


def test_gcache_topology_prints_the_choice_per_gpu(tmp_path, capsys):
    from gcache.cli import main
    tree = Tree(tmp_path)
    for i in range(2):
        tree.add(GPU, 0x00, i, 0, 0)
        tree.add(NIC, 0x00, i, 1, 0, f"mlx5_{i}")
    assert main(["topology", "--sys-root", str(tmp_path), "--deny", "mlx5_1"]) == 0
    out = capsys.readouterr().out
    assert "RDMA NICs: mlx5_0, mlx5_1" in out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(r[0], r[2], r[3]) for r in rows] == [("0", "mlx5_0", "same-switch"),
                                                 ("1", "mlx5_0", "rail-same-numa")]
    assert main(["topology", "--sys-root", str(tmp_path / "none")]) == 0
    assert "no NVIDIA GPU" in capsys.readouterr().out


def rail_host(tmp_path, monkeypatch) -> Tree:
    """Two GPUs with rail NICs and a front-end NIC; this machine's CPU 1 is NUMA node 0's."""
    from gcache.transport import topology
    tree = Tree(tmp_path)
    for i in range(2):
        tree.add(GPU, 0x00, i, 0, 0)
        tree.add(NIC, 0x00, i, 1, 0, f"mlx5_{i}")
    tree.add(NIC, 0x00, None, 0, 0, "mlx5_fe")
    (tmp_path / "devices" / "system" / "node" / "node0" / "cpulist").write_text("1\n")
    monkeypatch.setattr(topology, "SYS_ROOT", str(tmp_path))
    return tree


def test_a_server_serves_every_rail_nic_and_a_client_its_gpus_own(tmp_path, monkeypatch):
    import pytest

    from gcache.transport.topology import for_gpu, rail_devices
    rail_host(tmp_path, monkeypatch)
    assert rail_devices() == ("mlx5_0:1", "mlx5_1:1")           # never the front-end NIC
    assert rail_devices(deny=["mlx5_1"]) == ("mlx5_0:1",)
    assert for_gpu(1).ucx_devices == "mlx5_1:1" and for_gpu(1).cpus == (1,)
    with pytest.raises(ValueError, match="gpu=2, but .* shows 2 NVIDIA GPUs"):
        for_gpu(2)


def test_a_client_of_one_gpu_runs_its_io_threads_on_that_gpus_cpus(tmp_path, monkeypatch):
    import pytest

    from gcache.sdk import Client
    from gcache.sdk.rail import rail_of
    rail_host(tmp_path, monkeypatch)
    if 1 not in os.sched_getaffinity(0):
        pytest.skip("this machine has no CPU 1 to bind to")
    with Client(["127.0.0.1:9"], gpu=1, io_threads=2) as client:
        threads = [client._d.submit(os.sched_getaffinity, 0).result() for _ in range(4)]
        assert all(cpus == {1} for cpus in threads), threads
        assert rail_of(client.config) == (("mlx5_1:1",), (1,))
    with Client(["127.0.0.1:9"], gpu=1, nixl_devices=["mlx5_0:1"]) as client:
        assert rail_of(client.config)[0] == ("mlx5_0:1",)       # named devices win
    with pytest.raises(ValueError, match="gpu=5"):
        Client(["127.0.0.1:9"], gpu=5)

"""Which NIC and CPUs serve a client: on a GPU host a client of one GPU (``ClientConfig.gpu``)
moves its KV through that GPU's rail NIC and runs its IO threads on that GPU's NUMA node
(``gcache.transport.topology``), so copies and completion polls never cross the socket link."""

from __future__ import annotations

import os

from gcache.config import ClientConfig


def rail_of(config: ClientConfig) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The UCX devices and IO-thread CPUs of this client: with ``gpu``, that GPU's NIC (unless
    ``nixl_devices`` names some) and its NUMA node's CPUs (``gcache.transport.topology``)."""
    if config.gpu < 0:
        return tuple(config.nixl_devices), ()
    from gcache.transport.topology import for_gpu
    choice = for_gpu(config.gpu, deny=config.nic_deny)
    devices = tuple(config.nixl_devices) or ((choice.ucx_devices,) if choice.ucx_devices else ())
    return devices, choice.cpus


def bind_to(cpus: tuple[int, ...]) -> None:
    """Run the calling IO thread on ``cpus`` (those it may use at all), so that its copies and
    polls stay on the GPU's NUMA node; nothing when none of them is usable."""
    usable = set(cpus) & os.sched_getaffinity(0)
    if usable:
        os.sched_setaffinity(0, usable)

"""CUDA tensors in and out of a mapped arena: one DMA each way, no bounce buffer.

The mapping is registered with ``cudaHostRegister`` once, which pins its pages and lets the GPU
copy engine read and write them directly; a copy between the mapping and a CUDA tensor is then a
single host-to-device (or device-to-host) DMA. torch is imported here and only here, and only
when a CUDA tensor is actually passed. Checksums are computed on the host side of the copy: the
arena bytes before a read leaves, the arena bytes after a write landed.
"""

from __future__ import annotations

from typing import Any

from gcache.buffer import BufferLike, device_bytes
from gcache.errors import DeviceError
from gcache.keys import Hasher, checksum
from gcache.transport.shm import ArenaMapping

_REGISTER_PORTABLE = 0x01


def after_callers_work(tensor: Any) -> None:
    """Wait, on the caller's thread, for the work it queued on its current stream: the copies
    run on the SDK's IO threads, whose streams do not see the caller's."""
    import torch

    torch.cuda.current_stream(tensor.device).synchronize()


def _register(mapping: ArenaMapping) -> None:
    if mapping.cuda_registered:
        return
    import torch

    pointer = mapping.array.ctypes.data
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    error = cudart.cudaHostRegister(pointer, mapping.size_bytes, _REGISTER_PORTABLE)
    code = int(getattr(error, "value", error))
    if code != 0:
        raise DeviceError(f"cudaHostRegister of the {mapping.size_bytes}-byte arena failed "
                          f"with CUDA error {code}")
    mapping.cuda_registered = True


def _host_view(mapping: ArenaMapping, offset: int, length: int) -> Any:
    import torch

    return torch.from_numpy(mapping.array[offset:offset + length])


def read_into_cuda(mapping: ArenaMapping, offset: int, length: int, out: BufferLike,
                   hasher: Hasher | None) -> None:
    """Copy arena bytes ``[offset, offset+length)`` into the CUDA tensor ``out``."""
    _register(mapping)
    source = _host_view(mapping, offset, length)
    if hasher is not None:
        # numpy's stubs make an ndarray a buffer on Python 3.12+ only (__buffer__)
        hasher.update(memoryview(mapping.array[offset:offset + length]))  # type: ignore[arg-type]
    device_bytes(out, what="out")[:length].copy_(source, non_blocking=False)


def write_from_cuda(mapping: ArenaMapping, offset: int, value: BufferLike,
                    hasher: Hasher | None) -> None:
    """Copy the CUDA tensor ``value`` into the arena at ``offset``."""
    _register(mapping)
    flat = device_bytes(value, what="value")
    _host_view(mapping, offset, flat.numel()).copy_(flat, non_blocking=False)
    if hasher is not None:
        # numpy's stubs make an ndarray a buffer on Python 3.12+ only (__buffer__)
        hasher.update(memoryview(
            mapping.array[offset:offset + flat.numel()]))  # type: ignore[arg-type]


def cuda_digest(tensor: Any, length: int) -> int:
    """xxh3_64 of a CUDA tensor's first ``length`` bytes, from a host copy: GPU Direct moves KV
    without the host, but a value is still checked end to end (``verify_checksum=False``
    skips the read side of it)."""
    host = device_bytes(tensor, what="value")[:length].cpu()
    return checksum(memoryview(host.numpy()))


def cuda_address(tensor: Any) -> tuple[int, int]:
    """(device pointer, GPU index) of a CUDA tensor's first byte."""
    return tensor.data_ptr(), tensor.device.index or 0

"""Turning a caller's buffer into a flat byte ``memoryview`` without copying it.

Accepted: anything with the buffer protocol (bytes, bytearray, memoryview, mmap, numpy arrays)
and contiguous CPU torch tensors. torch is not imported here: a tensor is recognised by its own
methods and exposed through its data pointer, which is valid for as long as the caller holds the
tensor (every SDK call holds it until the IO is done), and works for dtypes numpy lacks (bf16).
A CUDA tensor has no host address: ``as_memoryview`` refuses it, and ``as_bytes`` (for the
callers that hand buffers on to the SDK, whose links copy to and from device memory) passes it
on as a flat ``uint8`` view of itself, which slices and measures (``len``) like a memoryview.
"""

from __future__ import annotations

import ctypes
from typing import Any, TypeAlias

from gcache.errors import InvalidRequest, WrongType

# What the SDK takes as a value to store or a destination to fill: an object with the buffer
# protocol (bytes, bytearray, memoryview, mmap, a numpy array) or a contiguous torch tensor
# (CPU; or CUDA, where the link copies to and from device memory). The check is at run time
# (``as_memoryview``, ``as_bytes``), naming what was wrong: torch is never imported here, and
# Python 3.11 has no static type for "has the buffer protocol".
BufferLike: TypeAlias = Any


def is_tensor(obj: object) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _tensor_view(tensor: Any, *, what: str) -> memoryview:
    if not tensor.is_contiguous():
        raise InvalidRequest(f"{what} is a non-contiguous tensor of shape "
                             f"{tuple(tensor.shape)}; buffers must be contiguous")
    if tensor.device.type != "cpu":
        raise WrongType(f"{what} is a tensor on {tensor.device}; this transport takes CPU tensors")
    n_bytes = tensor.numel() * tensor.element_size()
    if n_bytes == 0:
        return memoryview(b"")
    array = (ctypes.c_ubyte * n_bytes).from_address(tensor.data_ptr())
    return memoryview(array).cast("B")


def is_cuda_tensor(obj: object) -> bool:
    return is_tensor(obj) and bool(getattr(obj, "is_cuda", False))


def nbytes(buffer: BufferLike) -> int:
    """Bytes in a flat byte view (what ``as_memoryview`` returns) or a CUDA tensor."""
    if is_cuda_tensor(buffer):
        n_bytes: int = buffer.numel() * buffer.element_size()
        return n_bytes
    return len(buffer)


def device_bytes(tensor: Any, *, what: str = "value") -> Any:
    """A device tensor's bytes as a flat ``uint8`` tensor: a view, no copy."""
    if not tensor.is_contiguous():
        raise InvalidRequest(f"{what} is a non-contiguous {tensor.device} tensor of shape "
                             f"{tuple(tensor.shape)}; buffers must be contiguous")
    import torch  # the caller has it: it made the tensor
    return tensor.reshape(-1).view(torch.uint8)


def as_bytes(obj: BufferLike, *, writable: bool, what: str = "value") -> Any:
    """``as_memoryview`` for host buffers; ``device_bytes`` for a CUDA tensor."""
    if is_cuda_tensor(obj):
        return device_bytes(obj, what=what)
    return as_memoryview(obj, writable=writable, what=what)


def as_memoryview(obj: BufferLike, *, writable: bool, what: str = "value") -> memoryview:
    """A flat unsigned-byte view of ``obj``.

    Raises WrongType (a TypeError) for an object that is no buffer or is read-only where
    ``writable`` is asked, InvalidRequest (a ValueError) for a non-contiguous one. ``what``
    names the argument in the message.
    """
    if is_tensor(obj):
        return _tensor_view(obj, what=what)
    if isinstance(obj, str):
        raise WrongType(f"{what} is a str; encode it to bytes first")
    try:
        view = memoryview(obj)
    except TypeError as exc:
        raise WrongType(f"{what} of type {type(obj).__name__} is not a buffer; pass bytes, "
                        "bytearray, memoryview, a contiguous numpy array or a CPU tensor") from exc
    if not view.c_contiguous:
        raise InvalidRequest(f"{what} is a non-contiguous buffer of shape {view.shape}; "
                             "buffers must be contiguous")
    if writable and view.readonly:
        raise WrongType(f"{what} is read-only ({type(obj).__name__}); pass a writable buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def memory_at(address: int, size: int, *, what: str = "region") -> memoryview:
    """A writable flat view of ``size`` bytes at a raw ``address`` that the caller owns.

    For engines that hand out their host KV pool as (pointer, size) pairs (SGLang's
    ``get_page_buffer_meta``): the view reads and writes the pool in place, so the SDK moves
    bytes straight between the pool and GCache. The memory must outlive every IO on the view.
    """
    if not isinstance(address, int) or isinstance(address, bool) or address <= 0:
        raise InvalidRequest(f"{what} address must be a positive int; got {address!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise InvalidRequest(f"{what} size must be a positive int; got {size!r}")
    return memoryview((ctypes.c_ubyte * size).from_address(address)).cast("B")

"""CUDA buffers of one TCP exchange, through the client's pinned staging
(``gcache.transport.cuda_staging``): host stand-ins for the exchange, landed on the device after
a read, given back to the pool at the end. Same-host links never come here: they DMA between the
tensor and the server's arena directly."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from gcache.buffer import BufferLike, as_memoryview, is_cuda_tensor
from gcache.sdk.protocol import ReadResult

if TYPE_CHECKING:
    from gcache.transport.cuda_staging import CudaStaging

R = TypeVar("R")


class TcpStaged:
    def __init__(self, staging: Callable[[], CudaStaging]) -> None:
        self._staging = staging                   # made on first use: torch only then
        self._hosts: list[Any] = []
        self._targets: dict[int, tuple[Any, Any]] = {}   # id(host view) -> (host, CUDA out)

    def __enter__(self) -> TcpStaged:
        return self

    def __exit__(self, *exc: object) -> None:
        for host in self._hosts:
            self._staging().give(host)
        self._hosts, self._targets = [], {}

    def value(self, value: BufferLike, what: str = "value") -> Any:
        """``value`` itself, or for a CUDA tensor a host copy of it."""
        if not is_cuda_tensor(value):
            return value
        host = self._staging().to_host(value, what)
        self._hosts.append(host)
        return as_memoryview(host, writable=False, what=what)

    def target(self, out: BufferLike, what: str = "out") -> Any:
        """``out`` itself, or for a CUDA tensor a host buffer to receive into."""
        if not is_cuda_tensor(out):
            return out
        host = self._staging().host_for(out)
        self._hosts.append(host)
        view = as_memoryview(host, writable=True, what=what)
        self._targets[id(view)] = (host, out)
        return view

    def land(self, target: BufferLike, result: R) -> R:
        """After a read into ``target``: a CUDA out gets its bytes (checksum good only)."""
        staged = self._targets.get(id(target))
        if staged is not None and isinstance(result, ReadResult) and result.checksum_ok:
            host, out = staged
            self._staging().to_device(host, out, result.length)
        return result

"""CUDA tensors over TCP: through pinned host buffers, one DMA each way on the client's stream.

A TCP socket reads and writes host memory, so a CUDA tensor on a TCP link is staged: a put copies
it device-to-host into a pinned buffer and sends that buffer; a read receives into a pinned buffer
and copies it host-to-device. The buffers come from one ``PinnedPool`` per client (allocated once,
reused, capped: ``ClientConfig.cuda_staging_bytes``), and the copies run on one CUDA stream per
device of the client's own, after the work the caller queued (the client waits for the caller's
stream when the call is made, on the caller's thread: these copies run on IO threads), and are
complete when these calls return. The checksum is the TCP path's own,
computed once over the host bytes as they are sent or received. torch is imported when the first
CUDA tensor arrives.
"""

from __future__ import annotations

import threading
from typing import Any

from gcache.buffer import device_bytes, nbytes
from gcache.transport.pinned import PinnedPool


class CudaStaging:
    def __init__(self, *, cap_bytes: int, wait_s: float) -> None:
        self.pool = PinnedPool(pin=True, cap_bytes=cap_bytes)
        self.wait_s = wait_s
        self._streams: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _stream(self, device: Any) -> Any:
        import torch
        with self._lock:
            stream = self._streams.get(device.index)
            if stream is None:
                # torch leaves Stream.__new__ unannotated
                stream = self._streams[device.index] = \
                    torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            return stream

    def to_host(self, tensor: Any, what: str = "value") -> Any:
        """A pinned host copy of ``tensor``'s bytes, complete on return."""
        import torch
        flat = device_bytes(tensor, what=what)
        host = self.pool.take(flat.numel(), timeout_s=self.wait_s)
        stream = self._stream(tensor.device)
        with torch.cuda.stream(stream):
            host.copy_(flat, non_blocking=True)
        stream.synchronize()
        return host

    def host_for(self, tensor: Any) -> Any:
        """A pinned buffer to receive ``tensor``'s bytes into."""
        return self.pool.take(nbytes(tensor), timeout_s=self.wait_s)

    def to_device(self, host: Any, tensor: Any, n_bytes: int, what: str = "out") -> None:
        """Copy ``host[:n_bytes]`` into the start of ``tensor``, complete on return."""
        import torch
        flat = device_bytes(tensor, what=what)
        stream = self._stream(tensor.device)
        with torch.cuda.stream(stream):
            flat[:n_bytes].copy_(host[:n_bytes], non_blocking=True)
        stream.synchronize()

    def give(self, host: Any) -> None:
        self.pool.give(host)

"""The ``nixl`` exchange: the control frames of ``gcache.sdk.leases`` on the TCP connection, the
values by NIXL READ / WRITE of the server's registered arena (``gcache.transport.nixl``).

A buffer the caller registered (``Client.register_buffer``) is the transfer's own end: the NIC
reads or writes it directly: an unhashed read as one request of ``io_size`` descriptors (the
bare loop's shape), a hashed read or a write as ``io_size`` requests a few at a time, each
piece hashed while the others travel; a CUDA tensor registered as VRAM is GPU Direct. Any other host
buffer moves through the client's bounce slots, one ``io_size`` piece at a time, copied (and
hashed) while the piece is cache-warm; any other CUDA tensor is staged through pinned host
memory first, as on TCP. Writes hash the value before it leaves and COMMIT has the server hash
the arena bytes; reads hash what landed only with ``verify_arena_reads`` (``gcache.sdk.leases``
says what stands in for it), since the server hashed those bytes at COMMIT and RDMA's own
end-to-end CRC covers the wire.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gcache.buffer import BufferLike, is_cuda_tensor
from gcache.errors import ProtocolError
from gcache.keys import checksum_stream
from gcache.sdk.ahead_hash import AheadHash
from gcache.sdk.leases import Extent, LeasedExchange, check_window
from gcache.sdk.protocol import ReadResult
from gcache.sdk.tcp_staging import TcpStaged
from gcache.transport.nixl import BounceSlots, NixlAgent, Region, Transfer

if TYPE_CHECKING:
    from gcache.transport.cuda_staging import CudaStaging

PIPELINE = 4             # io_size requests of one value in flight at once
# numpy's stubs make an ndarray a buffer (``__buffer__``) on Python 3.12+ only and mypy checks
# for 3.11, so each ndarray handed to a hasher below carries ``type: ignore[arg-type]``.


class NixlExchange(LeasedExchange):
    name = "nixl"

    def __init__(self, agent: NixlAgent, bounce: BounceSlots, *, remote: str, metadata: bytes,
                 arena_address: int, arena_bytes: int, lease_window_s: float, io_size: int,
                 timeout_s: float, staging: Callable[[], CudaStaging]) -> None:
        self.agent, self.bounce = agent, bounce
        self.remote, self.metadata = remote, metadata
        self.arena_address, self.arena_bytes = arena_address, arena_bytes
        self.lease_window_s = lease_window_s
        self._io_size, self._timeout_s = io_size, timeout_s
        self._staging = staging

    def copy_out(self, extent: Extent, out: BufferLike, *, verify: bool) -> bool:
        remote = self._remote_of(extent)
        if not is_cuda_tensor(out):
            return self._read_host(remote, extent, out, verify)
        region = self._registered(out, extent.length)
        if region is None:
            with TcpStaged(self._staging) as staged:            # unregistered GPU memory
                host = staged.target(out)
                ok = self._read_host(remote, extent, host, verify)
                staged.land(host, ReadResult(host, extent.length, ok))
                return ok
        self._move("READ", region, remote, extent.length)
        if not verify:
            return True
        from gcache.transport.cuda import cuda_digest
        return cuda_digest(out, extent.length) == extent.checksum

    def copy_in(self, extent: Extent, value: BufferLike,
                landed: Callable[[int, int], None] | None = None, *,
                ahead: AheadHash | None = None) -> int:
        remote = self._remote_of(extent)
        if is_cuda_tensor(value):
            region = self._registered(value, extent.length)
            if region is None:
                with TcpStaged(self._staging) as staged:        # unregistered GPU memory
                    return self._write_host(remote, extent, staged.value(value), landed)
            from gcache.transport.cuda import cuda_digest
            digest = cuda_digest(value, extent.length)
            check_window(extent)
            self._move("WRITE", region, remote, extent.length)
            if landed is not None:
                landed(0, extent.length)
            return digest
        return self._write_host(remote, extent, value, landed, ahead)

    # ---- host buffers -----------------------------------------------------------------------

    def _read_host(self, remote: int, extent: Extent, out: memoryview, verify: bool) -> bool:
        target = np.frombuffer(out, dtype=np.uint8, count=extent.length)
        hasher = checksum_stream() if verify else None
        if self.agent.covering(target.ctypes.data, extent.length) is not None:
            if hasher is None:         # nothing to overlap: one request, as the bare loop
                self._move("READ", Region(target.ctypes.data, extent.length), remote,
                           extent.length)
                return True

            stream = hasher                      # narrowed to a hasher for the closure

            def hashed(start: int, size: int) -> None:     # while later pieces travel
                stream.update(target[start:start + size])  # type: ignore[arg-type]

            self._pipelined("READ", target.ctypes.data, remote, extent.length, after=hashed)
            return stream.intdigest() == extent.checksum
        for start, size in self._pieces(extent.length, self.bounce.slot_bytes):
            slot = self.bounce.take(self._timeout_s)
            try:
                self._move("READ", self.bounce.region(slot), remote + start, size)
                piece = self.bounce.array(slot)[:size]
                if hasher is not None:
                    hasher.update(piece)  # type: ignore[arg-type]
                target[start:start + size] = piece
            finally:
                self.bounce.give(slot)
        return hasher is None or hasher.intdigest() == extent.checksum

    def _write_host(self, remote: int, extent: Extent, value: memoryview,
                    landed: Callable[[int, int], None] | None = None,
                    ahead: AheadHash | None = None) -> int:
        """Each piece is hashed (what ``ahead`` has not yet) just before it leaves, while the
        pieces before it travel."""
        source = np.frombuffer(value, dtype=np.uint8, count=extent.length)
        hashed = AheadHash(value) if ahead is None else ahead
        if self.agent.covering(source.ctypes.data, extent.length) is not None:
            def hash_then_check(start: int, size: int) -> None:   # before each piece leaves
                hashed.through(start + size)
                check_window(extent)

            self._pipelined("WRITE", source.ctypes.data, remote, extent.length,
                            before=hash_then_check, after=landed)
            return hashed.digest()
        for start, size in self._pieces(extent.length, self.bounce.slot_bytes):
            slot = self.bounce.take(self._timeout_s)
            try:
                hashed.through(start + size)
                self.bounce.array(slot)[:size] = source[start:start + size]
                check_window(extent)
                self._move("WRITE", self.bounce.region(slot), remote + start, size)
                if landed is not None:
                    landed(start, size)
            finally:
                self.bounce.give(slot)
        return hashed.digest()

    def _pipelined(self, op: str, local: int, remote: int, length: int, *,
                   before: Callable[[int, int], None] | None = None,
                   after: Callable[[int, int], None] | None = None) -> None:
        """One registered value moved as ``io_size`` requests, up to ``PIPELINE`` of them in
        flight: ``before`` runs for a piece just before it is posted, ``after`` (in order)
        once it has landed, so hashing overlaps the transfers of the pieces around it."""
        pending: deque[tuple[Transfer, int, int]] = deque()   # (transfer, start, size)

        def finish_oldest() -> None:
            transfer, start, size = pending.popleft()
            self.agent.wait(transfer)
            if after is not None:
                after(start, size)

        try:
            for start, size in self._pieces(length, self._io_size):
                if before is not None:
                    before(start, size)
                while True:
                    transfer = self.agent.start(op, Region(local + start, size), self.remote,
                                                remote + start, size, io_size=self._io_size,
                                                timeout_s=self._timeout_s, block=not pending)
                    if transfer is not None:
                        break
                    finish_oldest()                  # no free slot: our own oldest first
                pending.append((transfer, start, size))
                if len(pending) >= PIPELINE:
                    finish_oldest()
            while pending:
                finish_oldest()
        finally:
            for transfer, _, _ in pending:           # after a failure: drop the rest
                self.agent.cancel(transfer)

    # ---- helpers ------------------------------------------------------------------------------

    def _remote_of(self, extent: Extent) -> int:
        """The extent's address in the server's process; ProtocolError (a miss) when the server
        named memory outside the arena it registered."""
        if extent.offset < 0 or extent.offset + extent.length > self.arena_bytes:
            end = extent.offset + extent.length
            raise ProtocolError(f"server named bytes {extent.offset}..{end} outside its "
                                f"{self.arena_bytes}-byte arena")
        return self.arena_address + extent.offset

    def _registered(self, tensor: Any, length: int) -> Region | None:
        from gcache.transport.cuda import cuda_address
        pointer, device = cuda_address(tensor)
        region = self.agent.covering(pointer, length)
        return None if region is None else Region(pointer, length, "VRAM", device)

    def _pieces(self, length: int, most: int) -> list[tuple[int, int]]:
        step = min(self._io_size, most)
        return [(start, min(step, length - start)) for start in range(0, length, step)]

    def _move(self, op: str, local: Region, remote_address: int, length: int) -> None:
        self.agent.transfer(op, local, self.remote, remote_address, length,
                            io_size=self._io_size, timeout_s=self._timeout_s)

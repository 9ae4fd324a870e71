"""The ``tcp`` exchange: values inside the frames (PUT / GET, BATCH_PUT / BATCH_GET), so every
operation and batch finishes in one request per server and returns no extents. CUDA buffers go
through the client's pinned staging (``TcpStaged``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gcache.buffer import BufferLike
from gcache.errors import ProtocolError
from gcache.frame import Status
from gcache.keys import checksum
from gcache.sdk import protocol
from gcache.sdk.ahead_hash import AheadHash
from gcache.sdk.exchange import ReadItem, WriteItem
from gcache.sdk.leases import Extent
from gcache.sdk.protocol import Channel, ReadResult
from gcache.sdk.tcp_staging import TcpStaged

if TYPE_CHECKING:
    from gcache.transport.cuda_staging import CudaStaging


class TcpExchange:
    name = "tcp"
    reads_arena = False

    def __init__(self, *, io_size: int, staging: Callable[[], CudaStaging]) -> None:
        self._io_size = io_size
        self._staging = staging

    def read(self, ch: Channel, key: bytes, out: BufferLike, *,
             verify: bool) -> ReadResult | Status | None:
        with TcpStaged(self._staging) as staged:
            target = staged.target(out)
            return staged.land(target, protocol.read_value(ch, key, target, verify=verify))

    def write(self, ch: Channel, key: bytes, value: BufferLike, *, group: int,
              flags: int = 0) -> Status:
        with TcpStaged(self._staging) as staged:
            return protocol.put(ch, key, staged.value(value), io_size=self._io_size, group=group,
                                flags=flags)

    def start_reads(self, ch: Channel, keys: Sequence[bytes], outs: Sequence[BufferLike] | None, *,
                    verify: bool) -> list[ReadItem]:
        with TcpStaged(self._staging) as staged:
            targets = None if outs is None else \
                [staged.target(out, f"outs[{i}]") for i, out in enumerate(outs)]
            found = protocol.batch_read_values(ch, keys, targets, verify=verify)
            return list(found) if targets is None else \
                [staged.land(t, r) for t, r in zip(targets, found)]

    def start_writes(self, ch: Channel, keys: Sequence[bytes], values: Sequence[BufferLike], *,
                     group: int, flags: int = 0) -> list[WriteItem]:
        with TcpStaged(self._staging) as staged:
            sent = [staged.value(v, f"values[{i}]") for i, v in enumerate(values)]
            return list(protocol.batch_put(ch, keys, sent, [checksum(v) for v in sent],
                                           group=group, flags=flags))

    # TCP returns no extents, so a batch never gets here; a call would be a bug of ours.
    def copy_out(self, extent: Extent, out: BufferLike, *, verify: bool) -> bool:
        raise ProtocolError("a TCP exchange has no extents to copy out of")

    def end_reads(self, ch: Channel, handles: Sequence[int]) -> None:
        """Nothing is leased over TCP: values came with the reply."""

    def copy_in(self, extent: Extent, value: BufferLike,
                landed: Callable[[int, int], None] | None = None, *,
                ahead: AheadHash | None = None) -> int:
        raise ProtocolError("a TCP exchange has no extents to copy into")

    def end_writes(self, ch: Channel, handles: Sequence[int],
                   digests: Sequence[int]) -> list[Status]:
        return []                      # nothing was allocated: the statuses came at once

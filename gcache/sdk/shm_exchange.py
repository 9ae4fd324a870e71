"""The client side of same-host exchanges: small frames on the Unix socket, values copied once
between the caller's buffer and the server's mapped arena.

Read: LEASE -> copy out of the mapping (not hashed again unless ``verify_arena_reads``: the
server hashed those bytes at COMMIT) -> RELEASE without a reply, so the release costs a send,
not a round trip. Write: ALLOC (a single put hashes the value while it is in flight; a batch's
copies hash as they go) -> copy in, announcing each chunk with a no-reply in-place WRITE so the
server hashes it meanwhile -> COMMIT, whose reply says whether the server's own hash of the
arena bytes matched ours. The frames are ``gcache.sdk.leases``'; a
batch's copies are separate steps (``copy_out`` / ``copy_in``) so that the client runs them on
its IO threads in parallel.
"""

from __future__ import annotations

from collections.abc import Callable

from gcache.buffer import BufferLike, is_cuda_tensor
from gcache.keys import HASH_PIECE, checksum_stream
from gcache.sdk.ahead_hash import AheadHash
from gcache.sdk.leases import Extent, LeasedExchange, check_window
from gcache.transport.cuda import read_into_cuda, write_from_cuda
from gcache.transport.shm import COPY_CHUNK, ArenaMapping


class ShmExchange(LeasedExchange):
    name = "shm"

    def __init__(self, mapping: ArenaMapping) -> None:
        self.mapping = mapping
        self.lease_window_s = mapping.lease_window_s

    def copy_out(self, extent: Extent, out: BufferLike, *, verify: bool) -> bool:
        """Copy a leased value into ``out``; False when its checksum does not hold."""
        hasher = checksum_stream() if verify else None
        if is_cuda_tensor(out):
            read_into_cuda(self.mapping, extent.offset, extent.length, out, hasher)
        else:
            self.mapping.read_into(extent.offset, out[:extent.length], hasher)
        return hasher is None or hasher.intdigest() == extent.checksum

    def copy_in(self, extent: Extent, value: BufferLike,
                landed: Callable[[int, int], None] | None = None, *,
                ahead: AheadHash | None = None) -> int:
        """Copy ``value`` into an allocated extent, calling ``landed(start, size)`` after each
        chunk; returns its checksum (``ahead``: the hash the caller began, finished here).
        Raises WriteWindowPassed, before each chunk, once the extent's write window is over."""
        if is_cuda_tensor(value):
            hasher = checksum_stream()
            check_window(extent)
            write_from_cuda(self.mapping, extent.offset, value, hasher)
            if landed is not None:
                landed(0, extent.length)
            return hasher.intdigest()
        hashed = AheadHash(value) if ahead is None else ahead
        for start in range(0, extent.length, COPY_CHUNK):
            check_window(extent)
            end = min(extent.length, start + COPY_CHUNK)
            if hashed.hashed >= end:          # hashed during the ALLOC: one copy (COPY_CHUNK)
                self.mapping.write_from(extent.offset + start, value[start:end])
            else:                             # each piece hashed just before it is copied
                for piece in range(start, end, HASH_PIECE):
                    hashed.through(piece + HASH_PIECE)
                    self.mapping.write_from(extent.offset + piece,
                                            value[piece:piece + HASH_PIECE])
            if landed is not None:
                landed(start, end - start)
        return hashed.digest()

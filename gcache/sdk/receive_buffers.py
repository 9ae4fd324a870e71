"""Buffers that reads returning ``bytes`` receive into before the copy that makes the bytes.

A ``get`` that returns ``bytes`` needs somewhere to land the value first (a socket receive, an
arena copy, a NIXL transfer all write into a buffer; a ``bytes`` object cannot be written).
A fresh ``bytearray`` per read costs a zero-fill and, when the allocator hands back new pages,
a fault on each (first touches fill memory about ten times slower than a warm copy on these
VMs). The buffers here are kept and reused, so each read lands in memory touched before: 1 MiB
``get`` over shared memory went from 3.4-4.1 to 5.0 GB/s. The copy into the returned ``bytes``
remains, and at 4 MiB it is most of the cost.

A buffer is lent (``take``) to one read and given back (``give``) once the bytes are copied
out; a read that fails keeps it, and it is simply collected. Capacities are powers of two from
``SMALLEST`` (smaller values are cheap to allocate) to ``LARGEST`` (larger ones are rare and
allocated fresh); at most ``KEPT_BYTES`` are kept idle per process.
"""

from __future__ import annotations

import threading

SMALLEST = 64 << 10
LARGEST = 64 << 20
KEPT_BYTES = 64 << 20


class ReceiveBuffers:
    def __init__(self, *, kept_bytes: int = KEPT_BYTES) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[bytearray]] = {}     # capacity -> idle buffers
        self._kept, self._kept_max = 0, kept_bytes

    def take(self, length: int) -> memoryview:
        """A writable view of exactly ``length`` bytes, in a reused buffer when one fits."""
        if not SMALLEST <= length <= LARGEST:
            return memoryview(bytearray(length))
        capacity = 1 << (length - 1).bit_length()
        with self._lock:
            idle = self._free.get(capacity)
            if idle:
                buffer = idle.pop()
                self._kept -= capacity
            else:
                buffer = bytearray(capacity)            # zero-filled: touched once, here
        return memoryview(buffer)[:length]

    def give(self, view: memoryview) -> None:
        """Take back a buffer ``take`` lent, once nothing reads it any more."""
        buffer = view.obj
        if not isinstance(buffer, bytearray):
            return
        capacity = len(buffer)
        if capacity < SMALLEST or capacity > LARGEST or capacity & (capacity - 1):
            return                                      # not one of ours
        with self._lock:
            if self._kept + capacity <= self._kept_max:
                self._free.setdefault(capacity, []).append(buffer)
                self._kept += capacity

    def kept_bytes(self) -> int:
        with self._lock:
            return self._kept


# One per process: reads of every client land here, and what is kept is bounded as a whole.
RECEIVE_BUFFERS = ReceiveBuffers()

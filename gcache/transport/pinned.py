"""``PinnedPool``: reusable host buffers for copies to and from a GPU, with a cap.

A DMA between a GPU and host memory needs page-locked (pinned) host memory, and pinning is slow
(it maps and locks every page): a buffer is pinned once and reused for every copy after, never
allocated per IO. Buffers come in size classes (powers of two); a returned buffer is reused once
the event of its last copy has completed. The pool holds at most ``cap_bytes``: a request that
would pass it waits, up to ``timeout_s``, for a buffer to come back, then raises
``PoolExhausted`` (the caller counts a miss or a failed save; memory stays bounded). Free
buffers of other size classes are dropped to make room; torch's own pinned-memory cache keeps
what they held for later pins, so the process's pinned memory can reach about twice the cap.
torch is imported when the first buffer is made; on a host without CUDA (``pin=False``) the
buffers are plain host tensors.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from gcache.buffer import BufferLike
from gcache.errors import GCacheError, InvalidRequest

log = logging.getLogger(__name__)

MIN_CLASS_BYTES = 64 << 10


class PoolExhausted(GCacheError):
    """No pinned buffer came free within the wait; the pool is at its cap. A shortage of this
    host's memory, not a failure of any server."""


class CopyEvent(Protocol):
    """What a returned buffer waits on (``give(after=...)``): a ``torch.cuda.Event`` or ``DONE``."""

    def query(self) -> bool: ...


class _Done:
    """The event of a copy that is already complete."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


DONE = _Done()


def size_class(n_bytes: int) -> int:
    return max(MIN_CLASS_BYTES, 1 << max(0, n_bytes - 1).bit_length())


class PinnedPool:
    """``on_new(buffer)`` runs for every buffer the pool makes and ``on_drop(buffer)`` for every
    one it lets go (to make room under the cap): a client registers its staging there for
    NIXL (``Client.register_buffer`` / ``unregister_buffer``), so transfers use the pinned
    buffers themselves. A hook that raises is logged; the buffer serves on unregistered."""

    def __init__(self, *, pin: bool, cap_bytes: int,
                 on_new: Callable[[Any], object] | None = None,
                 on_drop: Callable[[Any], object] | None = None) -> None:
        if cap_bytes < MIN_CLASS_BYTES:
            raise InvalidRequest(f"cap_bytes={cap_bytes} is below one buffer ({MIN_CLASS_BYTES})")
        self.pin, self.cap_bytes = pin, cap_bytes
        self._on_new, self._on_drop = on_new, on_drop
        self._free: dict[int, list[Any]] = {}
        self._pending: list[tuple[Any, CopyEvent]] = []    # (buffer, event of its last copy)
        self._lock = threading.Lock()
        self.allocated_bytes = 0
        self.allocations = 0

    def take(self, n_bytes: int, *, timeout_s: float | None = None) -> Any:
        """A uint8 view of ``n_bytes`` over a buffer of this pool. Raises ``PoolExhausted``
        when none came free within ``timeout_s`` (at once for a size the cap can never
        hold)."""
        size = size_class(n_bytes)
        if size > self.cap_bytes:
            raise PoolExhausted(f"{n_bytes} bytes need a {size}-byte buffer; the pinned pool's "
                                f"cap is {self.cap_bytes} bytes")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            dropped: list[Any] = []
            with self._lock:
                buffer, reserved = self._reuse_or_reserve(size, dropped)
            for gone in dropped:            # outside the lock: a deregistration can be slow
                _run_hook(self._on_drop, gone, "on_drop")
            if buffer is not None:
                return buffer[:n_bytes]
            if reserved:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise PoolExhausted(f"no {size}-byte pinned buffer came free in {timeout_s}s "
                                    f"({self.allocated_bytes} of {self.cap_bytes} bytes held)")
            time.sleep(0.0005)
        import torch
        try:
            buffer = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
        except BaseException:
            with self._lock:                             # pinning failed: no buffer to count
                self.allocated_bytes -= size
                self.allocations -= 1
            raise
        _run_hook(self._on_new, buffer, "on_new")
        return buffer[:n_bytes]

    def _reuse_or_reserve(self, size: int, dropped: list[Any]) -> tuple[Any, bool]:
        """(a free buffer of ``size``, False), or (None, whether ``size`` bytes were reserved
        under the cap for a new one, dropping free buffers of other classes if need be: they
        go to ``dropped``). Called with the lock held."""
        self._reclaim()
        free = self._free.get(size)
        if free:
            return free.pop(), False
        for other, buffers in self._free.items():
            while buffers and self.allocated_bytes + size > self.cap_bytes:
                dropped.append(buffers.pop())   # torch's allocator keeps it for later pins
                self.allocated_bytes -= other
        if self.allocated_bytes + size > self.cap_bytes:
            return None, False
        self.allocated_bytes += size
        self.allocations += 1
        return None, True

    def give(self, view: Any, *, after: CopyEvent = DONE) -> None:
        """Return a view from ``take``; it is reused once ``after`` (an event) has completed."""
        base = view._base if view._base is not None else view
        with self._lock:
            self._pending.append((base, after))

    def _reclaim(self) -> None:
        still = []
        for buffer, event in self._pending:
            if event.query():
                self._free.setdefault(buffer.numel(), []).append(buffer)
            else:
                still.append((buffer, event))
        self._pending = still


def _run_hook(hook: Callable[[Any], object] | None, buffer: BufferLike, what: str) -> None:
    if hook is None:
        return
    try:
        hook(buffer)
    except Exception as exc:
        log.warning("pinned.%s_failed bytes=%d detail=%s", what, buffer.numel(), exc)

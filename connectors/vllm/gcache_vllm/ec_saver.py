"""Encoder outputs saved to GCache off the thread that runs the forward pass.

vLLM hands the EC connector each encoder output right after the encoder ran, on the forward
thread; a put there held the step for the copy to host and the network. The saver takes a host
copy instead (``Transfers.to_host``: on a GPU a DMA into a pinned buffer, on a stream of its
own after an event on the forward stream; on a CPU engine the tensor's own bytes, which the
queue keeps alive) and its own thread puts it once that copy has finished. At most
``MAX_PENDING`` saves wait: past that, and when no pinned buffer is free at once, a save is
skipped and counted (an encoder output is a cache entry; the forward pass never waits for
one). ``close`` puts what is queued before it returns.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from gcache.kv import PoolExhausted
from gcache.mm import EncoderCache
from gcache_vllm.staging import Transfers

log = logging.getLogger(f"vllm.{__name__}")      # vLLM's log; importable without vLLM

MAX_PENDING = 64
PINNED_BYTES = 1 << 30          # host staging the EC saves of one engine may pin


class EncoderSaver:
    def __init__(self, cache: EncoderCache, *, max_pending: int = MAX_PENDING) -> None:
        self._cache = cache
        self._queue: queue.Queue[tuple | None] = queue.Queue(maxsize=max_pending)
        self._transfers: dict[Any, Transfers] = {}        # by device
        self._lock = threading.Lock()
        self.counters = {"saves": 0, "save_failures": 0, "saves_skipped": 0}
        self._thread = threading.Thread(target=self._run, name="gcache-vllm-ec-save",
                                        daemon=True)
        self._thread.start()

    def submit(self, key: str, output: Any) -> bool:
        """Queue ``output`` (a tensor, on any device) to be put under ``key``; False when it
        was skipped (the queue full, no pinned buffer free)."""
        output = output.detach().contiguous()
        transfers = self._transfers.get(output.device)
        if transfers is None:
            transfers = self._transfers[output.device] = Transfers(
                output.device, pinned_bytes=PINNED_BYTES, client=self._cache.client)
        try:
            host, copied = transfers.to_host(output)
        except PoolExhausted as exc:
            return self._skipped(key, str(exc))
        try:
            self._queue.put_nowait((key, output.dtype, tuple(output.shape), host, copied,
                                    transfers))
        except queue.Full:
            transfers.release(host, after=copied)
            return self._skipped(key, f"{self._queue.maxsize} saves are waiting already")
        return True

    def wait(self) -> None:
        """Return once every save queued so far is put (or failed)."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _skipped(self, key: str, why: str) -> bool:
        self._count("saves_skipped")
        log.warning("gcache: the encoder output %s is not saved: %s", key, why)
        return False

    def _run(self) -> None:
        bound: set[Any] = set()
        while (item := self._queue.get()) is not None:
            key, dtype, shape, host, copied, transfers = item
            try:
                if transfers not in bound:      # this device current on the saver thread
                    transfers.bind_thread()
                    bound.add(transfers)
                copied.synchronize()
                stored = self._cache.put(key, host.view(dtype).reshape(shape))
                self._count("saves" if stored else "save_failures")
            except Exception:
                self._count("save_failures")
                log.exception("gcache: saving the encoder output %s failed", key)
            finally:
                transfers.release(host, after=copied)
                self._queue.task_done()
        self._queue.task_done()

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1

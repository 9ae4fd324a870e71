"""Host staging for KV on its way between a GPU's paged layers and GCache; imports torch only.

GCache's SDK moves host bytes, so on a GPU host a save copies the gathered layer to host memory
and a load copies the fetched bytes to the device. Both copies are DMAs from and to pinned
buffers, on streams of the connector's own, so the forward pass never waits for one:
- a save records an event on the forward stream after the layer's gather, and the save stream
  waits for it before the device-to-host copy; the saver thread waits for the copy's event
  before it puts the host bytes;
- a load's host-to-device copy runs on the load stream, and the forward stream waits for its
  event (on the GPU, not the host) before the scatter that uses the bytes.
Pinned buffers come from ``gcache.kv.PinnedPool`` (the SDK's): one per size class (powers of two),
reused once the copy that used them has finished, so a steady workload allocates nothing after
warm-up, and capped (``pinned_bytes``): a copy that finds no buffer free at once fails (a save is
skipped and counted, a load recomputed) rather than pin more host memory or hold up the forward
pass, which is the thread that asks. On a CPU-only engine the copies are plain tensor
operations and nothing is pinned, but a load's buffers still come from the pool: a fresh
buffer costs a page fault per 4 KiB the fetch first writes (a 16K-token prefix's 256 MiB
loaded at half the speed into new memory as into reused memory).

A load's bytes land in a ``StagingSink`` (a host buffer per layer, from ``Transfers``); a save
reads a layer's gathered rows through a ``GatheredSource``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gcache.kv import DONE, PinnedPool

DEFAULT_PINNED_BYTES = 4 << 30        # host staging one engine may pin (saves and loads)
POOL_WAIT_S = 0.0                     # the forward pass never waits for a buffer

class Transfers:
    """The copies between one device's KV and host staging (see the module docstring)."""

    def __init__(self, device: Any, *, pinned_bytes: int = DEFAULT_PINNED_BYTES,
                 client: Any = None) -> None:
        """``client``: the GCache client the staged bytes go through; each pinned buffer is
        registered with it (a no-op unless it uses NIXL), so transfers move straight from and
        to the pinned buffers instead of through its bounce slots."""
        self.device = device
        self.cuda = device.type == "cuda"
        register = getattr(client, "register_buffer", None)       # a Client, or a stand-in
        hooks = {} if register is None else {"on_new": register,
                                             "on_drop": client.unregister_buffer}
        self.pool = PinnedPool(pin=self.cuda, cap_bytes=pinned_bytes, **hooks)
        self._lent: set[int] = set()        # ids of the pool's views out for loads
        self._save_stream = torch.cuda.Stream(device) if self.cuda else None
        self._load_stream = torch.cuda.Stream(device) if self.cuda else None

    def to_host(self, rows: Any) -> tuple[Any, Any]:
        """Host bytes of ``rows`` (a contiguous tensor on the device) and the event after which
        they are complete. On the CPU: the rows' own bytes, complete at once."""
        flat = rows.reshape(-1).view(torch.uint8)
        if not self.cuda:
            return flat, DONE
        gathered = torch.cuda.current_stream(self.device).record_event()
        host = self.pool.take(flat.numel(), timeout_s=POOL_WAIT_S)
        copied = torch.cuda.Event(blocking=True)          # the saver sleeps on it, not spins
        with torch.cuda.stream(self._save_stream):
            self._save_stream.wait_event(gathered)
            host.copy_(flat, non_blocking=True)
            flat.record_stream(self._save_stream)         # not reused before the copy ends
            self._save_stream.record_event(copied)
        return host, copied

    def bind_thread(self) -> None:
        """Make this device current on the calling thread (the saver): a thread's first CUDA
        call would otherwise make a context on GPU 0."""
        if self.cuda:
            torch.cuda.set_device(self.device)

    def host_buffer(self, n_bytes: int) -> Any:
        """A host buffer a load fetches into, from the pool (pinned on a CUDA host)."""
        view = self.pool.take(n_bytes, timeout_s=POOL_WAIT_S)
        self._lent.add(id(view))
        return view

    def to_device(self, host: Any) -> tuple[Any, Any]:
        """``host`` bytes on the device, ready for work queued next on the current stream, and
        the event after which ``host`` may be reused."""
        if not self.cuda:
            return host, DONE
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._load_stream):
            staged = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
            staged.copy_(host, non_blocking=True)
            copied = self._load_stream.record_event()
        current.wait_event(copied)
        staged.record_stream(current)                      # used by the scatter on `current`
        return staged, copied

    def release(self, host: Any, after: Any = DONE) -> None:
        """Give back a buffer of ``host_buffer`` or ``to_host`` once ``after`` completes (on the
        CPU ``to_host`` lends the rows' own bytes, which are not the pool's)."""
        if self.cuda or id(host) in self._lent:
            self._lent.discard(id(host))
            self.pool.give(host, after=after)


class StagingSink:
    """``gcache.kv.KVSink`` for one load: one host buffer per layer for the span the load
    asks of it (every page of a full layer, the window tail of a sliding one)."""

    def __init__(self, transfers: Transfers, bytes_per_token: Callable[[int], int],
                 span_of: Callable[[int], tuple[int, int]]) -> None:
        self.transfers, self.bytes_per_token, self.span_of = transfers, bytes_per_token, span_of
        self.spans: dict[int, tuple[int, int, Any]] = {}   # layer -> (start, stop, host bytes)
        self.copied: dict[int, Any] = {}                   # layer -> event of its copy to device
        self.reported = False                              # take_load_errors has seen it

    def write_target(self, layer: int, start: int, stop: int):
        if layer not in self.spans:
            first, last = self.span_of(layer)
            self.spans[layer] = (first, last, self.transfers.host_buffer(
                (last - first) * self.bytes_per_token(layer)))
        first, last, host = self.spans[layer]
        if not first <= start <= stop <= last:
            raise ValueError(f"layer {layer}: tokens [{start}, {stop}) are outside the staged "
                             f"span [{first}, {last})")
        bpt = self.bytes_per_token(layer)
        return host[(start - first) * bpt:(stop - first) * bpt]

    def release(self) -> None:
        """Give the host buffers back, each once its copy to the device is done."""
        for layer, (_, _, host) in self.spans.items():
            self.transfers.release(host, self.copied.get(layer, DONE))
        self.spans, self.copied = {}, {}


class GatheredSource:
    """``gcache.kv.KVSource`` over one layer's gathered tokens ``[first, n)`` in host bytes;
    earlier tokens (out of a sliding window) are not held, which ``KVStore.save`` takes as
    "skip that tail"."""

    def __init__(self, layout: Any, host: Any, first: int) -> None:
        self.layout, self.first, self.flat = layout, first, host

    def read(self, layer: int, start: int, stop: int):
        if start < self.first:
            return None
        bpt = self.layout.layer_bytes_per_token(layer)
        return self.flat[(start - self.first) * bpt:(stop - self.first) * bpt]

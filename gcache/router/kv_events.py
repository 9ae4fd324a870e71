"""vLLM's KV events into an instance's ``PrefixView``.

vLLM (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``)
publishes ``(topic, seq, payload)`` frames on a ZMQ PUB socket; the payload is a msgpack
``[ts, [event, ...], data_parallel_rank]`` whose events are maps tagged by ``type``:
``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``,
``medium``, ``group_idx``, ``kv_cache_spec_kind``), ``BlockRemoved`` (``block_hashes``,
``medium``, ``group_idx``) and ``AllBlocksCleared``. Events a secondary offload tier owns
(``ownership`` set: vLLM's tiering, ``gcache_vllm.tier``) are not the engine's and are skipped.

The engine's block hashes cannot be recomputed here (they depend on its hash function and, with
``PYTHONHASHSEED`` unset, on a random seed), so the feed keeps them only as names: a stored
block's key in the view is the router's own chained hash of its tokens (``view_hashes``, the
function a prompt's lookup uses), reached from its parent's, and ``BlockRemoved`` is translated
through the same map. A block whose parent the feed never saw is skipped: its chain is unknown.

Only full-attention groups feed the view (a hybrid model publishes one ``BlockStored`` per KV
cache group; a sliding group's chain says nothing about a reusable prefix). A sequence number
that goes back means the engine restarted, and one that skips means events were dropped (ZMQ's
high-water mark): either way the view is cleared, since a view that claims pages the engine no
longer has sends it traffic for nothing (research/router.md §5).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from gcache.kv.page_keys import page_hashes
from gcache.router.views import PrefixView

log = logging.getLogger(__name__)

ROOT = b"gcache.router/1"
MEDIUM_TIERS = {"GPU": "gpu", None: "gpu", "CPU": "host"}


def view_hashes(token_ids: Sequence[int] | np.ndarray, block_size: int,
                parent: bytes = ROOT) -> list[bytes]:
    """Chained hashes of every full block of ``token_ids``, continuing from ``parent``: the keys
    of a prompt's blocks in the views (``gcache.kv.page_keys.page_hashes`` under the router's
    own root)."""
    return page_hashes(token_ids, block_size, parent)


class EventFeed:
    """Applies one engine's decoded event batches to its view (thread-safe through the view)."""

    def __init__(self, view: PrefixView, block_size: int) -> None:
        self.view, self.block_size = view, block_size
        self._names: OrderedDict[Any, bytes] = OrderedDict()    # engine hash -> view hash
        self._capacity = 2 * view.capacity_pages
        self._full_groups: set[Any] = {None}
        self._last_seq: int | None = None
        self.skipped = 0         # blocks whose parent or block size did not fit

    def reset(self) -> None:
        self.view.cleared()
        self._names.clear()
        self._last_seq = None

    def apply(self, seq: int, batch: Any) -> None:
        if self._last_seq is not None and seq != self._last_seq + 1:
            log.info("router.events seq %d after %d: %s; clearing the view", seq,
                     self._last_seq, "engine restarted" if seq <= self._last_seq
                     else "events were dropped")
            self.reset()
        self._last_seq = seq
        events = batch[1] if isinstance(batch, (list, tuple)) and len(batch) >= 2 else []
        for event in events:
            if isinstance(event, dict):
                self._apply_one(event)

    def _apply_one(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "AllBlocksCleared":
            self.reset()
            return
        tier = MEDIUM_TIERS.get(event.get("medium"))
        if tier is None or event.get("ownership") is not None:
            # another offload tier's (STORAGE, or a secondary tier's, e.g. GCacheTier's
            # ownership "gcache"): not this engine's memory. What GCache holds reaches the
            # router by asking GCache itself (gcache_hits), exactly, not by expiring events.
            return
        if kind == "BlockStored":
            spec = event.get("kv_cache_spec_kind")
            if spec is not None and spec != "full_attention":
                return
            self._full_groups.add(event.get("group_idx"))
            self._stored(event, tier)
        elif kind == "BlockRemoved" and event.get("group_idx") in self._full_groups:
            names = [self._names.get(h) for h in event.get("block_hashes") or ()]
            self.view.removed([n for n in names if n is not None], tier=tier)

    def _stored(self, event: dict[str, Any], tier: str) -> None:
        engine_hashes = list(event.get("block_hashes") or ())
        parent = event.get("parent_block_hash")
        root = ROOT if parent is None else self._names.get(parent)
        tokens = event.get("token_ids") or []
        if root is None or event.get("block_size") != self.block_size \
                or len(tokens) != len(engine_hashes) * self.block_size:
            self.skipped += len(engine_hashes)
            return
        ours = view_hashes(tokens, self.block_size, root)
        for engine_hash, mine in zip(engine_hashes, ours):
            self._names[engine_hash] = mine
            self._names.move_to_end(engine_hash)
        while len(self._names) > self._capacity:
            self._names.popitem(last=False)
        self.view.stored(ours, tier=tier)


class EventSubscriber:
    """A thread that reads one engine's KV events from ``endpoint`` into ``feed`` until
    ``close``."""

    def __init__(self, endpoint: str, feed: EventFeed, *, name: str) -> None:
        import msgspec
        import zmq
        self._decode = msgspec.msgpack.Decoder().decode
        self._zmq = zmq
        self.endpoint, self.feed = endpoint, feed
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"gcache-router-events-{name}")
        self._thread.start()

    def _run(self) -> None:
        poller = self._zmq.Poller()
        poller.register(self._socket, self._zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(200):
                continue
            frames = self._socket.recv_multipart()
            if len(frames) != 3:
                continue
            try:
                batch = self._decode(frames[2])
            except Exception as exc:        # a bad frame is dropped, the feed goes on
                log.warning("router.events undecodable frame from %s: %s", self.endpoint, exc)
                continue
            self.feed.apply(int.from_bytes(frames[1], "big"), batch)
        self._socket.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

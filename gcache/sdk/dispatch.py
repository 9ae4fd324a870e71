"""Where an SDK request goes and what happens when it fails.

``Dispatcher`` owns placement (the ring), routes and links to servers, the IO threads, and the
one rule that turns a failed exchange into counted misses: the link is closed, the server is
marked suspect and its route forgotten, and the caller gets ``MISS``. ``Client`` (the API) and
``batch`` (multi-phase batch exchanges) both go through it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple

from gcache.config import ClientConfig
from gcache.errors import (
    ProtocolError,
    ServerError,
    TransportError,
)
from gcache.keys import key_hash
from gcache.outcomes import error_miss
from gcache.placement import PlacedMap, Placement
from gcache.sdk.exchange import Exchange
from gcache.sdk.metrics import ClientStats
from gcache.sdk.pool import ServerPool
from gcache.sdk.protocol import Channel
from gcache.sdk.rail import bind_to, rail_of
from gcache.sdk.routes import Link, Routes

if TYPE_CHECKING:
    from gcache.transport.cuda_staging import CudaStaging

log = logging.getLogger(__name__)
T = TypeVar("T")
Ts = TypeVarTuple("Ts")
# A batch's placement: one group for every key (None: each key by itself), or one per key.
Groups = bytes | None | list[bytes | None]
BATCH_MAX = 4096             # keys per request frame (the wire allows 65535)


class Miss:
    """Returned instead of a result when an exchange became a miss (already counted)."""

    def __repr__(self) -> str:
        return "MISS"


MISS = Miss()


class Dispatcher:
    def __init__(self, config: ClientConfig, stats: ClientStats) -> None:
        self.config = config
        self.stats = stats
        self.epoch = 0
        # without masters, the placement is this client's own; with them, the map's
        self.own_placement = Placement(vnodes=config.vnodes, group_width=config.group_width)
        # replaced whole: readers take one reference, no lock
        self._placed = PlacedMap({}, None, self.own_placement)
        if config.servers:
            self.place_on(0, PlacedMap({a: (a, 1.0) for a in config.servers}, None,
                                       self.own_placement))
        self._cuda_staging: CudaStaging | None = None
        self._staging_lock = threading.Lock()
        devices, cpus = rail_of(config)
        self.routes = Routes(transport=config.transport, timeout_s=config.timeout_s,
                             io_size=config.io_size, token=config.token,
                             staging=self.cuda_staging,
                             transfers_in_flight=config.transfers_in_flight,
                             nixl_devices=devices,
                             nixl_workers=config.io_threads + 1)   # and the calling thread
        self.pool = ServerPool(connect=self.routes.connect, suspect_s=config.suspect_s,
                               idle_max=config.io_threads + 1)
        self._io = ThreadPoolExecutor(config.io_threads, thread_name_prefix="gcache-io",
                                      initializer=bind_to, initargs=(cpus,))

    def cuda_staging(self) -> CudaStaging:
        """This client's pinned staging for CUDA tensors on TCP links (made on first use)."""
        with self._staging_lock:
            if self._cuda_staging is None:
                from gcache.transport.cuda_staging import CudaStaging
                self._cuda_staging = CudaStaging(cap_bytes=self.config.cuda_staging_bytes,
                                                 wait_s=self.config.timeout_s)
            return self._cuda_staging

    def close(self) -> None:
        self._io.shutdown(wait=True)
        self.pool.close()
        self.routes.close()

    # ---- placement ------------------------------------------------------------------------------

    def place_on(self, epoch: int, placed: PlacedMap) -> None:
        """Place keys from now on as ``placed`` says (the map of ``epoch``)."""
        self._placed = placed
        self.epoch = epoch

    def addresses(self) -> list[str]:
        """Data-plane addresses of the live servers in the current map."""
        placed = self._placed
        return sorted(placed.address_of[sid] for sid in placed.ring.live)

    def verifies(self, exchange: Exchange) -> bool:
        """Whether reads over ``exchange`` hash the bytes they land: always bytes that came in
        a reply, bytes copied out of an arena only with ``verify_arena_reads`` (the server
        hashed them at COMMIT; ``leases.copy_held`` checks that the lease held instead)."""
        cfg = self.config
        return cfg.verify_checksum and (cfg.verify_arena_reads or not exchange.reads_arena)

    @staticmethod
    def group_at(group: Groups, i: int) -> bytes | None:
        """Key ``i``'s group in a batch's ``group``."""
        return group[i] if isinstance(group, list) else group

    @staticmethod
    def groups_of(group: Groups, idx: Sequence[int]) -> Groups:
        """The ``group`` of a batch of the keys ``idx`` of another."""
        return [group[i] for i in idx] if isinstance(group, list) else group

    def owner(self, key: bytes, group: bytes | None) -> str | None:
        return self._owners(group)(key)

    def owners(self, group: bytes | None) -> Callable[[bytes], str | None]:
        """Key -> owner address for keys of ``group``, under one snapshot of the map."""
        return self._owners(group)

    def _owners(self, group: bytes | None) -> Callable[[bytes], str | None]:
        """Key -> owner address under one snapshot of the map; a group's slots are placed once."""
        return self._placed.owners(0 if group is None else key_hash(group))

    def plan(self, keys: Sequence[bytes], group: Groups, *,
             one_group_each: bool = False) -> list[tuple[str | None, list[int]]]:
        """(server, key indices) per request: keys grouped by owner, at most BATCH_MAX each.
        ``one_group_each``: with a group per key, a request holds keys of one group only (a
        put request carries one placement group for all its keys)."""
        by_request: dict[tuple[str | None, bytes | None], list[int]] = {}
        if isinstance(group, list):
            owners: dict[bytes | None, Callable[[bytes], str | None]] = {}
            for i, key in enumerate(keys):
                g = group[i]
                if g not in owners:
                    owners[g] = self._owners(g)
                by_request.setdefault((owners[g](key), g if one_group_each else None),
                                      []).append(i)
        else:
            owner = self._owners(group)
            for i, key in enumerate(keys):
                by_request.setdefault((owner(key), group), []).append(i)
        return [(address, idx[start:start + BATCH_MAX])
                for (address, _), idx in by_request.items()
                for start in range(0, len(idx), BATCH_MAX)]

    # ---- IO threads -----------------------------------------------------------------------------

    def submit(self, fn: Callable[[*Ts], T], *args: *Ts) -> Future[T]:
        return self._io.submit(fn, *args)

    def parallel(self, jobs: Sequence[Callable[[], T]]) -> list[T]:
        """Run ``jobs`` on the IO threads; their results in order (the caller only waits)."""
        futures = [self._io.submit(job) for job in jobs]
        return [f.result() for f in futures]

    # ---- links and misses -----------------------------------------------------------------------

    def acquire(self, address: str | None, n_keys: int) -> Link | Miss:
        if address is None:
            self.stats.miss("no_server", n_keys)
            return MISS
        if self.pool.is_suspect(address):
            self.stats.miss("suspect", n_keys)
            return MISS
        try:
            return self.pool.acquire(address)
        except (TransportError, ProtocolError, ServerError) as exc:
            return self._failed(None, address, exc, n_keys)

    def run(self, link: Link, fn: Callable[[Channel], T], n_keys: int) -> T | Miss:
        """Run ``fn`` on ``link``; on failure the link is closed and the keys counted as misses."""
        try:
            return fn(self.channel(link))
        except (TransportError, ProtocolError, ServerError) as exc:
            return self._failed(link, link.address, exc, n_keys)
        except BaseException:
            link.close()              # a bad ``out`` (or a bug) may leave a reply half read
            raise

    def channel(self, link: Link) -> Channel:
        return Channel(link.conn, timeout_s=self.config.timeout_s,
                       max_value_size=self.config.max_value_size)

    def release(self, link: Link) -> None:
        self.pool.release(link)

    def call(self, address: str | None, fn: Callable[[Channel], T], n_keys: int = 1) -> T | Miss:
        """Acquire a link to ``address``, run ``fn`` on it, give it back: the one-phase case."""
        return self.call_exchange(address, lambda _, ch: fn(ch), n_keys)

    def call_exchange(self, address: str | None, fn: Callable[[Exchange, Channel], T],
                      n_keys: int = 1) -> T | Miss:
        """``call`` for a function of the link's exchange too (the value-moving operations)."""
        link = self.acquire(address, n_keys)
        if isinstance(link, Miss):
            return MISS
        result = self.run(link, lambda ch: fn(link.exchange, ch), n_keys)
        if result is not MISS:
            self.pool.release(link)
        return result

    def _failed(self, link: Link | None, address: str, exc: Exception, n_keys: int) -> Miss:
        self.pool.fail(link, address)
        self.routes.forget(address)
        reason = error_miss(exc)
        self.stats.miss(reason, n_keys)
        level = logging.ERROR if reason == "auth" else logging.WARNING   # misconfigured, not lost
        # The message, never the exception: a handler that keeps records (pytest's log capture,
        # a MemoryHandler) would keep its traceback, whose frames hold the caller's buffers (a
        # CPU tier of vLLM's that could then not be unmapped), long after the call returned.
        log.log(level, "sdk.miss server=%s reason=%s detail=%s", address, reason, str(exc))
        return MISS

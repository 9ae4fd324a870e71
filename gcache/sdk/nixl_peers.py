"""This client's side of NIXL: one agent (made on first use), its bounce slots, the buffers the
caller registered, and one ``NixlExchange`` per server, rebuilt when a server presents another
agent (a restart) and dropped when its route is forgotten (a failure)."""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError
from typing import TYPE_CHECKING, Any

from gcache.buffer import BufferLike, as_memoryview, is_cuda_tensor, nbytes
from gcache.errors import ConnectFailed, InvalidRequest, ProtocolError
from gcache.sdk.nixl_exchange import NixlExchange

if TYPE_CHECKING:
    from gcache.transport.cuda_staging import CudaStaging
    from gcache.transport.nixl import BounceSlots, NixlAgent, Region

log = logging.getLogger(__name__)
# Longest a client's close waits for its NIXL agent to close (``NixlPeers.close``).
CLOSE_WAIT_S = 5.0
BOUNCE_SLOT_MAX = 4 << 20


class NixlPeers:
    def __init__(self, *, io_size: int, timeout_s: float, in_flight: int,
                 devices: Sequence[str], staging: Callable[[], CudaStaging],
                 workers: int = 1) -> None:
        self._io_size, self._timeout_s = io_size, timeout_s
        self._in_flight, self._devices, self._workers = in_flight, tuple(devices), workers
        self._staging = staging
        self._lock = threading.Lock()
        self._agent: NixlAgent | None = None
        self._bounce: BounceSlots | None = None
        self._exchanges: dict[str, NixlExchange] = {}
        self._adder = ThreadPoolExecutor(1, thread_name_prefix="gcache-nixl-add")
        self._adding: dict[bytes, Future[str]] = {}       # metadata -> its add, done or not

    def _started(self) -> tuple[NixlAgent, BounceSlots]:
        with self._lock:
            if self._agent is None:
                from gcache.transport.nixl import BounceSlots, NixlAgent
                agent = NixlAgent("client", devices=self._devices, in_flight=self._in_flight,
                                  workers=self._workers)
                self._bounce = BounceSlots(agent, slot_bytes=min(self._io_size, BOUNCE_SLOT_MAX),
                                           slots=self._in_flight)
                self._agent = agent
            assert self._bounce is not None              # made with the agent, just above
            return self._agent, self._bounce

    def exchange(self, address: str, facts: dict[str, Any], *,
                 lease_window_s: float) -> NixlExchange:
        """The exchange for the server whose HELLO ``facts`` these are. Raises ProtocolError
        for a malformed ``nixl`` fact, ConnectFailed when its agent cannot be added."""
        metadata, arena_address = _nixl_fact(address, facts)
        with self._lock:
            known = self._exchanges.get(address)
        if known is not None and known.metadata == metadata:
            return known
        if known is not None:
            self.forget(address)                 # a restarted server: another agent
        agent, bounce = self._started()
        remote = self._add(address, agent, metadata)
        exchange = NixlExchange(agent, bounce, remote=remote, metadata=metadata,
                                arena_address=arena_address, arena_bytes=facts["arena_bytes"],
                                lease_window_s=lease_window_s, io_size=self._io_size,
                                timeout_s=self._timeout_s, staging=self._staging)
        with self._lock:
            self._exchanges[address] = exchange
        return exchange

    def _add(self, address: str, agent: NixlAgent, metadata: bytes) -> str:
        """The server's agent added to ours, within one IO timeout: adding it connects to it
        (UCX endpoints), and a server whose data port answers while its NIXL address does not
        would hold the caller for the kernel's connect timeout (minutes). The add goes on in
        the background; until it is done the server is a miss, never a stall."""
        with self._lock:
            adding = self._adding.get(metadata)
            if adding is None or (adding.done() and adding.exception() is not None):
                adding = self._adder.submit(agent.add_remote, metadata)
                self._adding[metadata] = adding
        try:
            return adding.result(timeout=self._timeout_s)
        except TimeoutError:
            raise ConnectFailed(f"{address}: adding its NIXL agent took over the IO timeout "
                                f"({self._timeout_s}s)") from None
        except Exception as exc:
            raise ConnectFailed(f"{address}: its NIXL agent could not be added: {exc}") from None

    def forget(self, address: str) -> None:
        with self._lock:
            exchange = self._exchanges.pop(address, None)
        if exchange is not None:
            with self._lock:
                self._adding.pop(exchange.metadata, None)
            exchange.agent.forget_remote(exchange.metadata)

    def register(self, buffer: BufferLike) -> None:
        """Register ``buffer`` with this client's agent (once; a part of a registered buffer
        is registered already). The agent keeps ``buffer`` alive until ``unregister``."""
        agent, _ = self._started()
        agent.register(_region_of(buffer), owner=buffer)

    def unregister(self, buffer: BufferLike) -> bool:
        """Undo ``register(buffer)``; False when ``buffer`` itself was never registered (a part
        of a registered buffer is not: the whole is unregistered with the whole)."""
        with self._lock:
            agent = self._agent
        if agent is None:
            return False
        region = _region_of(buffer)
        return agent.deregister(region.address, region.length)

    def registered_regions(self) -> int:
        """Regions this client's agent registered (0 before it exists)."""
        with self._lock:
            agent = self._agent
        return 0 if agent is None else agent.regions()

    def close(self) -> None:
        """Close the agent, waiting ``CLOSE_WAIT_S`` at most: NIXL's own close waits for an
        add of a peer that does not answer (a kernel connect timeout, minutes), and a client
        must close in bounded time. An agent left behind so is logged; its process is ending
        or dropping this client, and nothing transfers through it again."""
        self._adder.shutdown(wait=False, cancel_futures=True)   # a stuck add ends with us
        with self._lock:
            agent, self._agent, self._exchanges = self._agent, None, {}
        if agent is None:
            return
        closing = threading.Thread(target=agent.close, name="gcache-nixl-close", daemon=True)
        closing.start()
        closing.join(CLOSE_WAIT_S)
        if closing.is_alive():
            log.warning("nixl.close_abandoned waited_s=%.1f reason=a peer being added does not "
                        "answer", CLOSE_WAIT_S)


def _region_of(buffer: BufferLike) -> Region:
    from gcache.transport.nixl import Region
    if is_cuda_tensor(buffer):
        from gcache.transport.cuda import cuda_address
        pointer, device = cuda_address(buffer)
        return Region(pointer, nbytes(buffer), "VRAM", device)
    import numpy as np
    view = as_memoryview(buffer, writable=False, what="buffer")
    if len(view) == 0:
        raise InvalidRequest("buffer is empty; there is nothing to register")
    return Region(np.frombuffer(view, dtype=np.uint8).ctypes.data, len(view))


def _nixl_fact(address: str, facts: dict[str, Any]) -> tuple[bytes, int]:
    fact = facts.get("nixl")
    if not isinstance(fact, dict) or not isinstance(fact.get("metadata"), str) \
            or not isinstance(fact.get("arena_address"), int) \
            or not isinstance(facts.get("arena_bytes"), int):
        raise ProtocolError(f"{address} sent a malformed nixl fact: {fact!r}")
    try:
        return base64.b64decode(fact["metadata"], validate=True), fact["arena_address"]
    except (binascii.Error, ValueError):
        raise ProtocolError(f"{address} sent NIXL metadata that is not base64") from None

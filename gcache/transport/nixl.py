"""RDMA and GPU Direct through NIXL (``nixl-cu12``, UCX backend): one agent per process, memory
registered once, transfers posted as descriptors of at most ``io_size`` bytes and polled to
completion on the calling (IO) thread.

A server registers its whole arena once and hands its agent's metadata to clients only in the
reply to a successful handshake (``HELLO`` facts after ``AUTH``): the metadata carries the
remote keys that let a peer read and write the arena. A client adds each server's agent once,
registers its own buffers once (``register``: host memory as DRAM, CUDA tensors as VRAM, so a
GPU host moves KV straight between the NIC and GPU memory) and READs / WRITEs extents the
control connection leased or allocated. On hosts with RDMA NICs UCX drives them with verbs
(RC/DC, multi-rail, GPUDirect); elsewhere the same calls run over UCX's shared-memory and TCP
transports, which is how this module is tested.

NIXL is imported here and only here, when the first agent is made; ``available()`` says whether
it can be.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gcache.errors import ConnectionLost, IOTimeout

if TYPE_CHECKING:
    from nixl_cu12._api import nixl_agent, nixl_xfer_handle

log = logging.getLogger(__name__)
_SPIN_S = 1e-3                # how long a waiter polls flat out before sleeping between polls
_POLL_SLEEP_S = 50e-6
_PROGRESS_WAIT_US = 1000      # UCX's progress thread: the longest wait for an event, in µs
MAX_WORKERS = 16              # UCX workers of one agent
_names = itertools.count()


def available() -> bool:
    """Whether NIXL imports here (``pip install --no-deps nixl-cu12==1.5.1``)."""
    try:
        import nixl_cu12._api  # noqa: F401
    except ImportError:
        return False
    return True


def has_rdma_nic(sysfs: str = "/sys") -> bool:
    """Whether this host has an RDMA device (``/sys/class/infiniband``): what ``transport=
    "auto"`` asks before it prefers NIXL over TCP for a remote server."""
    try:
        return bool(os.listdir(os.path.join(sysfs, "class", "infiniband")))
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class Region:
    """Registered memory: ``kind`` is "DRAM" or "VRAM"; ``device`` the GPU for VRAM."""

    address: int
    length: int
    kind: str = "DRAM"
    device: int = 0

    @property
    def end(self) -> int:
        return self.address + self.length


@dataclass(slots=True)
class Transfer:
    """A posted request: ``NixlAgent.wait`` or ``cancel`` it exactly once."""

    handle: nixl_xfer_handle | None
    what: str
    deadline: float
    state: str = "PROC"


def waiting_agent(name: str) -> nixl_agent:
    """A NIXL agent whose UCX progress thread sleeps between events, safe to call from many
    threads at once (``NIXL_THREAD_SYNC_RW``: transfers concurrent, registrations exclusive).

    ``nixl_agent`` fixes the progress thread's delay at 0, and UCX's progress thread waits
    on its workers' event fds with that as the timeout: a busy loop, one core per agent even
    when idle (measured here: 2.97 CPU-seconds over 3 idle seconds; on two cores the server's
    and the client's agents took both, and every control frame waited for a time slice). So
    the agent is rebuilt with a delay before any backend exists; the wrapper's methods call
    the native agent it holds. No backend yet: the caller creates it (``bench/nixl_bare.py``
    measures the bare limit on agents made here, so both sides of a ratio have one config)."""
    import nixl_cu12._bindings as nixlBind
    from nixl_cu12._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t

    sync = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
    agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=[],
                                               sync_mode=sync))
    native = nixlBind.nixlAgentConfig()
    native.useProgThread, native.useListenThread = True, False
    native.syncMode, native.pthrDelay = sync.value, _PROGRESS_WAIT_US
    native.captureTelemetry = False
    agent.agent = nixlBind.nixlAgent(name, native)
    return agent


class NixlAgent:
    """One NIXL agent with the UCX backend. ``devices`` is UCX's device list (for example
    ``["mlx5_0:1"]``, from ``gcache.transport.topology``); empty lets UCX choose. ``workers``:
    UCX workers, one per thread that will move data (a server's agent only serves). Thread-safe:
    registration and remote agents under a lock, transfers from any thread."""

    def __init__(self, role: str, *, devices: Sequence[str] = (), in_flight: int = 8,
                 workers: int = 1) -> None:
        self.name = f"gcache-{role}-{os.getpid()}-{next(_names)}-{os.urandom(4).hex()}"
        self._agent = waiting_agent(self.name)
        # One UCX worker per calling thread (NIXL picks a worker per thread, round robin): the
        # threads of one worker take turns on its lock, which halved batch reads over four IO
        # threads (measured: 1.1 GB/s with one worker, 2.7 with four).
        # At most MAX_WORKERS: each worker has its own endpoint (on a NIC, its own queue pair)
        # to every server, and beyond a few threads per core more workers buy nothing.
        params = {"num_workers": str(min(max(1, workers), MAX_WORKERS))}
        if devices:
            params["ucx_devices"] = ",".join(devices)
        self._agent.create_backend("UCX", params)
        self._lock = threading.Lock()
        self._regions: list[Region] = []          # sorted by address
        # region, NIXL descs (``nixlRegDList``: the bindings have no stubs), owner
        self._registered: list[tuple[Region, Any, object]] = []
        self._stuck: list[tuple[Region, Any, object]] = []   # deregistrations NIXL refused
        self._remotes: dict[bytes, str] = {}      # metadata -> remote agent name
        self._slots = threading.BoundedSemaphore(max(1, in_flight))

    # ---- memory ---------------------------------------------------------------------------------

    def register(self, region: Region, owner: object = None) -> bool:
        """Register ``region`` once; False (a no-op) for a region inside one already
        registered. ``owner``, the object whose memory it is, is kept until ``deregister``:
        a registration outlives nothing it names, since memory freed under it would hand its
        addresses to the next allocation while the NIC still maps the old pages (there, NIXL
        refuses every transfer; on a NIC, a WRITE would land in memory nobody reads)."""
        with self._lock:
            if self._covering(region.address, region.length) is not None:
                return False
            descs = self._agent.register_memory(
                [(region.address, region.length, region.device, "")], region.kind)
            self._registered.append((region, descs, owner))
            bisect.insort(self._regions, region, key=lambda r: r.address)
            return True

    def deregister(self, address: int, length: int) -> bool:
        """Deregister the region that ``register`` made at exactly ``[address, address +
        length)`` and drop its owner; False when there is none. A transfer of it still in
        flight fails (a miss)."""
        with self._lock:
            found = next((entry for entry in self._registered
                          if (entry[0].address, entry[0].length) == (address, length)), None)
            if found is None:
                return False
            self._registered.remove(found)
            self._regions.remove(found[0])
        try:
            self._agent.deregister_memory(found[1])
        except Exception as exc:
            # Still registered as far as NIXL knows: its memory must stay alive.
            with self._lock:
                self._stuck.append(found)
            log.warning("nixl.deregister_failed address=%#x detail=%s", address, exc)
            return False
        return True

    def covering(self, address: int, length: int) -> Region | None:
        """The registered region holding ``[address, address + length)``, if any."""
        with self._lock:
            return self._covering(address, length)

    def _covering(self, address: int, length: int) -> Region | None:
        i = bisect.bisect_right([r.address for r in self._regions], address) - 1
        if i >= 0 and address + length <= self._regions[i].end:
            return self._regions[i]
        return None

    def regions(self) -> int:
        """How many regions are registered (what ``register`` made, bounce slots included)."""
        with self._lock:
            return len(self._regions)

    def metadata(self) -> bytes:
        """What a peer needs to reach this agent's registered memory (call after register)."""
        return self._agent.get_agent_metadata()

    # ---- peers ----------------------------------------------------------------------------------

    def add_remote(self, metadata: bytes) -> str:
        """The peer agent's name; added once per metadata (``NixlPeers`` never adds one
        metadata twice at once). Adding connects to the peer and may take a kernel connect
        timeout (minutes) for a peer that does not answer: it runs outside the lock, which every
        transfer's ``covering`` takes, so one dead peer never stalls IO to the others."""
        with self._lock:
            name = self._remotes.get(metadata)
        if name is not None:
            return name
        added = self._agent.add_remote_agent(metadata)
        name = added.decode() if isinstance(added, bytes) else added
        with self._lock:
            return self._remotes.setdefault(metadata, name)

    def forget_remote(self, metadata: bytes) -> None:
        """Drop a peer (a server that failed or restarted): its next metadata is added anew."""
        with self._lock:
            name = self._remotes.pop(metadata, None)
        if name is not None:
            try:
                self._agent.remove_remote_agent(name)
            except Exception as exc:
                log.info("nixl.remove_remote_failed agent=%s detail=%s", name, exc)

    # ---- transfers ------------------------------------------------------------------------------

    def transfer(self, op: str, local: Region, remote: str, remote_address: int, length: int, *,
                 io_size: int, timeout_s: float) -> None:
        """Move ``length`` bytes between ``local`` (registered, its first bytes) and
        ``remote_address`` of agent ``remote``: ``op`` "READ" pulls them here, "WRITE" pushes
        them there. Raises IOTimeout or ConnectionLost."""
        started = self.start(op, local, remote, remote_address, length, io_size=io_size,
                             timeout_s=timeout_s)
        assert started is not None                     # a blocking start posts or raises
        self.wait(started)

    def start(self, op: str, local: Region, remote: str, remote_address: int, length: int, *,
              io_size: int, timeout_s: float, block: bool = True) -> Transfer | None:
        """Post one request of ``io_size`` descriptors (``transfer``'s arguments) and return at
        once; ``wait`` for it. At most ``in_flight`` requests of this agent are posted at a
        time: a start beyond that waits for a slot, up to ``timeout_s`` (IOTimeout), or with
        ``block`` False returns None at once (a caller holding transfers of its own finishes
        one of them first, so that callers never wait on each other's slots)."""
        deadline = time.monotonic() + timeout_s
        if not (self._slots.acquire(timeout=timeout_s) if block else
                self._slots.acquire(blocking=False)):
            if not block:
                return None
            raise IOTimeout(f"NIXL {op} of {length} bytes found no transfer slot in time")
        what = f"NIXL {op} of {length} bytes to {remote}"
        pieces = [(o, min(io_size, length - o)) for o in range(0, length, io_size)]
        try:
            mine = self._agent.get_xfer_descs(
                [(local.address + o, n, local.device) for o, n in pieces], local.kind)
            theirs = self._agent.get_xfer_descs(
                [(remote_address + o, n, 0) for o, n in pieces], "DRAM")
            handle = self._agent.initialize_xfer(op, mine, theirs, remote)
        except Exception as exc:
            self._slots.release()
            raise ConnectionLost(f"{what} could not start: {exc}") from None
        transfer = Transfer(handle, what, deadline)
        try:
            transfer.state = self._agent.transfer(handle)
        except Exception as exc:
            self._done(transfer)
            raise ConnectionLost(f"{what} failed to post: {exc}") from None
        return transfer

    def wait(self, transfer: Transfer) -> None:
        """Poll ``transfer`` to completion on this thread: spin for a while (a NIC finishes an
        ``io_size`` piece in microseconds), then sleep between polls. Raises IOTimeout past
        its deadline or ConnectionLost when it failed; released either way."""
        try:
            state, began = transfer.state, time.monotonic()
            while state not in ("DONE", "ERR"):
                now = time.monotonic()
                if now > transfer.deadline:
                    raise IOTimeout(f"{transfer.what} timed out")
                if now - began > _SPIN_S:
                    time.sleep(_POLL_SLEEP_S)
                assert transfer.handle is not None       # only ``_done``, below, clears it
                state = self._agent.check_xfer_state(transfer.handle)
            if state == "ERR":
                raise ConnectionLost(f"{transfer.what} failed")
        except (IOTimeout, ConnectionLost):
            raise
        except Exception as exc:
            raise ConnectionLost(f"{transfer.what} failed: {exc}") from None
        finally:
            self._done(transfer)

    def cancel(self, transfer: Transfer) -> None:
        """Give up a started transfer (an earlier one of the same value failed)."""
        self._done(transfer)

    def _done(self, transfer: Transfer) -> None:
        if transfer.handle is not None:
            self._release(transfer.handle)
            transfer.handle = None
            self._slots.release()

    def _release(self, handle: nixl_xfer_handle) -> None:
        try:
            self._agent.release_xfer_handle(handle)
        except Exception as exc:
            log.warning("nixl.release_failed detail=%s", exc)

    def close(self) -> None:
        """Deregister everything (before the memory goes away) and drop the peers."""
        with self._lock:
            registered, self._registered, self._regions = self._registered, [], []
            remotes, self._remotes = list(self._remotes.values()), {}
        for name in remotes:
            try:
                self._agent.remove_remote_agent(name)
            except Exception:
                pass
        for _, descs, _ in registered:
            try:
                self._agent.deregister_memory(descs)
            except Exception as exc:
                log.warning("nixl.deregister_failed detail=%s", exc)


class BounceSlots:
    """Registered host memory for buffers nobody registered (a ``get``'s fresh bytes, a
    caller's one-off array): ``slots`` pieces of ``slot_bytes``, each taken by one transfer
    of at most that many bytes and copied to or from the caller's buffer. Registering every
    such buffer would cost more than the copy: a registration pins pages and, on a NIC, makes
    a memory region."""

    def __init__(self, agent: NixlAgent, *, slot_bytes: int, slots: int) -> None:
        self.slot_bytes = slot_bytes
        self._memory = np.empty(slot_bytes * slots, dtype=np.uint8)
        self._base = self._memory.ctypes.data
        agent.register(Region(self._base, self._memory.nbytes))
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(slots):
            self._free.put(i)

    def take(self, timeout_s: float) -> int:
        """A free slot's index. Raises IOTimeout when none frees up within ``timeout_s``."""
        try:
            return self._free.get(timeout=timeout_s)
        except queue.Empty:
            raise IOTimeout("every NIXL bounce slot stayed busy for one IO timeout") from None

    def give(self, slot: int) -> None:
        self._free.put(slot)

    def region(self, slot: int) -> Region:
        return Region(self._base + slot * self.slot_bytes, self.slot_bytes)

    def array(self, slot: int) -> np.ndarray:
        start = slot * self.slot_bytes
        return self._memory[start:start + self.slot_bytes]

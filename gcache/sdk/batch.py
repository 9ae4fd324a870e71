"""Batch exchanges: one request per server, servers in parallel, copies in parallel.

Each batch runs the three phases of ``gcache.sdk.exchange`` on the IO threads while the caller
waits: per server, ``start_*`` on a link that is then held; the ``Extent``s it returned copied
in jobs of a few MiB, so two IO threads move two jobs at once (a copy runs in numpy, or NIXL
polls, with the GIL released); per server, on the held link, ``end_*``. Over TCP the first
phase moves the values and the batch ends there. Holding the link across phases matters: a
server drops what a connection leases or allocates when that connection closes, and the pool may
close surplus idle links.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar, overload

from gcache.buffer import BufferLike, nbytes
from gcache.errors import ConnectionLost, IOTimeout, TransportError
from gcache.frame import FLAG_PARENT, Status, with_parent
from gcache.keys import group_hash
from gcache.prefetched import Prefetched
from gcache.sdk import protocol
from gcache.sdk.dispatch import MISS, Dispatcher, Groups, Miss
from gcache.sdk.exchange import Exchange, ReadItem, WriteItem
from gcache.sdk.leases import Extent, WriteWindowPassed, copied, written
from gcache.sdk.outcome import Answer, put_outcome, read_outcome
from gcache.sdk.protocol import Channel, ReadResult
from gcache.sdk.receive_buffers import RECEIVE_BUFFERS
from gcache.sdk.routes import Link
from gcache.transport.pinned import PoolExhausted

log = logging.getLogger(__name__)

COPY_JOB_BYTES = 4 << 20         # a batch's copies run on the IO threads in jobs this big
PUT_CHUNK_KEYS = 256      # keys a batch put allocates, copies and commits at a time
RETRY_CHUNK_MIN = 8       # a chunk this small whose windows pass is not tried again


class Late:
    """A copy refused because its write window had passed: the value is put again."""


LATE = Late()
T = TypeVar("T")
Item = TypeVar("Item")
# A server's link held between a batch's phases, its keys' indices and their first-phase items
# (``MISS`` for each key whose CUDA buffer found no staging).
Held = tuple[Link, list[int], Sequence[Item | Miss]]
# Per key, the keys any of which, held by its server, shows the key's prefix is there (None: no
# parents given).
Parents = Sequence[Sequence[bytes]] | None


def batch_put(d: Dispatcher, keys: list[bytes], values: list[BufferLike], group: Groups, *,
              chunk: int = PUT_CHUNK_KEYS, flags: int = 0,
              parents: Parents = None) -> list[bool]:
    """Store ``keys``, ``chunk`` at a time. Over shared memory or NIXL a value must be copied
    within the write window (half the server's lease TTL) counted from its ALLOC: one phase
    of thousands of ALLOCs before the first copy let the window of the first ones pass (a
    3000-key batch under a 1 s TTL on a busy machine). Values whose window passed all the
    same (a machine busy enough) are put once more, in chunks an eighth the size.
    ``parents``: per key, the candidates for its parent (``wire_keys``)."""
    if len(keys) <= chunk:
        return _batch_put(d, keys, values, group, chunk, flags, parents)
    return [ok for start in range(0, len(keys), chunk)
            for ok in _batch_put(d, keys[start:start + chunk], values[start:start + chunk],
                                 d.groups_of(group, range(start, min(start + chunk, len(keys)))),
                                 chunk, flags,
                                 None if parents is None else parents[start:start + chunk])]


def wire_keys(d: Dispatcher, address: str | None, keys: list[bytes],
              parents: Sequence[Sequence[bytes]] | None, group: bytes | None,
              flags: int) -> tuple[list[bytes], int]:
    """The key fields and flags of a put of ``keys`` (all of one ``group``) to ``address``.
    Each key's parent is the first of its candidates that ``address`` owns too under the
    same group: a server can only tell whether a parent it would hold is gone. None when no
    candidate is, or the server does not take parents (its HELLO did not say so)."""
    if not parents or address is None or not d.routes.takes_parents(address):
        return keys, flags
    owners = d.owners(group)
    chosen = [next((p for p in candidates if owners(p) == address), b"")
              for candidates in parents]
    if not any(chosen):
        return keys, flags
    return [with_parent(k, p) for k, p in zip(keys, chosen)], flags | FLAG_PARENT


def _batch_put(d: Dispatcher, keys: list[bytes], values: list[BufferLike], group: Groups,
               chunk: int, flags: int, parents: Parents) -> list[bool]:
    results = [False] * len(keys)

    def start(address: str | None, idx: list[int]) -> Held[WriteItem] | None:
        d.stats.request("put", len(idx))
        link = d.acquire(address, len(idx))
        if isinstance(link, Miss):
            return None
        named = d.group_at(group, idx[0])             # the request's one group
        wired, wire_flags = wire_keys(d, address, [keys[i] for i in idx],
                                      None if parents is None else [parents[i] for i in idx],
                                      named, flags)
        items = _started(d, link, len(idx), lambda ch: link.exchange.start_writes(
            ch, wired, [values[i] for i in idx], group=group_hash(named), flags=wire_flags))
        if isinstance(items, Miss):
            return None
        if not any(isinstance(item, Extent) for item in items):
            _finish_puts(d, link, idx, items, values, results)
            return None
        return link, idx, items

    held = [h for h in d.parallel([partial(start, a, idx)
                                   for a, idx in d.plan(keys, group, one_group_each=True)])
            if h is not None]
    notices = {id(link): _Notices(d, link) for link, _, _ in held}
    copies = [(link, i, extent, values[i]) for link, idx, items in held
              for i, extent in zip(idx, items) if isinstance(extent, Extent)]
    retry = chunk > RETRY_CHUNK_MIN
    digests = [digest for job in d.parallel([partial(_copy_in_job, d, job, retry, notices)
                                             for job in _copy_jobs(copies)])
               for digest in job]
    late = [i for (_, i, _, _), digest in zip(copies, digests) if digest is LATE]
    digest_of = {i: digest for (_, i, _, _), digest in zip(copies, digests)}   # i: key index

    def commit(link: Link, idx: list[int], items: Sequence[WriteItem | Miss]) -> None:
        # A value whose copy failed is not committed: the server drops its extent at the TTL.
        todo = [(i, e, digest) for i, e in zip(idx, items)
                if isinstance(e, Extent) and isinstance(digest := digest_of[i], int)]
        statuses = d.run(link, lambda ch: link.exchange.end_writes(
            ch, [e.handle for _, e, _ in todo], [digest for _, _, digest in todo]), len(todo))
        # a failed copy is a miss counted already; a key with no extent has its status
        by_key = {i: MISS if isinstance(e, Extent) else e for i, e in zip(idx, items)}
        mine: set[int] = set()
        if not isinstance(statuses, Miss):
            by_key.update({i: s for (i, _, _), s in zip(todo, statuses)})
            if retry:        # its window passed between copy and commit: put again, as LATE
                mine = {i for (i, _, _), s in zip(todo, statuses) if s == Status.UNKNOWN_HANDLE}
                expired.extend(mine)
        kept = [i for i in idx if i not in mine]
        _finish_puts(d, link, kept, MISS if isinstance(statuses, Miss) else
                     [by_key[i] for i in kept], values, results)

    expired: list[int] = []           # list.extend from the commit threads: atomic
    d.parallel([partial(commit, *h) for h in held])
    late += expired
    if late:
        again = batch_put(d, [keys[i] for i in late], [values[i] for i in late],
                          d.groups_of(group, late), chunk=chunk // 8, flags=flags,
                          parents=None if parents is None else [parents[i] for i in late])
        for i, ok in zip(late, again):
            results[i] = ok
    return results


def _started(d: Dispatcher, link: Link, n_keys: int,
             start: Callable[[Channel], Sequence[Item]]) -> Sequence[Item | Miss] | Miss:
    """A batch's first phase on ``link``; staging that ran out is ``staging`` misses."""
    try:
        return d.run(link, start, n_keys)
    except PoolExhausted as exc:
        return _no_staging(d, n_keys, exc)


class _Notices:
    """The in-place WRITE notices of one held link's copies, sent by the IO threads as they
    copy, so the server hashes each piece as it lands (the single put does the same) instead of
    the whole value at COMMIT; one at a time, since a connection is not thread-safe."""

    def __init__(self, d: Dispatcher, link: Link) -> None:
        self._ch = d.channel(link)
        self._lock = threading.Lock()

    def of(self, extent: Extent) -> Callable[[int, int], None]:
        def landed(start: int, size: int) -> None:
            with self._lock:
                written(self._ch, extent.handle, start, size)
        return landed


def _copy_in_job(d: Dispatcher, job: list[tuple[Link, int, Extent, BufferLike]], retry: bool,
                 notices: dict[int, _Notices]) -> list[int | Late | None]:
    return [_copy_in(d, link, extent, value, retry, notices[id(link)].of(extent))
            for link, _, extent, value in job]


def _copy_in(d: Dispatcher, link: Link, extent: Extent, value: BufferLike, retry: bool,
             landed: Callable[[int, int], None]) -> int | Late | None:
    """One value's copy into the arena; None (counted as a miss) when it failed, ``LATE``
    (not counted) when its write window had passed and the batch will put it again."""
    try:
        return link.exchange.copy_in(extent, value, landed)
    except WriteWindowPassed as exc:
        if retry:
            log.info("sdk.write_window_passed bytes=%d: put again", extent.length)
            return LATE
        _copy_failed(d, link, extent, exc)
        return None
    except TransportError as exc:
        _copy_failed(d, link, extent, exc)
        return None


def _copy_jobs(copies: list[tuple[Link, int, Extent, BufferLike]],
               ) -> list[list[tuple[Link, int, Extent, BufferLike]]]:
    """The copies cut into IO-thread jobs of about ``COPY_JOB_BYTES`` each, one link's a job:
    a job per value cost a submit, a future and a thread switch for each of a load's (or a
    save's) pages, more than copying a 256 KiB page takes; jobs of a few MiB still spread a
    large batch over the IO threads."""
    jobs: list[list[tuple[Link, int, Extent, BufferLike]]] = []
    size = 0
    for copy in copies:
        if not jobs or jobs[-1][0][0] is not copy[0] or size >= COPY_JOB_BYTES:
            jobs.append([])
            size = 0
        jobs[-1].append(copy)
        size += copy[2].length
    return jobs


def _copy_job(d: Dispatcher, job: list[tuple[Link, int, Extent, BufferLike]],
              ) -> list[ReadResult | None]:
    return [_copy_out(d, link, extent, target) for link, _, extent, target in job]


def _copy_out(d: Dispatcher, link: Link, extent: Extent, target: BufferLike) -> ReadResult | None:
    """One value's copy out of the arena; None (counted as a miss) when the server named
    memory outside its arena, the transfer failed, or the server went during the copy."""
    try:
        return ReadResult(target, extent.length, copied(
            link.exchange, link.conn, extent, target, verify=d.verifies(link.exchange)))
    except TransportError as exc:
        _copy_failed(d, link, extent, exc)
        return None


def _copy_failed(d: Dispatcher, link: Link, extent: Extent, exc: TransportError) -> None:
    """A lost transfer (a NIXL agent gone) forgets the route, so the next link adds the
    server's agent afresh; the control link carries on for the batch's other keys."""
    if isinstance(exc, ConnectionLost):
        reason = "connection_lost"
        d.routes.forget(link.address)
    else:
        reason = "timeout" if isinstance(exc, IOTimeout) else "protocol"
    d.stats.miss(reason, 1)
    log.warning("sdk.copy_failed server=%s bytes=%d reason=%s detail=%s", link.address,
                extent.length, reason, str(exc))    # not exc: as in Dispatcher._failed


def _finish_puts(d: Dispatcher, link: Link, idx: list[int],
                 statuses: Sequence[WriteItem | Miss] | Miss, values: list[BufferLike],
                 results: list[bool]) -> None:
    if isinstance(statuses, Miss):
        return                                    # the link is closed, the misses counted
    d.release(link)
    for n, i in enumerate(idx):
        status = statuses[n]
        assert not isinstance(status, Extent)     # extents were committed (or missed) first
        results[i] = put_outcome(d.stats, status, nbytes(values[i]))


def read_one(d: Dispatcher, key: bytes, out: BufferLike, group: bytes | None) -> Answer:
    """One key's read on its owner, over its link's exchange."""
    return call_staged(d, d.owner(key, group),
                       lambda x, ch: x.read(ch, key, out, verify=d.verifies(x)))


def call_staged(d: Dispatcher, address: str | None,
                exchange: Callable[[Exchange, Channel], T]) -> T | Miss:
    """``d.call_exchange`` of a one-key operation that may stage a CUDA buffer: no pinned buffer
    in time is a ``staging`` miss (the link was closed before any IO on it), not a failed
    server."""
    try:
        return d.call_exchange(address, exchange)
    except PoolExhausted as exc:
        return _no_staging(d, 1, exc)[0]


def _no_staging(d: Dispatcher, n_keys: int, exc: Exception) -> list[Miss]:
    """Misses for CUDA buffers that found no pinned staging within the IO timeout."""
    d.stats.miss("staging", n_keys)
    log.warning("sdk.miss reason=staging detail=%s", str(exc))    # as in Dispatcher._failed
    return [MISS] * n_keys


@overload
def batch_read(d: Dispatcher, keys: list[bytes], outs: None,
               group: Groups) -> list[bytes | None]: ...
@overload
def batch_read(d: Dispatcher, keys: list[bytes], outs: list[BufferLike],
               group: Groups) -> list[int | None]: ...
def batch_read(d: Dispatcher, keys: list[bytes], outs: list[BufferLike] | None,
               group: Groups) -> list[bytes | None] | list[int | None]:
    """Read ``keys`` into ``outs`` (lengths) or as bytes (``outs`` None); None for misses.

    A key the server has on disk but no memory to bring up (NO_SPACE) is asked for once more
    on its own once the batch has let go of its leases: often the batch's own leases were
    what pinned the memory."""
    results: list[Any] = [None] * len(keys)      # bytes or lengths: the overloads say which
    want_bytes = outs is None
    again: list[int] = []

    def start(address: str | None, idx: list[int]) -> Held[ReadItem] | None:
        d.stats.request("get", len(idx))
        link = d.acquire(address, len(idx))
        if isinstance(link, Miss):
            return None
        items = _started(d, link, len(idx), lambda ch: link.exchange.start_reads(
            ch, [keys[i] for i in idx], None if outs is None else [outs[i] for i in idx],
            verify=d.verifies(link.exchange)))
        if isinstance(items, Miss):
            return None
        if any(isinstance(item, Extent) for item in items):
            return link, idx, items
        d.release(link)
        settle(idx, items)
        return None

    def settle(idx: list[int], items: Sequence[ReadItem | Miss]) -> None:
        """Keys answered in the first phase: results, misses, or NO_SPACE to ask again."""
        for i, item in zip(idx, items):
            if item is Status.NO_SPACE:
                again.append(i)
            elif not isinstance(item, Extent):
                results[i] = read_outcome(d.stats, item, want_bytes=want_bytes)

    held = [h for h in d.parallel([partial(start, a, idx)
                                   for a, idx in d.plan(keys, group)]) if h is not None]
    try:
        copies = _read_copies(held, outs)
        found = [result for job in d.parallel([partial(_copy_job, d, job)
                                                for job in _copy_jobs(copies)])
                 for result in job]
        for (_, i, _, _), result in zip(copies, found):
            if result is not None:
                results[i] = read_outcome(d.stats, result, want_bytes=want_bytes)
        for _, idx, items in held:
            settle(idx, items)
    finally:
        for link, _, extents in held:
            handles = [e.handle for e in extents if isinstance(e, Extent)]
            if again:          # released before the retries ask, on the link that leased them
                _release(d, link, handles)
            else:
                d.submit(_release, d, link, handles)
    retried = d.parallel([partial(read_one, d, keys[i], None if outs is None else outs[i],
                                  d.group_at(group, i)) for i in again])
    for i, answer in zip(again, retried):
        results[i] = read_outcome(d.stats, answer, want_bytes=want_bytes)
    return results


def _read_copies(held: list[Held[ReadItem]],
                 outs: list[BufferLike] | None) -> list[tuple[Link, int, Extent, Any]]:
    """The copy jobs of a batch read's extents; InvalidRequest if an ``out`` is too small."""
    copies = []
    for link, idx, extents in held:
        for i, extent in zip(idx, extents):
            if not isinstance(extent, Extent):
                continue
            target = RECEIVE_BUFFERS.take(extent.length) if outs is None else outs[i]
            protocol.check_fits(nbytes(target), extent.length, f"outs[{i}]")
            copies.append((link, i, extent, target))
    return copies


def _release(d: Dispatcher, link: Link, handles: list[int]) -> None:
    if not isinstance(d.run(link, lambda ch: link.exchange.end_reads(ch, handles), 0), Miss):
        d.release(link)




def prefetch(d: Dispatcher, keys: list[bytes], group: Groups) -> list[Prefetched]:
    """PREFETCH of each key at its owner, one request per server, servers in parallel. A key
    whose server is unreachable, failed, or takes no PREFETCH is ``NOT_ASKED``."""
    out = [Prefetched.NOT_ASKED] * len(keys)

    def work(address: str | None, idx: list[int]) -> None:
        def ask(ch: Channel) -> list[Prefetched] | None:
            # connected by now, so the server's HELLO facts are known
            if address is None or not d.routes.takes_prefetch(address):
                return None
            return protocol.prefetch(ch, [keys[i] for i in idx])

        states = d.call(address, ask, len(idx))
        if isinstance(states, list):
            for n, i in enumerate(idx):
                out[i] = states[n]

    d.parallel([partial(work, a, idx) for a, idx in d.plan(keys, group)])
    return out

"""Batch exchanges: one request per server, servers in parallel, copies in parallel.

Over TCP a batch is one BATCH_PUT or BATCH_GET per server, run on the IO threads. Over shared
memory it has three phases, each run on the IO threads while the caller waits:
1. per server, one BATCH_LEASE (reads) or pipelined ALLOCs (writes) on a link that is then held;
2. one copy job per value between the caller's buffer and the arena, so two IO threads copy two
   values at once (a copy runs in numpy with the GIL released);
3. per server, on the held link, pipelined COMMITs (writes) or one batched no-reply RELEASE.
Holding the link across phases matters: a server drops what a connection leases or allocates when
that connection closes, and the pool may close surplus idle links.
"""

from __future__ import annotations

import logging
from typing import Any

from gcache.errors import IOTimeout, TransportError
from gcache.frame import Status
from gcache.keys import checksum, group_hash
from gcache.sdk import protocol, shm_exchange
from gcache.sdk.dispatch import MISS, Dispatcher, Miss
from gcache.sdk.outcome import put_outcome, read_outcome
from gcache.sdk.protocol import Channel, ReadResult
from gcache.sdk.routes import Link
from gcache.sdk.shm_exchange import Extent
from gcache.sdk.tcp_staging import TcpStaged
from gcache.transport.pinned import PoolExhausted

log = logging.getLogger(__name__)
PUT_CHUNK_KEYS = 256      # keys a batch put allocates, copies and commits at a time
Held = tuple[Link, list[int], list[Extent | Status | None]]


def batch_put(d: Dispatcher, keys: list[bytes], values: list[Any],
              group: bytes | None) -> list[bool]:
    """Store ``keys``, ``PUT_CHUNK_KEYS`` at a time. Over shared memory a value must be copied
    within the write window (half the server's lease TTL) counted from its ALLOC: one phase
    of thousands of ALLOCs before the first copy let the window of the first ones pass (a
    3000-key batch under a 1 s TTL on a busy machine)."""
    if len(keys) <= PUT_CHUNK_KEYS:
        return _batch_put(d, keys, values, group)
    return [ok for start in range(0, len(keys), PUT_CHUNK_KEYS)
            for ok in _batch_put(d, keys[start:start + PUT_CHUNK_KEYS],
                                 values[start:start + PUT_CHUNK_KEYS], group)]


def _batch_put(d: Dispatcher, keys: list[bytes], values: list[Any],
               group: bytes | None) -> list[bool]:
    results = [False] * len(keys)
    placement = group_hash(group)

    def start(address: str | None, idx: list[int]) -> Held | None:
        d.stats.request("put", len(idx))
        link = d.acquire(address, len(idx))
        if isinstance(link, Miss):
            return None
        if link.mapping is None:
            def over_tcp(ch: Channel) -> list[Status | Miss]:
                with TcpStaged(d.cuda_staging) as staged:
                    try:
                        sent = [staged.value(values[i], f"values[{i}]") for i in idx]
                    except PoolExhausted as exc:
                        return _no_staging(d, len(idx), exc)
                    return protocol.batch_put(ch, [keys[i] for i in idx], sent,
                                              [checksum(v) for v in sent], group=placement)

            _finish_puts(d, link, idx, d.run(link, over_tcp, len(idx)), values, results)
            return None
        extents = d.run(link, lambda ch: shm_exchange.alloc_many(
            ch, [keys[i] for i in idx], [shm_exchange.size_of(values[i]) for i in idx],
            group=placement), len(idx))
        return None if isinstance(extents, Miss) else (link, idx, extents)

    held = [h for h in d.parallel([lambda a=a, idx=idx: start(a, idx)
                                   for a, idx in d.plan(keys, group)]) if h is not None]
    copies = [(link, i, extent) for link, idx, extents in held
              for i, extent in zip(idx, extents) if extent is not None]
    digests = d.parallel([lambda m=link.mapping, i=i, e=e: _copy_in(d, m, e, values[i])
                          for link, i, e in copies])
    digest_of = {i: digest for (_, i, _), digest in zip(copies, digests)}   # i: key index

    def commit(link: Link, idx: list[int], extents: list[Extent | None]) -> None:
        # A value whose copy failed is not committed: the server drops its extent at the TTL.
        todo = [(i, e) for i, e in zip(idx, extents)
                if e is not None and digest_of[i] is not None]
        statuses = d.run(link, lambda ch: shm_exchange.commit_many(
            ch, [e.handle for _, e in todo], [digest_of[i] for i, _ in todo]),
            len(todo))
        by_key = dict.fromkeys(idx, Status.NO_SPACE)
        if not isinstance(statuses, Miss):
            by_key.update({i: s for (i, _), s in zip(todo, statuses)})
        _finish_puts(d, link, idx, MISS if isinstance(statuses, Miss) else
                     [by_key[i] for i in idx], values, results)

    d.parallel([lambda h=h: commit(*h) for h in held])
    return results


def _copy_in(d: Dispatcher, mapping: Any, extent: Extent, value: Any) -> int | None:
    """One value's copy into the arena; None (counted as a miss) when it failed."""
    try:
        return shm_exchange.copy_in(mapping, extent, value)
    except TransportError as exc:
        d.stats.miss("timeout" if isinstance(exc, IOTimeout) else "protocol", 1)
        log.warning("sdk.copy_failed bytes=%d detail=%s", extent.length, exc)
        return None


def _copy_out(d: Dispatcher, mapping: Any, extent: Extent, target: Any,
              verify: bool) -> ReadResult | None:
    """One value's copy out of the arena; None (counted as a miss) when the server named
    memory outside its arena."""
    try:
        return ReadResult(target, extent.length,
                          shm_exchange.copy_out(mapping, extent, target, verify=verify))
    except TransportError as exc:
        d.stats.miss("protocol", 1)
        log.warning("sdk.copy_failed bytes=%d detail=%s", extent.length, exc)
        return None


def _finish_puts(d: Dispatcher, link: Link, idx: list[int], statuses: list[Status] | Miss,
                 values: list[Any], results: list[bool]) -> None:
    if isinstance(statuses, Miss):
        return                                    # the link is closed, the misses counted
    d.release(link)
    for n, i in enumerate(idx):
        results[i] = put_outcome(d.stats, statuses[n], shm_exchange.size_of(values[i]))


def read_one(d: Dispatcher, key: bytes, out: Any,
             group: bytes | None) -> ReadResult | Status | None | Miss:
    """One key's read on its owner: LEASE and copy over shared memory, GET over TCP."""
    verify = d.config.verify_checksum

    def exchange(ch: Channel) -> ReadResult | Status | None:
        if ch.mapping is not None:
            return shm_exchange.read_value(ch, key, out, verify=verify)
        with TcpStaged(d.cuda_staging) as staged:
            target = staged.target(out)
            return staged.land(target, protocol.read_value(ch, key, target, verify=verify))

    return call_staged(d, d.owner(key, group), exchange)


def call_staged(d: Dispatcher, address: str | None, exchange: Any) -> Any:
    """``d.call`` of a one-key exchange that may stage a CUDA buffer: no pinned buffer in time
    is a ``staging`` miss (the link was closed before any IO on it), not a failed server."""
    try:
        return d.call(address, exchange)
    except PoolExhausted as exc:
        return _no_staging(d, 1, exc)[0]


def _no_staging(d: Dispatcher, n_keys: int, exc: Exception) -> list[Miss]:
    """Misses for CUDA buffers that found no pinned staging within the IO timeout."""
    d.stats.miss("staging", n_keys)
    log.warning("sdk.miss reason=staging detail=%s", exc)
    return [MISS] * n_keys


def batch_read(d: Dispatcher, keys: list[bytes], outs: list[Any] | None,
               group: bytes | None) -> list[Any]:
    """Read ``keys`` into ``outs`` (lengths) or as bytes (``outs`` None); None for misses.

    A key the server has on disk but no memory to bring up (NO_SPACE) is asked for once more
    on its own once the batch has let go of its leases: often the batch's own leases were
    what pinned the memory."""
    results: list[Any] = [None] * len(keys)
    verify, want_bytes = d.config.verify_checksum, outs is None
    again: list[int] = []

    def start(address: str | None, idx: list[int]) -> Held | None:
        d.stats.request("get", len(idx))
        link = d.acquire(address, len(idx))
        if isinstance(link, Miss):
            return None
        if link.mapping is None:
            def over_tcp(ch: Channel) -> list[ReadResult | Status | None | Miss]:
                with TcpStaged(d.cuda_staging) as staged:
                    try:
                        targets = None if outs is None else \
                            [staged.target(outs[i], f"outs[{i}]") for i in idx]
                    except PoolExhausted as exc:
                        return _no_staging(d, len(idx), exc)
                    found = protocol.batch_read_values(ch, [keys[i] for i in idx], targets,
                                                       verify=verify)
                    return found if targets is None else \
                        [staged.land(t, r) for t, r in zip(targets, found)]

            found = d.run(link, over_tcp, len(idx))
            if not isinstance(found, Miss):
                d.release(link)
                for n, i in enumerate(idx):
                    if found[n] is Status.NO_SPACE:
                        again.append(i)
                    else:
                        results[i] = read_outcome(d.stats, found[n], want_bytes=want_bytes)
            return None
        extents = d.run(link, lambda ch: shm_exchange.lease_many(ch, [keys[i] for i in idx]),
                        len(idx))
        return None if isinstance(extents, Miss) else (link, idx, extents)

    held = [h for h in d.parallel([lambda a=a, idx=idx: start(a, idx)
                                   for a, idx in d.plan(keys, group)]) if h is not None]
    try:
        copies = _read_copies(held, outs)
        found = d.parallel([lambda link=link, e=e, t=t: _copy_out(d, link.mapping, e, t, verify)
                            for link, _, e, t in copies])
        for (_, i, _, _), result in zip(copies, found):
            if result is not None:
                results[i] = read_outcome(d.stats, result, want_bytes=want_bytes)
        for _, idx, extents in held:
            for i, extent in zip(idx, extents):
                if extent is Status.NO_SPACE:
                    again.append(i)
                elif extent is None:
                    results[i] = read_outcome(d.stats, None, want_bytes=want_bytes)
    finally:
        for link, _, extents in held:
            handles = [e.handle for e in extents if isinstance(e, Extent)]
            if again:          # released before the retries ask, on the link that leased them
                _release(d, link, handles)
            else:
                d.submit(_release, d, link, handles)
    retried = d.parallel([lambda i=i: read_one(d, keys[i], None if outs is None else outs[i],
                                               group) for i in again])
    for i, result in zip(again, retried):
        results[i] = read_outcome(d.stats, result, want_bytes=want_bytes)
    return results


def _read_copies(held: list[Held], outs: list[Any] | None) -> list[tuple[Link, int, Extent, Any]]:
    """The copy jobs of a shared-memory batch read; InvalidRequest if an ``out`` is too small."""
    copies = []
    for link, idx, extents in held:
        for i, extent in zip(idx, extents):
            if not isinstance(extent, Extent):
                continue
            target = memoryview(bytearray(extent.length)) if outs is None else outs[i]
            protocol.check_fits(shm_exchange.size_of(target), extent.length, f"outs[{i}]")
            copies.append((link, i, extent, target))
    return copies


def _release(d: Dispatcher, link: Link, handles: list[int]) -> None:
    if not isinstance(d.run(link, lambda ch: shm_exchange.release(ch, handles), 0), Miss):
        d.release(link)



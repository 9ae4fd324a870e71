"""Limits of the steady-state data-plane bench that need a peer: a raw loopback socket between
two processes, and Redis, each run in the rounds of ``bench/steady.py`` over the same working
set as GCache (the memcpy limit is ``steady.memcpy_rounds``; Mooncake Store runs the rounds
itself, ``bench/mooncake_store.py``).

The raw socket is the shape of a GET: one request byte, then the peer ``sendall``s the value in
``io_size`` pieces from its own copy of the working set's distinct blocks, and this process
``recv_into``s the value's own output buffer. Redis runs the same rounds as a store (SET for
put, GET for get; it has no ``get_into`` or batch into buffers): its deletes, overwrites and
misses are GCache's.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time

import numpy as np
from steady import Workload, rounds, spread

MiB = 1 << 20


def _sender(port: int, size: int, count: int, seed: int, io_size: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    blocks = memoryview(np.frombuffer(np.random.default_rng(seed).bytes(count * size),
                                      dtype=np.uint8).copy())
    i = 0
    while sock.recv(1) == b"g":       # one request byte per value: the round trip of a GET
        base = (i % count) * size
        for off in range(0, size, io_size):
            sock.sendall(blocks[base + off:base + min(size, off + io_size)])
        i += 1
    sock.close()


def raw_socket_rounds(w: Workload, *, rounds: int, io_size: int = MiB) -> dict[str, float]:
    """GB/s of fetching every value of ``w`` over one loopback TCP socket from another
    process, per round (a warm-up round first): the spread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    child = mp.get_context("spawn").Process(
        target=_sender, args=(listener.getsockname()[1], w.size, w.count, 7, io_size))
    child.start()
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    outs = [memoryview(out) for out in w.outs]
    samples = []
    try:
        for r in range(rounds + 1):
            start = time.perf_counter()
            for out in outs:
                conn.sendall(b"g")
                got = 0
                while got < w.size:
                    n = conn.recv_into(out[got:got + io_size])
                    if not n:
                        raise ConnectionError("the raw-socket sender went away")
                    got += n
            if r:
                samples.append(w.nbytes / (time.perf_counter() - start) / 1e9)
    finally:
        conn.sendall(b"q")
        conn.close()
        listener.close()
        child.join(10)
        if child.is_alive():
            child.kill()
    return spread(samples)


def raw_socket_latency_ms(size: int = 64 * 1024, count: int = 1024, *,
                          rounds: int) -> float:
    """Median over rounds of each round's p50 round trip of one request byte and a
    ``size``-byte answer, in ms."""
    w = Workload(size, count, seed=64)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    child = mp.get_context("spawn").Process(
        target=_sender, args=(listener.getsockname()[1], size, count, 8, MiB))
    child.start()
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    p50s = []
    try:
        for r in range(rounds + 1):
            samples = []
            for out in w.outs:
                view = memoryview(out)
                start = time.perf_counter()
                conn.sendall(b"g")
                got = 0
                while got < size:
                    got += conn.recv_into(view[got:])
                samples.append((time.perf_counter() - start) * 1000)
            if r:
                p50s.append(sorted(samples)[len(samples) // 2])
    finally:
        conn.sendall(b"q")
        conn.close()
        listener.close()
        child.join(10)
    return spread(p50s)["median"]


class RedisStore:
    """Redis (redis-py + hiredis) in the steady rounds' put and get ops only (SET, GET, DEL:
    Redis has no read into a caller's buffer, so it is no whole ``steady.Store``). Its LRU is
    approximate (it samples keys), so a full Redis sometimes evicts a working-set value that
    was just written: such a GET is counted in ``misses`` and answered with the size asked
    for, so that the round goes on (GCache's rounds allow no miss at all)."""

    def __init__(self, port: int, size: int) -> None:
        import redis  # bench-only dependency (the dev extra)
        self.client = redis.Redis(host="127.0.0.1", port=port)
        self.size = size
        self.misses = 0

    def put(self, key: str, value: np.ndarray) -> None:
        assert self.client.set(key, memoryview(value))

    def get(self, key: str) -> int:
        got = self.client.get(key)
        if got is None:
            self.misses += 1
            return self.size
        return len(got)

    def delete(self, key: str) -> None:
        self.client.delete(key)


def redis_rounds(port: int, w: Workload, *, rounds_n: int, memory_bytes: int,
                 fill_bytes: int) -> dict:
    """Redis in the steady rounds (SET and GET) with ``maxmemory`` = ``memory_bytes`` and
    ``allkeys-lru``, after ``fill_bytes`` of other values: full and evicting, as GCache is.
    Spreads by op, and ``misses_per_get`` (see ``RedisStore``)."""
    from steady import fill
    store = RedisStore(port, w.size)
    try:
        store.client.config_set("maxmemory", memory_bytes)
        store.client.config_set("maxmemory-policy", "allkeys-lru")
        store.client.config_set("maxmemory-samples", 10)
        fill(store, w, fill_bytes)
        out = rounds(store, w, rounds=rounds_n, threads=1, ops=("put", "get"))
        out["misses_per_get"] = store.misses / ((rounds_n + 1) * w.count)
        return out
    finally:
        store.client.flushall()
        store.client.close()

"""Limits measured in the same run as GCache: memcpy, a raw loopback socket, and Redis.

Every GCache figure in ``bench/`` is printed as a ratio to one of these, so a slow machine or a
noisy neighbour moves both sides of the ratio together.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np

MiB = 1 << 20


def memcpy_gbps(block_bytes: int = 4 * MiB, total_bytes: int = 256 * MiB, rounds: int = 3) -> float:
    """Single-thread copy bandwidth over distinct blocks (so caches do not flatter it), GB/s."""
    n = total_bytes // block_bytes
    src = [np.random.randint(0, 255, block_bytes, dtype=np.uint8) for _ in range(n)]
    dst = [np.zeros(block_bytes, dtype=np.uint8) for _ in range(n)]
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        for s, d in zip(src, dst):
            np.copyto(d, s)
        best = max(best, total_bytes / (time.perf_counter() - start) / 1e9)
    return best


def memcpy_threads_gbps(threads: int, block_bytes: int = 4 * MiB,
                        total_bytes: int = 256 * MiB) -> float:
    """Copy bandwidth of ``threads`` threads copying distinct blocks at once, GB/s (numpy
    releases the GIL): what parallel copies on this machine can reach at most."""
    import threading

    n = total_bytes // block_bytes
    src = [np.random.randint(0, 255, block_bytes, dtype=np.uint8) for _ in range(n)]
    dst = [np.ones(block_bytes, dtype=np.uint8) for _ in range(n)]

    def work(part: int) -> None:
        for i in range(part, n, threads):
            np.copyto(dst[i], src[i])

    best = 0.0
    for _ in range(3):
        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, total_bytes / (time.perf_counter() - start) / 1e9)
    return best


def _sender(port: int, block_bytes: int, count: int, io_size: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = memoryview(np.random.randint(0, 255, block_bytes, dtype=np.uint8).tobytes())
    for _ in range(count):
        if sock.recv(1) != b"g":      # one request byte per block: the same round trip as a GET
            break
        for off in range(0, block_bytes, io_size):
            sock.sendall(payload[off:off + io_size])
    sock.close()


def raw_socket_gbps(block_bytes: int = 4 * MiB, count: int = 200, io_size: int = MiB) -> float:
    """Request/response over loopback between two processes: ``sendall`` -> ``recv_into``, GB/s."""
    seconds = _raw_socket_seconds(block_bytes, count, io_size)
    return block_bytes * count / sum(seconds) / 1e9


def raw_socket_p50_ms(block_bytes: int = 64 * 1024, count: int = 2000) -> float:
    """Median round trip of one request byte and a ``block_bytes`` answer, in ms."""
    seconds = sorted(_raw_socket_seconds(block_bytes, count, MiB))
    return seconds[len(seconds) // 2] * 1000


def _raw_socket_seconds(block_bytes: int, count: int, io_size: int) -> list[float]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    child = mp.get_context("spawn").Process(target=_sender,
                                            args=(port, block_bytes, count + 5, io_size))
    child.start()
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(block_bytes))

    def fetch() -> None:
        conn.sendall(b"g")
        got = 0
        while got < block_bytes:
            got += conn.recv_into(buf[got:got + io_size])

    for _ in range(5):
        fetch()
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        fetch()
        seconds.append(time.perf_counter() - start)
    conn.close()
    listener.close()
    child.join(5)
    return seconds


class RedisServer:
    """A throwaway ``redis-server`` on loopback, no persistence; None when it is not installed."""

    def __init__(self) -> None:
        self.binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def __enter__(self) -> RedisServer | None:
        if self.binary is None:
            return None
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._dir = tempfile.mkdtemp(prefix="gcache-bench-redis-")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._dir, "--proto-max-bulk-len", "1gb"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start within 10 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            shutil.rmtree(self._dir, ignore_errors=True)


def redis_gbps(port: int, block_bytes: int, count: int) -> dict[str, float]:
    import redis  # bench-only dependency (the dev extra)

    client = redis.Redis(host="127.0.0.1", port=port)
    value = np.random.randint(0, 255, block_bytes, dtype=np.uint8).tobytes()
    keys = [f"bench:{i}" for i in range(16)]
    start = time.perf_counter()
    for i in range(count):
        client.set(keys[i % len(keys)], value)
    set_gbps = block_bytes * count / (time.perf_counter() - start) / 1e9
    start = time.perf_counter()
    for i in range(count):
        client.get(keys[i % len(keys)])
    get_gbps = block_bytes * count / (time.perf_counter() - start) / 1e9
    client.close()
    return {"set_gbps": set_gbps, "get_gbps": get_gbps}

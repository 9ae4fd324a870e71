"""SDK counters: one ``ClientStats`` per Client (what ``stats()`` returns) mirrored into the
process-wide Prometheus metrics ``gcache_sdk_*``. Labels are bounded: an op name or a miss
reason, never a key or an address.
"""

from __future__ import annotations

import threading
from collections import Counter as _Tally

from prometheus_client import Counter

MISSES = Counter("gcache_sdk_misses", "Reads and writes that became misses", ["reason"])
HITS = Counter("gcache_sdk_hits", "Reads that returned a value")
REQUESTS = Counter("gcache_sdk_requests", "Keys requested, by operation", ["op"])
BYTES = Counter("gcache_sdk_io_bytes", "Value bytes moved", ["direction"])

MISS_REASONS = ("absent", "suspect", "unreachable", "timeout", "connection_lost", "protocol",
                "server_error", "checksum", "no_space", "no_server", "auth")


# Label children resolved once: ``labels()`` takes a lock and a dict lookup on every call.
_REQUESTS = {op: REQUESTS.labels(op) for op in ("get", "put", "exists", "delete", "list")}
_MISSES = {reason: MISSES.labels(reason) for reason in MISS_REASONS}
_READ, _WRITTEN = BYTES.labels("read"), BYTES.labels("written")


class ClientStats:
    """Thread-safe tallies of one Client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tally: _Tally[str] = _Tally()
        self._misses: _Tally[str] = _Tally()

    def request(self, op: str, n: int = 1) -> None:
        _REQUESTS[op].inc(n)
        with self._lock:
            self._tally[f"{op}_requests"] += n

    def hit(self, n_bytes: int) -> None:
        HITS.inc()
        _READ.inc(n_bytes)
        with self._lock:
            self._tally["hits"] += 1
            self._tally["bytes_read"] += n_bytes

    def stored(self, n_bytes: int) -> None:
        _WRITTEN.inc(n_bytes)
        with self._lock:
            self._tally["puts_ok"] += 1
            self._tally["bytes_written"] += n_bytes

    def miss(self, reason: str, n: int = 1) -> None:
        _MISSES[reason].inc(n)
        with self._lock:
            self._misses[reason] += n

    def snapshot(self) -> dict[str, int | dict[str, int]]:
        with self._lock:
            out: dict[str, int | dict[str, int]] = {
                name: self._tally[name] for name in ("hits", "bytes_read", "puts_ok",
                                                     "bytes_written")}
            out.update({k: v for k, v in self._tally.items() if k.endswith("_requests")})
            out["misses"] = sum(self._misses.values())
            out["misses_by_reason"] = {r: self._misses[r] for r in MISS_REASONS if self._misses[r]}
        return out

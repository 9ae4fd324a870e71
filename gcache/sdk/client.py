"""``Client``: the SDK every engine connector uses.

It owns placement (the ring over the configured servers), the IO threads, the connection pool
and the turning of failures into misses. Invariants:
- ``*_async`` calls and every batch run on the SDK's IO threads (a batch fans out one request
  per server, servers in parallel). A synchronous single-key call runs the same exchange in the
  caller's thread: the caller is blocked either way, and on these machines handing work to a
  thread and back costs about 120 us, more than a whole 64 KiB exchange on loopback.
- A miss of any cause (absent, evicted, unreachable, timeout, checksum mismatch) is ``None`` /
  ``False`` and is counted by reason; only bad arguments raise (ValueError / TypeError), and they
  are checked in the caller's thread before any IO.
- Bytes read are checked against the server's xxh3_64 before the call reports a hit, so a
  corrupted value is a miss, never wrong KV.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from gcache.buffer import as_memoryview
from gcache.config import ClientConfig
from gcache.errors import (ConfigError, ConnectFailed, ConnectionLost, IOTimeout, ProtocolError,
                           ServerError, TransportError)
from gcache.frame import Status
from gcache.keys import checksum, checksum_stream, validate_key
from gcache.ring import Ring
from gcache.sdk import protocol
from gcache.sdk.metrics import ClientStats
from gcache.sdk.pool import ServerPool
from gcache.sdk.protocol import Channel

log = logging.getLogger(__name__)
T = TypeVar("T")
_BATCH_MAX = 4096            # keys per request frame (the wire allows 65535)


class _Miss:
    """Returned by ``_call`` instead of a result when the exchange became a miss."""


MISS = _Miss()


def _reason(exc: Exception) -> str:
    if isinstance(exc, IOTimeout):
        return "timeout"
    if isinstance(exc, ConnectFailed):
        return "unreachable"
    if isinstance(exc, ConnectionLost):
        return "connection_lost"
    if isinstance(exc, ProtocolError):
        return "protocol"
    return "server_error"


class Client:
    """A GCache client over static servers (``servers=["HOST:PORT", ...]``).

    Keyword arguments override ``config`` fields; see ``ClientConfig`` for units and defaults.
    Thread-safe. Use as a context manager or call ``close()``.
    """

    def __init__(self, servers: Sequence[str] | None = None, *, config: ClientConfig | None = None,
                 **overrides: Any) -> None:
        base = config or ClientConfig()
        fields = {name: getattr(base, name) for name in ClientConfig.__slots__}
        if servers is not None:
            if isinstance(servers, str):
                raise TypeError("servers must be a list of 'HOST:PORT' strings, not one str")
            fields["servers"] = tuple(servers)
        unknown = set(overrides) - set(fields)
        if unknown:
            raise TypeError(f"unknown Client arguments {sorted(unknown)}; see ClientConfig")
        fields.update(overrides)
        self.config = ClientConfig(**fields)
        if not self.config.servers:
            raise ValueError("servers is empty; give at least one 'HOST:PORT'")
        if self.config.token is not None:
            # Refused rather than ignored: a caller who sets a token expects it to be checked.
            raise ConfigError("token", "***", "cluster-token authentication is not in this "
                              "release yet (it lands with the master issue); omit token")
        self._ring = Ring.uniform(self.config.servers, vnodes=self.config.vnodes)
        self._stats = ClientStats()
        self._pool = ServerPool(timeout_s=self.config.timeout_s, io_size=self.config.io_size,
                                suspect_s=self.config.suspect_s, idle_max=self.config.io_threads)
        self._io = ThreadPoolExecutor(self.config.io_threads, thread_name_prefix="gcache-io")

    def __repr__(self) -> str:
        return f"Client(servers={list(self.config.servers)!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._io.shutdown(wait=True)
        self._pool.close()

    # ---- arguments ------------------------------------------------------------------------------

    def _value(self, value: Any, what: str = "value") -> memoryview:
        view = as_memoryview(value, writable=False, what=what)
        if len(view) == 0:
            raise ValueError(f"{what} is empty; a value is 1..{self.config.max_value_size} bytes")
        if len(view) > self.config.max_value_size:
            raise ValueError(f"{what} is {len(view)} bytes; limit is max_value_size="
                             f"{self.config.max_value_size}")
        return view

    def _owner(self, key: bytes, group: bytes | None) -> str | None:
        return self._ring.owner(key, group=group, group_width=self.config.group_width)

    @staticmethod
    def _group(group: Any) -> bytes | None:
        return None if group is None else validate_key(group)

    # ---- the one place failures become misses ------------------------------------------------

    def _call(self, address: str | None, fn: Callable[[Channel], T], n_keys: int = 1) -> T | _Miss:
        if address is None:
            self._stats.miss("no_server", n_keys)
            return MISS
        if self._pool.is_suspect(address):
            self._stats.miss("suspect", n_keys)
            return MISS
        conn = None
        try:
            conn = self._pool.acquire(address)
            result = fn(Channel(conn, timeout_s=self.config.timeout_s))
        except (TransportError, ProtocolError, ServerError) as exc:
            self._pool.fail(conn, address)
            reason = _reason(exc)
            self._stats.miss(reason, n_keys)
            log.warning("sdk.miss server=%s reason=%s detail=%s", address, reason, exc)
            return MISS
        except BaseException:
            if conn is not None:
                conn.close()          # a bad ``out`` (or a bug) may leave a reply half read
            raise
        self._pool.release(conn)
        return result

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        return self._io.submit(fn, *args)

    # ---- single-key operations ----------------------------------------------------------------

    def put(self, key: Any, value: Any, *, group: Any = None) -> bool:
        """Store ``value`` under ``key``; False when it could not be stored (counted)."""
        return self._put(validate_key(key), self._value(value), self._group(group))

    def put_async(self, key: Any, value: Any, *, group: Any = None) -> Future[bool]:
        raw, view = validate_key(key), self._value(value)
        return self._submit(self._put, raw, view, self._group(group))

    def _put(self, key: bytes, view: memoryview, group: bytes | None) -> bool:
        self._stats.request("put")
        status = self._call(self._owner(key, group), lambda ch: protocol.put(
            ch, key, view, io_size=self.config.io_size))
        return self._put_outcome(status, len(view))

    def _put_outcome(self, status: Status | _Miss, n_bytes: int) -> bool:
        if status is MISS:
            return False
        if status == Status.OK:
            self._stats.stored(n_bytes)
            return True
        self._stats.miss("no_space" if status == Status.NO_SPACE else "checksum")
        return False

    def get(self, key: Any, *, group: Any = None) -> bytes | None:
        """The value of ``key`` as bytes, or None on a miss of any cause."""
        return self._get_into(validate_key(key), None, self._group(group))

    def get_async(self, key: Any, *, group: Any = None) -> Future[bytes | None]:
        return self._submit(self._get_into, validate_key(key), None, self._group(group))

    def get_into(self, key: Any, out: Any, *, group: Any = None) -> int | None:
        """Read ``key`` into ``out``; the number of bytes written, or None on a miss.

        Raises ValueError when ``out`` is smaller than the value.
        """
        view = as_memoryview(out, writable=True, what="out")
        return self._get_into(validate_key(key), view, self._group(group))

    def get_into_async(self, key: Any, out: Any, *, group: Any = None) -> Future[int | None]:
        raw, view = validate_key(key), as_memoryview(out, writable=True, what="out")
        return self._submit(self._get_into, raw, view, self._group(group))

    def _get_into(self, key: bytes, out: memoryview | None, group: bytes | None) -> Any:
        self._stats.request("get")

        def exchange(ch: Channel) -> Any:
            _, reply = protocol.get_length(ch, key)
            if reply.status == Status.NOT_FOUND:
                return None
            length = reply.payload_len
            target = memoryview(bytearray(length)) if out is None else out
            protocol.check_fits(target, length, "out")
            if not self._recv_verified(ch, target[:length], reply.checksum):
                return MISS
            return length if out is not None else bytes(target.obj)   # type: ignore[arg-type]

        result = self._call(self._owner(key, group), exchange)
        return self._read_outcome(result)

    def _recv_verified(self, ch: Channel, target: memoryview, expected: int) -> bool:
        """Receive a value into ``target``, hashing as it arrives; False on a mismatch."""
        hasher = checksum_stream() if self.config.verify_checksum else None
        ch.conn.recv_into(target, timeout_s=ch.timeout_s, hasher=hasher)
        if hasher is None or hasher.intdigest() == expected:
            return True
        log.error("sdk.checksum_mismatch server=%s bytes=%d", ch.conn.peer, len(target))
        self._stats.miss("checksum")
        return False

    def _read_outcome(self, result: Any) -> Any:
        if result is MISS:
            return None
        if result is None:
            self._stats.miss("absent")
            return None
        self._stats.hit(result if isinstance(result, int) else len(result))
        return result

    def exists(self, key: Any, *, group: Any = None) -> bool:
        raw = validate_key(key)
        self._stats.request("exists")
        found = self._call(self._owner(raw, self._group(group)),
                           lambda ch: protocol.exists(ch, [raw]))
        return found is not MISS and found[0]

    def delete(self, key: Any, *, group: Any = None) -> bool:
        """Remove ``key``; True if it was present. A failed delete is False (and counted)."""
        raw, grp = validate_key(key), self._group(group)

        self._stats.request("delete")
        return self._call(self._owner(raw, grp), lambda ch: protocol.delete(ch, raw)) is True

    # ---- batches: one request per server, servers in parallel ----------------------------------

    def _by_server(self, keys: Sequence[bytes], group: bytes | None) -> dict[str | None, list[int]]:
        plan: dict[str | None, list[int]] = {}
        for i, key in enumerate(keys):
            plan.setdefault(self._owner(key, group), []).append(i)
        return plan

    def _fan_out(self, keys: Sequence[bytes], group: bytes | None,
                 work: Callable[[str | None, list[int]], None]) -> None:
        futures = []
        for address, indices in self._by_server(keys, group).items():
            for start in range(0, len(indices), _BATCH_MAX):
                futures.append(self._submit(work, address, indices[start:start + _BATCH_MAX]))
        for future in futures:
            future.result()

    def batch_put(self, keys: Sequence[Any], values: Sequence[Any], *,
                  group: Any = None) -> list[bool]:
        raw = [validate_key(k) for k in keys]
        if len(raw) != len(values):
            raise ValueError(f"batch_put got {len(raw)} keys and {len(values)} values")
        views = [self._value(v, f"values[{i}]") for i, v in enumerate(values)]
        grp, results = self._group(group), [False] * len(raw)

        def work(address: str | None, idx: list[int]) -> None:
            self._stats.request("put", len(idx))
            sums = [checksum(views[i]) for i in idx]
            statuses = self._call(address, lambda ch: protocol.batch_put(
                ch, [raw[i] for i in idx], [views[i] for i in idx], sums), len(idx))
            for n, i in enumerate(idx):
                results[i] = self._put_outcome(MISS if statuses is MISS else statuses[n],
                                               len(views[i]))

        self._fan_out(raw, grp, work)
        return results

    def batch_get(self, keys: Sequence[Any], *, group: Any = None) -> list[bytes | None]:
        return self._batch_read([validate_key(k) for k in keys], None, self._group(group))

    def batch_get_into(self, keys: Sequence[Any], outs: Sequence[Any], *,
                       group: Any = None) -> list[int | None]:
        raw = [validate_key(k) for k in keys]
        if len(raw) != len(outs):
            raise ValueError(f"batch_get_into got {len(raw)} keys and {len(outs)} outs")
        views = [as_memoryview(o, writable=True, what=f"outs[{i}]") for i, o in enumerate(outs)]
        return self._batch_read(raw, views, self._group(group))

    def _batch_read(self, keys: list[bytes], outs: list[memoryview] | None,
                    group: bytes | None) -> list[Any]:
        results: list[Any] = [None] * len(keys)

        def exchange(ch: Channel, idx: list[int]) -> list[Any]:
            table = protocol.batch_get_table(ch, [keys[i] for i in idx])
            if outs is not None:
                for (status, length, _), i in zip(table, idx):
                    if status == Status.OK:
                        protocol.check_fits(outs[i], length, f"outs[{i}]")
            found: list[Any] = []
            for (status, length, expected), i in zip(table, idx):
                if status != Status.OK:
                    found.append(None)
                    continue
                target = memoryview(bytearray(length)) if outs is None else outs[i][:length]
                if not self._recv_verified(ch, target, expected):
                    found.append(MISS)
                else:
                    found.append(length if outs is not None else bytes(target.obj))
            return found

        def work(address: str | None, idx: list[int]) -> None:
            self._stats.request("get", len(idx))
            found = self._call(address, lambda ch: exchange(ch, idx), len(idx))
            for n, i in enumerate(idx):
                item = MISS if found is MISS else found[n]
                results[i] = None if item is MISS else self._read_outcome(item)

        self._fan_out(keys, group, work)
        return results

    def batch_exists(self, keys: Sequence[Any], *, group: Any = None) -> list[bool]:
        raw, grp = [validate_key(k) for k in keys], self._group(group)
        results = [False] * len(raw)

        def work(address: str | None, idx: list[int]) -> None:
            self._stats.request("exists", len(idx))
            found = self._call(address, lambda ch: protocol.exists(ch, [raw[i] for i in idx]),
                               len(idx))
            if found is not MISS:
                for n, i in enumerate(idx):
                    results[i] = found[n]

        self._fan_out(raw, grp, work)
        return results

    # ---- introspection --------------------------------------------------------------------------

    def stats(self) -> dict:
        """Counters of this client (hits, misses by reason, bytes) and suspect servers."""
        out = self._stats.snapshot()
        out["servers"] = list(self.config.servers)
        out["suspect_servers"] = self._pool.suspects()
        return out

    def server_stats(self) -> dict[str, dict | None]:
        """Each server's STAT (None for a server that did not answer)."""
        futures = {a: self._submit(self._call, a, protocol.stat) for a in self.config.servers}
        return {a: (None if f.result() is MISS else f.result()) for a, f in futures.items()}

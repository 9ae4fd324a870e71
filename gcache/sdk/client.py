"""``Client``: the SDK every engine connector uses.

It owns placement (the ring over the configured servers), the route to each server (shared
memory on the same host, TCP otherwise), the IO threads, the connection pool and the turning of
failures into misses. Invariants:
- ``*_async`` calls and every batch run on the SDK's IO threads: a batch sends one request per
  server, servers in parallel, and over shared memory its copies run on the IO threads in
  parallel too. A synchronous single-key call runs its exchange in the caller's thread: the
  caller is blocked either way, and on these machines handing work to a thread and back costs
  about 120 us, more than a whole 64 KiB exchange.
- A miss of any cause (absent, evicted, unreachable, timeout, checksum mismatch) is ``None`` /
  ``False`` and is counted by reason; only bad arguments raise (InvalidRequest, a ValueError, or
  WrongType, also a TypeError), checked before any IO except an ``out`` too small for the
  value, which is known only after the lookup.
- Bytes read over TCP are checked against the stored xxh3_64 before a call reports a hit, so
  a corrupted value is a miss, never wrong KV; bytes copied out of an arena were checked by the
  server when committed and are not hashed again unless ``verify_arena_reads``
  (docs/protocol.md, "Checksums: where they are checked").
- ``group`` places keys together (ARCHITECTURE §3): a batch takes one group for every key, or
  one per key (a list or tuple as long as the keys), so one call can hold a sequence's pages
  of several groups.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from gcache.buffer import BufferLike, as_memoryview, is_cuda_tensor, nbytes
from gcache.config import ClientConfig
from gcache.errors import InvalidRequest, WrongType
from gcache.frame import FLAG_CONTENT_ADDRESSED, FLAG_PINNED, LIST_PAGE_MAX, PARENT_MAX, Status
from gcache.keys import MAX_KEY_BYTES, KeyLike, group_hash, validate_key
from gcache.master_client import MasterClient, parse_masters
from gcache.prefetched import Prefetched
from gcache.sdk import batch, protocol
from gcache.sdk.cluster_map import MapFollower
from gcache.sdk.dispatch import Dispatcher, Groups, Miss
from gcache.sdk.exchange import Exchange
from gcache.sdk.fill import Fill, fill_of, sum_tiers
from gcache.sdk.metrics import ClientStats
from gcache.sdk.outcome import put_outcome, read_outcome
from gcache.sdk.protocol import Channel
from gcache.transport.cuda import after_callers_work

log = logging.getLogger(__name__)
# A batch's ``group``: one for every key, or a list or tuple of one per key (None: that key
# placed by itself).
BatchGroup = KeyLike | None | Sequence[KeyLike | None]
ParentLike = KeyLike | Sequence[KeyLike] | None     # a parent key, or candidates for it


class Client:
    """A GCache client over static servers (``servers=["HOST:PORT", ...]``) or the servers a
    master's cluster map lists (``master="HOST:PORT[,HOST:PORT...]"``).

    Keyword arguments override ``config`` fields (``timeout_s``, ``io_size``, ``io_threads``,
    ``transport``, ...); see ``ClientConfig`` for units and defaults. Thread-safe. Use as a
    context manager or call ``close()``.
    """

    def __init__(self, servers: Sequence[str] | None = None, *, config: ClientConfig | None = None,
                 master: str | Sequence[str] | None = None, **overrides: Any) -> None:
        base = config or ClientConfig()
        fields = {name: getattr(base, name) for name in ClientConfig.__slots__}
        if servers is not None:
            if isinstance(servers, str):
                raise WrongType("servers must be a list of 'HOST:PORT' strings, not one str")
            fields["servers"] = tuple(servers)
        if master is not None:
            fields["master"] = tuple(parse_masters(master))
        unknown = set(overrides) - set(fields)
        if unknown:
            raise WrongType(f"unknown Client arguments {sorted(unknown)}; see ClientConfig")
        fields.update(overrides)
        self.config = cfg = ClientConfig(**fields)
        if bool(cfg.servers) == bool(cfg.master):
            raise InvalidRequest("give either servers=['HOST:PORT', ...] or "
                                 f"master='HOST:PORT[,...]'; got servers={list(cfg.servers)} "
                                 f"master={list(cfg.master)}")
        self._stats = ClientStats()
        self._d = Dispatcher(cfg, self._stats)
        self._map: MapFollower | None = None
        if cfg.master:
            self._map = MapFollower(MasterClient(cfg.master, token=cfg.token),
                                    self._d.place_on, fallback=self._d.own_placement,
                                    refresh_s=cfg.map_refresh_s)
            self._map.start()

    def __repr__(self) -> str:
        where = f"master={list(self.config.master)!r}" if self.config.master \
            else f"servers={list(self.config.servers)!r}"
        return f"Client({where}, transport={self.config.transport!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._map is not None:
            self._map.stop()
        self._d.close()

    # ---- arguments ------------------------------------------------------------------------------

    def _value(self, value: BufferLike, what: str = "value") -> Any:
        """A flat byte view of ``value`` (or the CUDA tensor itself), size-checked."""
        if is_cuda_tensor(value):
            after_callers_work(value)
            view = value
        else:
            view = as_memoryview(value, writable=False, what=what)
        size = nbytes(view)
        if size == 0:
            raise InvalidRequest(f"{what} is empty; a value is 1..{self.config.max_value_size} "
                                 "bytes")
        if size > self.config.max_value_size:
            raise InvalidRequest(f"{what} is {size} bytes; limit is max_value_size="
                                 f"{self.config.max_value_size}")
        return view

    @staticmethod
    def _out(out: BufferLike, what: str = "out") -> Any:
        if is_cuda_tensor(out):
            after_callers_work(out)          # its kernels still reading what is overwritten
            return out
        return as_memoryview(out, writable=True, what=what)

    @staticmethod
    def _group(group: object) -> bytes | None:
        return None if group is None else validate_key(group)

    @classmethod
    def _groups(cls, group: object, n_keys: int) -> Groups:
        """A batch's ``group``: one for all keys, or a list or tuple of one per key (each may
        be None: that key placed by itself)."""
        if not isinstance(group, (list, tuple)):
            return cls._group(group)
        if len(group) != n_keys:
            raise InvalidRequest(f"group holds {len(group)} groups for {n_keys} keys; give one "
                                 "group, or one per key")
        return [cls._group(g) for g in group]

    # ---- single-key operations ----------------------------------------------------------------

    def put(self, key: KeyLike, value: BufferLike, *, group: KeyLike | None = None,
            content_addressed: bool = False, pinned: bool = False,
            parent: ParentLike = None) -> bool:
        """Store ``value`` under ``key``; False when it could not be stored (counted).

        ``content_addressed``: the key names this value (a hash of it, or of what it was
        computed from, as KV pages' keys are), so no put will ever give the key another
        value. A server that was out of the map keeps such keys when it returns; every
        other key it held is a miss from then on, since a newer put may have gone elsewhere.

        ``pinned``: the server keeps the value in memory, never evicted by other traffic,
        until it is deleted or put again (``gcache.files`` pins a file's parts); within the
        server's pin budget (``--pin-share``), past which the put is refused (False).

        ``parent``: the key (or candidate keys, any of which will do) that this value is of
        no use without, in the same ``group``: a KV page's previous page, a window tail's
        page. The server that holds the value keeps the first candidate it also owns with
        it, and gives the value no second chance in memory once that parent is gone
        (``docs/protocol.md``, FLAG_PARENT); keys of at most 63 bytes.
        """
        return self._put(validate_key(key), self._value(value), self._group(group),
                         _flags(content_addressed, pinned), _parent(parent, "parent"))

    def put_async(self, key: KeyLike, value: BufferLike, *, group: KeyLike | None = None,
                  content_addressed: bool = False, pinned: bool = False,
                  parent: ParentLike = None) -> Future[bool]:
        raw, view = validate_key(key), self._value(value)
        return self._d.submit(self._put, raw, view, self._group(group),
                              _flags(content_addressed, pinned), _parent(parent, "parent"))

    def _put(self, key: bytes, value: BufferLike, group: bytes | None, flags: int,
             parent: list[bytes] | None = None) -> bool:
        self._stats.request("put")

        placement = group_hash(group)
        address = self._d.owner(key, group)

        def write(exchange: Exchange, ch: Channel) -> Status:
            # decided on the link: its handshake is what tells whether the server takes parents
            (wired,), wire_flags = batch.wire_keys(self._d, address, [key],
                                                   None if parent is None else [parent], group,
                                                   flags)
            return exchange.write(ch, wired, value, group=placement, flags=wire_flags)

        status = batch.call_staged(self._d, address, write)
        return put_outcome(self._stats, status, nbytes(value))

    def get(self, key: KeyLike, *, group: KeyLike | None = None) -> bytes | None:
        """The value of ``key`` as bytes, or None on a miss of any cause."""
        return self._get(validate_key(key), self._group(group))

    def get_async(self, key: KeyLike, *, group: KeyLike | None = None) -> Future[bytes | None]:
        return self._d.submit(self._get, validate_key(key), self._group(group))

    def get_into(self, key: KeyLike, out: BufferLike, *,
                 group: KeyLike | None = None) -> int | None:
        """Read ``key`` into ``out``; the number of bytes written, or None on a miss.

        Raises ValueError when ``out`` is smaller than the value.
        """
        return self._get_into(validate_key(key), self._out(out), self._group(group))

    def get_into_async(self, key: KeyLike, out: BufferLike, *,
                       group: KeyLike | None = None) -> Future[int | None]:
        raw, target = validate_key(key), self._out(out)
        return self._d.submit(self._get_into, raw, target, self._group(group))

    # Two methods, not one taking ``out=None``: what a read returns (bytes or a length) then
    # shows in its type.
    def _get(self, key: bytes, group: bytes | None) -> bytes | None:
        self._stats.request("get")
        return read_outcome(self._stats, batch.read_one(self._d, key, None, group),
                            want_bytes=True)

    def _get_into(self, key: bytes, out: BufferLike, group: bytes | None) -> int | None:
        self._stats.request("get")
        return read_outcome(self._stats, batch.read_one(self._d, key, out, group),
                            want_bytes=False)

    def exists(self, key: KeyLike, *, group: KeyLike | None = None) -> bool:
        raw = validate_key(key)
        self._stats.request("exists")
        found = self._d.call(self._d.owner(raw, self._group(group)),
                           lambda ch: protocol.exists(ch, [raw]))
        return not isinstance(found, Miss) and found[0]

    def delete(self, key: KeyLike, *, group: KeyLike | None = None) -> bool:
        """Remove ``key``; True if it was present. A failed delete is False (and counted)."""
        raw, grp = validate_key(key), self._group(group)
        self._stats.request("delete")
        return self._d.call(self._d.owner(raw, grp), lambda ch: protocol.delete(ch, raw)) is True

    def owner(self, key: KeyLike, *, group: KeyLike | None = None) -> str | None:
        """The server that ``key`` (placed by ``group``) goes to under the current map; None
        when no server is known. Consistent hashing: the answer changes only with membership
        (``gcache.files`` uses it to put a file's replicas on distinct servers)."""
        return self._d.owner(validate_key(key), self._group(group))

    # ---- batches: one request per server, servers in parallel ----------------------------------

    def batch_put(self, keys: Sequence[KeyLike], values: Sequence[BufferLike], *,
                  group: BatchGroup = None, content_addressed: bool = False,
                  pinned: bool = False,
                  parents: Sequence[ParentLike] | None = None) -> list[bool]:
        """``put`` of each key; ``parents``: one ``parent`` per key (None for none)."""
        raw = [validate_key(k) for k in keys]
        if len(raw) != len(values):
            raise InvalidRequest(f"batch_put got {len(raw)} keys and {len(values)} values")
        if parents is not None and len(parents) != len(raw):
            raise InvalidRequest(f"batch_put got {len(parents)} parents for {len(raw)} keys")
        views = [self._value(v, f"values[{i}]") for i, v in enumerate(values)]
        candidates = None if parents is None else \
            [_parent(p, f"parents[{i}]") or [] for i, p in enumerate(parents)]
        return batch.batch_put(self._d, raw, views, self._groups(group, len(raw)),
                               flags=_flags(content_addressed, pinned), parents=candidates)

    def batch_get(self, keys: Sequence[KeyLike], *, group: BatchGroup = None) -> list[bytes | None]:
        raw = [validate_key(k) for k in keys]
        return batch.batch_read(self._d, raw, None, self._groups(group, len(raw)))

    def batch_get_into(self, keys: Sequence[KeyLike], outs: Sequence[BufferLike], *,
                       group: BatchGroup = None) -> list[int | None]:
        raw = [validate_key(k) for k in keys]
        if len(raw) != len(outs):
            raise InvalidRequest(f"batch_get_into got {len(raw)} keys and {len(outs)} outs")
        targets = [self._out(o, f"outs[{i}]") for i, o in enumerate(outs)]
        return batch.batch_read(self._d, raw, targets, self._groups(group, len(raw)))

    def batch_exists(self, keys: Sequence[KeyLike], *, group: BatchGroup = None) -> list[bool]:
        raw = [validate_key(k) for k in keys]
        grp = self._groups(group, len(raw))
        results = [False] * len(raw)

        def work(address: str | None, idx: list[int]) -> None:
            self._stats.request("exists", len(idx))
            found = self._d.call(address, lambda ch: protocol.exists(ch, [raw[i] for i in idx]),
                               len(idx))
            if not isinstance(found, Miss):
                for n, i in enumerate(idx):
                    results[i] = found[n]

        self._d.parallel([partial(work, a, idx) for a, idx in self._d.plan(raw, grp)])
        return results

    def prefetch(self, keys: Sequence[KeyLike], *, group: BatchGroup = None) -> list[Prefetched]:
        """Have each key's server promote it from its cold tier into memory ahead of a read,
        returning none of them (servers in parallel). ``Prefetched.NOT_ASKED``: its server is
        unreachable, failed, or takes no PREFETCH."""
        raw = [validate_key(k) for k in keys]
        return batch.prefetch(self._d, raw, self._groups(group, len(raw)))

    def list_pinned(self, prefix: KeyLike = b"") -> list[bytes]:
        """The pinned keys that start with ``prefix`` (a file store's parts), from every server
        that answers, sorted and without repeats. A server that does not answer is left out,
        counted as a miss of its cause and logged: its keys are missing from the list."""
        raw = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        if len(raw) > MAX_KEY_BYTES:
            raise InvalidRequest(f"prefix is {len(raw)} bytes; limit is {MAX_KEY_BYTES}")

        def listed(address: str) -> list[bytes]:
            keys: list[bytes] = []
            while True:
                self._stats.request("list")
                after = keys[-1] if keys else b""
                page = self._d.call(address, partial(protocol.list_pinned, prefix=raw,
                                                         after=after))
                if isinstance(page, Miss):
                    return keys
                keys += page
                if len(page) < LIST_PAGE_MAX:
                    return keys

        pages = self._d.parallel([partial(listed, a) for a in self._d.addresses()])
        return sorted({key for page in pages for key in page})

    # ---- NIXL ---------------------------------------------------------------------------------

    def register_buffer(self, buffer: BufferLike) -> bool:
        """Register ``buffer`` (host memory, or a CUDA tensor as VRAM) for NIXL once, so that
        reads into it and writes from it move without a bounce copy: a GPU host's KV goes
        straight between the NIC and GPU memory. The client holds a reference to ``buffer``
        until ``unregister_buffer`` or ``close``, so its memory is never freed under the
        registration. False, and nothing done, when this client will never use NIXL
        (``transport`` tcp or shm, or auto on a host without an RDMA NIC)."""
        return self._d.routes.register_buffer(buffer)

    def unregister_buffer(self, buffer: BufferLike) -> bool:
        """Undo ``register_buffer(buffer)`` and drop the client's reference to it (reads into
        it and writes from it then go through bounce buffers); False when it was not
        registered. Do not unregister a buffer that an operation is still using."""
        return self._d.routes.unregister_buffer(buffer)

    # ---- introspection --------------------------------------------------------------------------

    def stats(self, *, tiers: bool = False) -> dict[str, Any]:
        """Counters of this client (hits, misses by reason, bytes), suspect servers, the
        transport each server is reached over (``transports``; ``shm_servers`` too) and the
        memory regions registered for NIXL. With ``tiers``, also ``tiers``: the servers'
        per-tier counters (hot, cold) summed over the servers that answered (a STAT each)."""
        out: dict[str, Any] = self._stats.snapshot()
        if tiers:
            out["tiers"] = sum_tiers(self.server_stats().values())
        out["servers"] = self._d.addresses()
        out["map_epoch"] = self._d.epoch
        out["suspect_servers"] = self._d.pool.suspects()
        out["shm_servers"] = [a for a in out["servers"] if self._d.routes.is_shm(a)]
        out["transports"] = {a: self._d.routes.transport_of(a) for a in out["servers"]}
        out["nixl_regions"] = self._d.routes.nixl_regions()     # registered, bounce included
        return out

    def fill(self) -> Fill:
        """How full the servers are and how much they have evicted (one STAT each; servers that
        do not answer are left out and not counted in ``servers``)."""
        return fill_of(self.server_stats().values())

    def server_stats(self) -> dict[str, dict[str, Any] | None]:
        """Each server's STAT (None for a server that did not answer)."""
        futures = {a: self._d.submit(self._d.call, a, protocol.stat) for a in self._d.addresses()}
        return {a: (None if isinstance(stat := f.result(), Miss) else stat)
                for a, f in futures.items()}


def _parent(parent: ParentLike, what: str) -> list[bytes] | None:
    """A ``parent`` argument as its candidate keys (None for none); InvalidRequest naming
    ``what`` for a key that is empty, not a key, or longer than ``PARENT_MAX``."""
    if parent is None:
        return None
    candidates = [parent] if isinstance(parent, (str, bytes, bytearray, memoryview)) \
        else list(parent)
    out = []
    for candidate in candidates:
        raw = validate_key(candidate)
        if len(raw) > PARENT_MAX:
            raise InvalidRequest(f"{what} {raw[:80]!r} is {len(raw)} bytes; a parent key is at "
                                 f"most {PARENT_MAX}")
        out.append(raw)
    return out


def _flags(content_addressed: bool, pinned: bool = False) -> int:
    return (FLAG_CONTENT_ADDRESSED if content_addressed else 0) | (FLAG_PINNED if pinned else 0)

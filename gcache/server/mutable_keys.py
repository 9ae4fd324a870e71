"""Keys a later put may give another value, and the rule that keeps a server that was out of the
cluster map from serving one of them older than a put acknowledged elsewhere meanwhile.

While a server is out of the map (dead, draining, left), clients put its keys on other servers;
when it comes back, the map hands those keys back to it. A content-addressed key (a KV page: the
key names its value; puts say so with ``FLAG_CONTENT_ADDRESSED``) cannot have changed, and
whatever the server kept is still right. Any other key may have been put again elsewhere, so:

- a server *hides* its mutable keys (reads are misses) from the moment it may have been out of the
  map: from start until a master first answers (how long it was down is unknown), and from any
  heartbeat answer that says it is dead, draining or left;
- when a master answers that it is in the map, it *unhides* them if the map epoch is still the one
  it last saw while in the map (nothing about placement changed in between: a quick restart),
  and otherwise deletes them (``purge``, on a thread of its own, keys hidden until deleted);
- a put of a hidden key deletes the hidden value first: the new one is current.

An unrelated map change during a restart (another server joining) therefore costs the mutable
keys too: a miss, never a stale value. Content-addressed keys pay nothing but a flag.

A server that stays in the map also loses keys, to a server that joins or returns; a mutable
key it no longer owns could be put again on its new owner and come back to this server later
(that owner dies) older than that put. ``drop_unless`` deletes those on each map change.

The mutable keys (with their placement-group hash, for ``drop_unless``) and the last epoch seen
in the map are kept beside the server's id (on the disk with a cold tier, else in /dev/shm
beside the arena), so they live exactly as long as the values: an append-only log, written
before the put is acknowledged, rewritten after a purge. Without masters no map can move a key,
and nothing is kept or hidden.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_RECORD = struct.Struct("<HQ")        # key length, placement-group hash; then the key


class MutableKeys:
    def __init__(self, path: str | None, delete: Callable[[bytes], object]) -> None:
        """``path``: the log's path (the epoch lives at ``path + ".epoch"``); None when the
        server has no masters. ``delete`` removes a key from every tier."""
        self._path, self._delete = path, delete
        self._lock = threading.Lock()
        self._keys: dict[bytes, int] = {}        # key -> its placement-group hash
        self._hidden: set[bytes] = set()
        self._in_map = False
        self._last_epoch: int | None = None
        self._fd = -1
        if path is not None:
            self._keys = _load(path)
            self._last_epoch = _load_epoch(path + ".epoch")
            self._hidden = set(self._keys)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if self._hidden:
                log.info("mutable_keys.hidden count=%d until a master answers",
                         len(self._hidden))

    @property
    def enabled(self) -> bool:
        return self._path is not None

    def hidden(self, key: bytes) -> bool:
        """Whether a read of ``key`` must miss: it may be older than a put elsewhere."""
        return bool(self._hidden) and key in self._hidden

    def is_mutable(self, key: bytes) -> bool:
        return key in self._keys

    def count(self) -> int:
        return len(self._keys)

    def written(self, key: bytes, *, content_addressed: bool, group: int = 0) -> None:
        """A put of ``key`` (placement-group hash ``group``) is about to be stored: call
        before it is acknowledged."""
        if self._path is None:
            return
        with self._lock:
            if key in self._hidden:
                self._hidden.discard(key)
                self._delete(key)               # the hidden value must not outlive this put
            if not content_addressed and self._keys.get(key) != group:
                os.write(self._fd, _RECORD.pack(len(key), group) + key)
                self._keys[key] = group

    def in_map(self, epoch: int) -> None:
        """A master answered that this server is in the map, at map ``epoch``."""
        if self._path is None:
            return
        with self._lock:
            purge: set[bytes] = set()
            if not self._in_map:
                self._in_map = True
                if self._last_epoch == epoch:
                    if self._hidden:
                        log.info("mutable_keys.unhidden count=%d epoch=%d: the map did not move",
                                 len(self._hidden), epoch)
                    self._hidden.clear()
                else:
                    purge = set(self._hidden)
                    log.info("mutable_keys.purge count=%d epoch=%d last_epoch=%s: the map moved "
                             "while this server was out of it", len(purge), epoch,
                             self._last_epoch)
            if epoch != self._last_epoch:
                self._last_epoch = epoch
                _save_epoch(self._path + ".epoch", epoch)
        if purge:
            threading.Thread(target=self._purge, args=(purge,), name="gcache-purge",
                             daemon=True).start()

    def out_of_map(self, state: str) -> None:
        """A master answered that this server is out of the map (``state``): others may take
        puts of its keys from now on."""
        if self._path is None:
            return
        with self._lock:
            if self._in_map:
                log.info("mutable_keys.hidden count=%d state=%s", len(self._keys), state)
            self._in_map = False
            self._hidden = set(self._keys)

    def _purge(self, keys: set[bytes]) -> None:
        for key in keys:
            with self._lock:
                if key in self._hidden:         # else put again since: that value is current
                    self._forget(key)
        assert self._path is not None              # keys are kept (and purged) only with a log
        with self._lock:
            _rewrite(self._path, self._keys)
        log.info("mutable_keys.purged count=%d", len(keys))

    def drop_unless(self, owned: Callable[[bytes, int], bool]) -> int:
        """Delete every mutable key for which ``owned(key, group)`` is false (the map gave it
        to another server); how many went."""
        with self._lock:
            keys = list(self._keys.items())
        dropped = 0
        for key, group in keys:
            if owned(key, group):
                continue
            with self._lock:
                if self._keys.get(key) == group:
                    self._forget(key)
                    dropped += 1
        if dropped:
            assert self._path is not None          # keys are kept (and dropped) only with a log
            with self._lock:
                _rewrite(self._path, self._keys)
            log.info("mutable_keys.dropped count=%d: owned by another server now", dropped)
        return dropped

    def _forget(self, key: bytes) -> None:
        """Delete ``key`` from the tiers and from this record (under ``_lock``)."""
        self._delete(key)
        self._keys.pop(key, None)
        self._hidden.discard(key)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _load(path: str) -> dict[bytes, int]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return {}
    keys, pos = {}, 0
    while pos + _RECORD.size <= len(raw):
        n, group = _RECORD.unpack_from(raw, pos)
        start = pos + _RECORD.size
        if n == 0 or start + n > len(raw):
            break                                # a write cut short by a crash: the tail
        keys[raw[start:start + n]] = group       # a later record of a key is its last put
        pos = start + n
    return keys


def _rewrite(path: str, keys: dict[bytes, int]) -> None:
    """Replace the log by ``keys`` (its fd is O_APPEND on the same inode: truncate in place)."""
    with open(path, "r+b") as fh:
        fh.truncate(0)
        fh.write(b"".join(_RECORD.pack(len(k), g) + k for k, g in keys.items()))


def _load_epoch(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def _save_epoch(path: str, epoch: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(str(epoch))
    os.replace(tmp, path)

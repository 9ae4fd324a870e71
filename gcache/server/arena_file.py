"""The arena's file beside its memory: the key of its header checks, and whether its tmpfs has
room for it. Split from ``arena`` (which maps and carves the file) because neither is about
segments or spans.
"""

from __future__ import annotations

import logging
import os

from gcache.config import format_size
from gcache.errors import ConfigError

log = logging.getLogger(__name__)
SECRET_BYTES = 32                    # the header checks' key, in ``<arena>.key`` (0600)


def load_or_create_secret(arena_path: str, *, attached: bool) -> tuple[bytes, bool]:
    """The key of an arena's header checks, kept beside it in ``<arena>.key`` (0600): clients
    map the arena, never this file; and whether it was there already. A re-attached arena
    keeps its key; a new one gets a fresh one, and so does one whose key is gone (its checked
    records cannot be trusted then; a format 2 arena never had one)."""
    path = arena_path + ".key"
    if attached:
        try:
            with open(path, "rb") as fh:
                secret = fh.read()
            if len(secret) == SECRET_BYTES:
                return secret, True
        except FileNotFoundError:
            pass
        log.info("arena.key_missing path=%s: records that need it cannot be verified", path)
    secret = os.urandom(SECRET_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secret)
    finally:
        os.close(fd)
    return secret, False


def check_room(fd: int, path: str, size_bytes: int) -> None:
    """Refuse an arena its tmpfs cannot hold: the mapping would succeed and the first touch of a
    page past the room (the prefault, or a write) would kill the server with SIGBUS, which a
    restart policy turns into a crash loop. Pages the file holds already count as room: an
    attached arena keeps them, another one's are freed when it is emptied."""
    held = os.fstat(fd).st_blocks * 512
    fs = os.fstatvfs(fd)
    free = fs.f_bavail * fs.f_frsize
    if size_bytes - held > free:
        raise ConfigError("memory", size_bytes, f"{os.path.dirname(path)} has "
                          f"{format_size(free)} free for {path}; size it over memory "
                          "(docs/operations.md) or lower memory")

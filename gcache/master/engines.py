"""Inference engines announced to the masters, for routers to find (soft state, the leader's).

An engine's connector announces it every few seconds with a time to live; the leader keeps the
last announcement per URL and model until it expires. Nothing of this goes through Raft: it is
rebuilt within one announce period after a leader change, as heartbeats are, and a router that asks
during that period sees fewer engines for a moment, never wrong ones. Bounded: at most
``MAX_ENGINES`` are held and every field has a length limit, so announcements cannot grow the
leader's memory without end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from gcache.errors import InvalidRequest

# A full list of the longest announcements (about 1.6 KB each) stays under gRPC's 4 MiB
# default message limit, so ListEngines always answers.
MAX_ENGINES = 1024
MAX_FIELD = 512
MAX_TTL_S = 300.0


@dataclass(frozen=True, slots=True)
class EngineRecord:
    url: str
    model: str
    events: str
    bucket: int


def checked(url: str, model: str, events: str, bucket: int, ttl_s: float) -> EngineRecord:
    """The record of an announcement; ``InvalidRequest`` names what is wrong with it."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise InvalidRequest(f"engine url {url[:MAX_FIELD]!r} must be http://HOST:PORT")
    if not model:
        raise InvalidRequest("engine model is empty")
    for name, value in (("url", url), ("model", model), ("events", events)):
        if len(value) > MAX_FIELD:
            raise InvalidRequest(f"engine {name} is {len(value)} characters; at most {MAX_FIELD}")
    if events and not events.startswith(("tcp://", "ipc://")):
        raise InvalidRequest(f"engine events {events!r} must be tcp://HOST:PORT or ipc://PATH")
    if bucket > 64:
        raise InvalidRequest(f"engine bucket {bucket} is not a length bucket (0..64)")
    if not 0 < ttl_s <= MAX_TTL_S:
        raise InvalidRequest(f"ttl_s {ttl_s} must be in (0, {MAX_TTL_S:g}] seconds")
    return EngineRecord(f"{parts.scheme}://{parts.hostname}:{port}", model, events, bucket)


class EngineRegistry:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # (url, model) -> (record, expiry): one engine may serve several names
        self._engines: dict[tuple[str, str], tuple[EngineRecord, float]] = {}
        self._lock = threading.Lock()

    def announce(self, record: EngineRecord, ttl_s: float) -> None:
        with self._lock:
            now = self._clock()
            self._expire(now)
            key = (record.url, record.model)
            if key not in self._engines and len(self._engines) >= MAX_ENGINES:
                raise InvalidRequest(f"{MAX_ENGINES} engines are announced already; no more")
            self._engines[key] = (record, now + ttl_s)

    def live(self) -> list[EngineRecord]:
        with self._lock:
            self._expire(self._clock())
            return [record for record, _ in self._engines.values()]

    def _expire(self, now: float) -> None:
        for key in [key for key, (_, expiry) in self._engines.items() if expiry <= now]:
            del self._engines[key]

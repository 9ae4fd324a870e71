"""An engine announcing itself to the masters, so that ``gcache-router`` finds it there.

A connector that knows its engine's API URL (``gcache_engine_url``) announces the engine, its
served model, its KV event endpoint and its length bucket every ``EVERY_S`` with a time to live
of ``TTL_S`` (``gcache.master.engines``: soft state in the leader). A dead engine stops
announcing and leaves the routers' pools within the TTL, before which their health checks have
already marked it down. A master that cannot be reached is retried on the next period, quietly
after the first warning: announcing never blocks or fails the engine.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from gcache.errors import ConfigError
from gcache.kv.connect import count_setting
from gcache.master_client import MasterClient, jittered, parse_masters
from gcache.proto import master_pb2 as pb

log = logging.getLogger(__name__)

EVERY_S = 5.0
TTL_S = 15.0


def events_endpoint(endpoint: str, engine_url: str) -> str:
    """The KV event endpoint as another host reaches it: vLLM binds ``tcp://*:PORT``, which is
    reached at the engine URL's host."""
    if endpoint.startswith("tcp://*:"):
        return f"tcp://{urlsplit(engine_url).hostname}:{endpoint.rsplit(':', 1)[1]}"
    return endpoint


class EngineAnnouncer:
    def __init__(self, masters: Sequence[str], engines: Sequence[pb.Engine], *,
                 token: str | None = None, every_s: float = EVERY_S,
                 ttl_s: float = TTL_S) -> None:
        self.engines, self.every_s, self.ttl_s = list(engines), every_s, ttl_s
        self._client = MasterClient(masters, token=token, timeout_s=min(2.0, every_s))
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="gcache-engine-announce")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for engine in self.engines:
                    self._client.announce_engine(engine, self.ttl_s)
                self._warned = False
            except Exception as exc:        # the masters' problem is never the engine's
                if not self._warned:
                    log.warning("gcache: cannot announce this engine to the masters: %s", exc)
                    self._warned = True
            self._stop.wait(jittered(self.every_s))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._client.close()


def announcer_from_settings(settings: Mapping[str, Any], served_names: Sequence[str],
                            kv_events: str, *, every_s: float = EVERY_S,
                            ttl_s: float = TTL_S) -> EngineAnnouncer | None:
    """The announcer that ``gcache_engine_url`` (and ``gcache_engine_bucket``) ask for, of an
    engine serving ``served_names`` with KV events at ``kv_events`` ("" for none); None when
    no URL is set. Raises ``ConfigError`` naming the setting that is wrong."""
    url = settings.get("engine_url")
    if not url:
        return None
    masters = settings.get("master")
    if not masters:
        raise ConfigError("gcache_engine_url", url, "engines are announced to the masters: "
                          "set gcache_master too")
    bucket = count_setting(settings, "engine_bucket", 0)
    parts = urlsplit(str(url))
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError("gcache_engine_url", url, "must be http://HOST:PORT, as routers "
                          "reach this engine's API")
    events = events_endpoint(kv_events, str(url)) if kv_events else ""
    engines = [pb.Engine(url=str(url), model=name, events=events, bucket=bucket)
               for name in served_names]
    return EngineAnnouncer(parse_masters(masters), engines, every_s=every_s, ttl_s=ttl_s,
                           token=settings.get("token") or os.environ.get("GCACHE_TOKEN"))

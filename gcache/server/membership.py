"""A data server's membership: register with the masters, then heartbeat, for good.

The server's id is chosen once and kept in a file (next to the cold tier when there is one, else
next to the arena in /dev/shm), so a restarted server comes back under the same id, owns the
same keys on the clients' ring, and serves the data its arena or disk kept. Masters being down
costs nothing but log lines: clients keep using their cached map, and this thread registers
again when a master answers that it does not know the server.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable

from gcache.errors import MasterError, NotRegistered, Unavailable
from gcache.master_client import STATE_NAMES, MasterClient, jittered
from gcache.proto import master_pb2 as pb

log = logging.getLogger(__name__)


def load_or_create_id(paths: list[str]) -> str:
    """The id stored at the first of ``paths`` that holds one (written to the first path too,
    so adding a disk later keeps the id), or a new one written to the first path."""
    server_id = ""
    for path in paths:
        try:
            with open(path, encoding="ascii") as f:
                server_id = f.read().strip()
        except FileNotFoundError:
            continue
        if server_id:
            break
    path = paths[0]
    if server_id and os.path.exists(path):
        return server_id
    server_id = server_id or f"s-{uuid.uuid4().hex[:12]}"
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(server_id + "\n")
    os.replace(tmp, path)
    return server_id


class Membership(threading.Thread):
    def __init__(self, link: MasterClient, record: pb.Server, *, interval_s: float,
                 on_state: Callable[[str], None] | None = None,
                 on_answer: Callable[[int, str], None] | None = None,
                 on_tenants: Callable[[int], None] | None = None) -> None:
        """``on_state(state)`` on each change of this server's state; ``on_answer(epoch,
        state)`` on every answer of a master (a registration is "alive");
        ``on_tenants(version)`` with the tenant table's version of every heartbeat answer."""
        super().__init__(name="gcache-membership", daemon=True)
        self.link, self.record, self.interval_s = link, record, interval_s
        self.on_state, self.on_answer, self.on_tenants = on_state, on_answer, on_tenants
        self.state = "unregistered"
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.link.close()

    def run(self) -> None:
        registered = False
        while not self._halt.is_set():
            try:
                if not registered:
                    epoch = self.link.register(self.record)
                    log.info("membership.registered id=%s epoch=%d", self.record.id, epoch)
                    registered = True
                    self._answered(epoch, "alive")
                reply = self.link.heartbeat(self.record.id)
                self._answered(reply.epoch, STATE_NAMES.get(reply.state, "alive"))
                if self.on_tenants is not None:
                    self.on_tenants(reply.tenants_version)
            except Unavailable as exc:
                log.warning("membership.no_master error=%s", exc)
            except NotRegistered as exc:
                log.warning("membership.unknown_to_master error=%s: registering again", exc)
                registered = False
            except MasterError as exc:
                log.warning("membership.refused error=%s", exc)
            except Exception:      # the thread's top level: log, keep beating
                log.exception("membership.failed")
            self._halt.wait(jittered(self.interval_s))

    def _answered(self, epoch: int, state: str) -> None:
        if self.on_answer is not None:
            self.on_answer(epoch, state)
        self._set_state(state)

    def _set_state(self, state: str) -> None:
        if state != self.state:
            log.info("membership.state id=%s %s -> %s", self.record.id, self.state, state)
            self.state = state
            if self.on_state is not None:
                self.on_state(state)

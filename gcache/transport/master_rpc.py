"""Calls to the masters, for data servers (register, heartbeat) and clients (the cluster map).

``MasterLink`` holds a gRPC channel per master address and tries them in turn, starting with the
last one that answered; a follower's FAILED_PRECONDITION names the leader, which is tried next.
Every call carries the cluster token in ``gcache-token`` metadata and has a deadline. gRPC's
errors become ``MasterError`` here: ``AuthFailed``-like refusals as ``MasterError`` with the
master's message, an unreachable group as ``Unavailable``.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from gcache.errors import MasterError, NotRegistered, Unavailable
from gcache.proto import master_pb2 as pb
from gcache.proto import master_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

TOKEN_KEY = "gcache-token"
LEADER_KEY = "gcache-leader"
IN_MAP = (pb.ALIVE, pb.SUSPECT)     # states whose servers own keys (suspect keeps its keys)
STATE_NAMES = {pb.ALIVE: "alive", pb.SUSPECT: "suspect", pb.DEAD: "dead",
               pb.DRAINING: "draining", pb.LEFT: "left"}


class MasterLink:
    def __init__(self, addresses: Sequence[str], *, token: str | None = None,
                 timeout_s: float = 2.0) -> None:
        if not addresses:
            raise ValueError("no master addresses given")
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self._metadata = ((TOKEN_KEY, token),) if token else ()
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, Any]] = {}
        self._preferred = self.addresses[0]

    def close(self) -> None:
        with self._lock:
            for channel, _ in self._stubs.values():
                channel.close()
            self._stubs.clear()

    def call(self, method: str, request: Any) -> Any:
        """Call ``method`` on the first master that can answer it. Raises ``MasterError`` for a
        refusal (bad token, bad request) and ``Unavailable`` when no master answered."""
        with self._lock:
            order = [self._preferred] + [a for a in self.addresses if a != self._preferred]
        errors = []
        tried: set[str] = set()
        while order:
            address = order.pop(0)
            if address in tried:
                continue
            tried.add(address)
            try:
                reply = getattr(self._stub(address), method)(
                    request, timeout=self.timeout_s, metadata=self._metadata)
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    leader = dict(exc.trailing_metadata() or ()).get(LEADER_KEY)
                    if leader:
                        order.insert(0, leader)
                    errors.append(f"{address}: {exc.details()}")
                    continue
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    errors.append(f"{address}: {code.name.lower()}")
                    continue
                if code == grpc.StatusCode.NOT_FOUND:
                    raise NotRegistered(f"{method} at {address}: {exc.details()}") from None
                raise MasterError(f"{method} refused by {address}: {exc.details()}") from None
            with self._lock:
                self._preferred = address
            return reply
        raise Unavailable(f"{method}: no master answered ({'; '.join(errors)})")

    def _stub(self, address: str) -> Any:
        with self._lock:
            if address not in self._stubs:
                channel = grpc.insecure_channel(address)
                self._stubs[address] = (channel, pb_grpc.MasterStub(channel))
            return self._stubs[address][1]


def jittered(period_s: float, spread: float = 0.2) -> float:
    """``period_s`` less up to ``spread`` of it: what every loop that calls the masters on a
    period waits, so that a fleet of servers and clients restarted together (or all cut off by
    one master failover) does not call the new leader in lock-step ever after. Never longer
    than the period: the masters count a server's missed beats by it."""
    return period_s * random.uniform(1.0 - spread, 1.0)


def parse_masters(text: str | Sequence[str]) -> list[str]:
    """``"HOST:PORT,HOST:PORT"`` (or a list) as a list of addresses."""
    items = text.split(",") if isinstance(text, str) else list(text)
    return [item.strip() for item in items if item.strip()]

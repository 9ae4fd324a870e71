"""The one client of the masters: data servers (register, heartbeat, leave), clients (the cluster
map) and the command line (status, drain) all call the masters through ``MasterClient``.

It holds a gRPC channel per master address and tries them in turn, starting with the last one
that answered; a follower's FAILED_PRECONDITION names the leader, which is tried next. Every
call carries the cluster token in ``gcache-token`` metadata and has a deadline. gRPC's errors
become the error tree's here: NOT_FOUND as ``NotRegistered``, other refusals (bad token, bad
request) as ``MasterError`` with the master's message, every member answering that it is not the
leader as ``NotLeader`` (an election is running), and an unreachable group as ``Unavailable``.
The metadata keys are this module's; the masters' service imports them from here.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import grpc

from gcache.errors import ConfigError, MasterError, NotLeader, NotRegistered, Unavailable
from gcache.proto import master_pb2 as pb
from gcache.proto import master_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from google.protobuf.message import Message

log = logging.getLogger(__name__)

TOKEN_KEY = "gcache-token"
LEADER_KEY = "gcache-leader"
STATE_NAMES = {pb.ALIVE: "alive", pb.SUSPECT: "suspect", pb.DEAD: "dead",
               pb.DRAINING: "draining", pb.LEFT: "left"}

Reply = TypeVar("Reply")


class MasterClient:
    """Typed calls to the master group at ``addresses``; safe to share between threads."""

    def __init__(self, addresses: Sequence[str], *, token: str | None = None,
                 timeout_s: float = 2.0) -> None:
        if not addresses:
            raise ConfigError("master", list(addresses), "needs at least one HOST:PORT")
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self._metadata: tuple[tuple[str, str], ...] = ((TOKEN_KEY, token),) if token else ()
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, pb_grpc.MasterStub]] = {}
        self._preferred = self.addresses[0]

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for channel, _ in self._stubs.values():
                channel.close()
            self._stubs.clear()

    # ---- the calls ---------------------------------------------------------------------------

    def register(self, server: pb.Server) -> int:
        """Join (or rejoin after a restart) as ``server``; returns the map epoch."""
        reply: pb.RegisterReply = self._call(
            "Register", lambda s: s.Register, pb.RegisterRequest(server=server))
        return reply.epoch

    def heartbeat(self, server_id: str) -> pb.HeartbeatReply:
        """The epoch and this server's state as the leader holds them, before this beat."""
        reply: pb.HeartbeatReply = self._call(
            "Heartbeat", lambda s: s.Heartbeat, pb.HeartbeatRequest(id=server_id))
        return reply

    def cluster_map(self, since_epoch: int = 0) -> pb.ClusterMap:
        """The map, or ``changed=False`` and no servers when ``since_epoch`` is current."""
        reply: pb.ClusterMap = self._call(
            "GetClusterMap", lambda s: s.GetClusterMap,
            pb.GetClusterMapRequest(since_epoch=since_epoch))
        return reply

    def drain(self, server_id: str) -> int:
        """Start moving ``server_id``'s keys to their owners without it; returns the epoch."""
        reply: pb.DrainReply = self._call("Drain", lambda s: s.Drain,
                                          pb.DrainRequest(id=server_id))
        return reply.epoch

    def leave(self, server_id: str) -> int:
        """A drained server is done (state LEFT); returns the epoch."""
        reply: pb.LeaveReply = self._call("Leave", lambda s: s.Leave,
                                          pb.LeaveRequest(id=server_id))
        return reply.epoch

    def status(self) -> pb.StatusReply:
        """The answering member's view: its role, the leader, term, epoch and servers."""
        reply: pb.StatusReply = self._call("Status", lambda s: s.Status, pb.StatusRequest())
        return reply

    def announce_engine(self, engine: pb.Engine, ttl_s: float) -> None:
        """Tell the leader ``engine`` serves requests, for ``ttl_s`` seconds from now."""
        self._call("AnnounceEngine", lambda s: s.AnnounceEngine,
                   pb.AnnounceEngineRequest(engine=engine, ttl_s=ttl_s))

    def engines(self) -> list[pb.Engine]:
        """The engines announced and not yet expired, as the leader holds them."""
        reply: pb.ListEnginesReply = self._call(
            "ListEngines", lambda s: s.ListEngines, pb.ListEnginesRequest())
        return list(reply.engines)

    # ---- tenants (the cluster token's; ``gcache.master.tenant_rpcs``) ------------------------

    def add_tenant(self, name: str, *, memory_quota_bytes: int = 0,
                   disk_quota_bytes: int = 0) -> pb.AddTenantReply:
        """A new tenant; the reply holds its token, shown this once."""
        reply: pb.AddTenantReply = self._call("AddTenant", lambda s: s.AddTenant,
                                              pb.AddTenantRequest(
                                                  name=name,
                                                  memory_quota_bytes=memory_quota_bytes,
                                                  disk_quota_bytes=disk_quota_bytes))
        return reply

    def set_tenant(self, name: str, *, memory_quota_bytes: int | None = None,
                   disk_quota_bytes: int | None = None,
                   new_token: bool = False) -> pb.SetTenantReply:
        """New quotas (None: unchanged); ``new_token``: a fresh token in the reply (a revoked
        tenant is active again)."""
        request = pb.SetTenantRequest(name=name, new_token=new_token)
        if memory_quota_bytes is not None:
            request.memory_quota_bytes = memory_quota_bytes
        if disk_quota_bytes is not None:
            request.disk_quota_bytes = disk_quota_bytes
        reply: pb.SetTenantReply = self._call("SetTenant", lambda s: s.SetTenant, request)
        return reply

    def revoke_tenant(self, name: str) -> pb.Tenant:
        reply: pb.TenantReply = self._call("RevokeTenant", lambda s: s.RevokeTenant,
                                           pb.TenantNameRequest(name=name))
        return reply.tenant

    def remove_tenant(self, name: str) -> pb.Tenant:
        """The tenant is gone; every server deletes its values when it learns so."""
        reply: pb.TenantReply = self._call("RemoveTenant", lambda s: s.RemoveTenant,
                                           pb.TenantNameRequest(name=name))
        return reply.tenant

    def tenants(self, since_version: int = 0) -> pb.TenantTable:
        """The tenant table with token hashes, or ``changed=False`` when ``since_version`` is
        current."""
        reply: pb.TenantTable = self._call("GetTenants", lambda s: s.GetTenants,
                                           pb.GetTenantsRequest(since_version=since_version))
        return reply

    # ---- one call, over every member ---------------------------------------------------------

    def _call(self, name: str, method: Callable[[pb_grpc.MasterStub], Callable[..., Reply]],
              request: Message) -> Reply:
        with self._lock:
            order = [self._preferred] + [a for a in self.addresses if a != self._preferred]
        errors: list[str] = []
        tried: set[str] = set()
        only_followers = True
        while order:
            address = order.pop(0)
            if address in tried:
                continue
            tried.add(address)
            try:
                reply = method(self._stub(address))(
                    request, timeout=self.timeout_s, metadata=self._metadata)
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    # grpc-stubs type each pair as a class with a bytes value: at runtime it
                    # is a (key, value) namedtuple, and a text key's value is a str.
                    trailers: dict[str, str] = dict(
                        exc.trailing_metadata() or ())  # type: ignore[arg-type]
                    leader = trailers.get(LEADER_KEY)
                    if leader:
                        order.insert(0, leader)
                    errors.append(f"{address}: {exc.details()}")
                    continue
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    only_followers = False
                    errors.append(f"{address}: {code.name.lower()}")
                    continue
                if code == grpc.StatusCode.NOT_FOUND:
                    raise NotRegistered(f"{name} at {address}: {exc.details()}") from None
                raise MasterError(f"{name} refused by {address}: {exc.details()}") from None
            with self._lock:
                self._preferred = address
            return reply
        detail = f"{name}: no master answered ({'; '.join(errors)})"
        if only_followers and errors:
            raise NotLeader(None, detail)
        raise Unavailable(detail)

    def _stub(self, address: str) -> pb_grpc.MasterStub:
        with self._lock:
            if address not in self._stubs:
                channel = grpc.insecure_channel(address)
                # grpcio-tools generates master_pb2_grpc without annotations
                stub = pb_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
                self._stubs[address] = (channel, stub)
            return self._stubs[address][1]


def jittered(period_s: float, spread: float = 0.2) -> float:
    """``period_s`` less up to ``spread`` of it: what every loop that calls the masters on a
    period waits, so that a fleet of servers and clients restarted together (or all cut off by
    one master failover) does not call the new leader in lock-step ever after. Never longer
    than the period: the masters count a server's missed beats by it."""
    return period_s * random.uniform(1.0 - spread, 1.0)


def backoff_s(attempt: int, *, base_s: float = 0.25, cap_s: float = 2.0) -> float:
    """How long retry ``attempt`` (0 first) of a failed call waits: exponential with full
    jitter, so callers that failed together spread out instead of retrying in step."""
    return random.uniform(0.0, min(cap_s, base_s * 2.0 ** attempt))


def parse_masters(text: str | Sequence[str]) -> list[str]:
    """``"HOST:PORT,HOST:PORT"`` (or a list) as a list of addresses."""
    items = text.split(",") if isinstance(text, str) else list(text)
    return [item.strip() for item in items if item.strip()]

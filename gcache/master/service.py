"""The master's gRPC service (``gcache/proto/master.proto``); the tenant calls are
``tenant_rpcs``', the token check ``token_check``'s.

Reads (GetClusterMap, Status) are answered from this member's applied state, which may lag
the leader's by a few entries; clients never move to a map older than the one they have. A
member serves no map until it has caught up with the leader once since it started (pysyncobj's
``isReady``), so a restarted member never hands a new client the map it had when it died.
Register and Drain are Raft commands, which pysyncobj forwards to the leader from any member.
Heartbeat and the engines' announcements (``gcache.master.engines``) live in the leader's
memory, so a follower refuses them with FAILED_PRECONDITION and names the leader's gRPC address
in the ``gcache-leader`` trailing metadata; ``gcache.master_client`` follows it.
"""

from __future__ import annotations

import logging

import grpc

from gcache.errors import InvalidRequest, MasterError
from gcache.master.engines import EngineRegistry, checked
from gcache.master.liveness import Liveness
from gcache.master.metrics import timed
from gcache.master.raft import RaftGroup
from gcache.master.state import Applied, Command, Drain, Leave, Refused, Register, ServerRecord
from gcache.master.tenant_rpcs import TenantRpcs
from gcache.master_client import LEADER_KEY, STATE_NAMES
from gcache.placement import Placement
from gcache.proto import master_pb2 as pb
from gcache.proto import master_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

STATE_TO_PB = {name: state for state, name in STATE_NAMES.items()}   # the one table, inverted


def server_pb(record: ServerRecord) -> pb.Server:
    return pb.Server(id=record.id, address=record.address, host_id=record.host_id,
                     capacity_bytes=record.capacity_bytes, state=STATE_TO_PB[record.state])


class MasterService(TenantRpcs, pb_grpc.MasterServicer):
    def __init__(self, group: RaftGroup, liveness: Liveness, placement: Placement, *,
                 secured: bool = False) -> None:
        """``secured``: the group has a cluster token (tenants need one)."""
        self.group, self.liveness, self.secured = group, liveness, secured
        self._placement = placement.to_pb()
        self.engines = EngineRegistry()

    @timed
    def Register(self, request: pb.RegisterRequest,
                 context: grpc.ServicerContext) -> pb.RegisterReply:
        s = request.server
        if not s.id or not s.address or s.capacity_bytes <= 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "Register needs server.id, server.address and a positive "
                          f"server.capacity_bytes; got id={s.id!r} address={s.address!r} "
                          f"capacity_bytes={s.capacity_bytes}")
        record = ServerRecord(s.id, s.address, s.host_id, s.capacity_bytes)
        epoch = self._applied(context, self._submit(context, Register(record)))
        self.liveness.beat(s.id)
        log.info("master.registered server=%s address=%s epoch=%d", s.id, s.address, epoch)
        return pb.RegisterReply(id=s.id, epoch=epoch)

    @timed
    def Heartbeat(self, request: pb.HeartbeatRequest,
                  context: grpc.ServicerContext) -> pb.HeartbeatReply:
        if not self.group.is_leader():
            self._redirect(context)
        record = self.group.state.servers.get(request.id)
        if record is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"server {request.id!r} is not registered; Register first")
        # The state before this beat is recorded: a dead server whose beat brings it back must
        # learn from this very answer that it was dead (it then hides what it may hold stale,
        # gcache.server.mutable_keys), before liveness marks it alive and clients route to it.
        epoch, state = self.group.state.epoch, STATE_TO_PB[record.state]
        self.liveness.beat(request.id)
        return pb.HeartbeatReply(epoch=epoch, state=state,
                                 tenants_version=self.group.state.tenants.version)

    @timed
    def GetClusterMap(self, request: pb.GetClusterMapRequest,
                      context: grpc.ServicerContext) -> pb.ClusterMap:
        if not self.group.is_ready():
            # A restarted member replays its own journal before the leader reaches it: a map
            # from then would be one the cluster left long ago, and a client whose first map
            # it is would place every key on it. The refusal (like a follower's refusal of a
            # heartbeat) sends the client on to the next member.
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this member is catching up with the Raft log; ask another")
        state = self.group.state
        epoch = state.epoch
        if request.since_epoch == epoch and epoch:
            return pb.ClusterMap(epoch=epoch, changed=False)
        return pb.ClusterMap(epoch=epoch, changed=True,
                             servers=[server_pb(s) for s in list(state.servers.values())],
                             placement=self._placement)

    @timed
    def Drain(self, request: pb.DrainRequest, context: grpc.ServicerContext) -> pb.DrainReply:
        result = self._submit(context, Drain(request.id))
        if isinstance(result, Refused):
            context.abort(grpc.StatusCode.NOT_FOUND, result.reason)
        return pb.DrainReply(epoch=self._applied(context, result))

    @timed
    def Leave(self, request: pb.LeaveRequest, context: grpc.ServicerContext) -> pb.LeaveReply:
        result = self._submit(context, Leave(request.id))
        if isinstance(result, Refused):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, result.reason)
        return pb.LeaveReply(epoch=self._applied(context, result))

    @timed
    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        state, leader = self.group.state, self.group.leader()
        return pb.StatusReply(self_raft=self.group.self_addr, leader_raft=leader or "",
                              leader_grpc=state.masters.get(leader or "", ""),
                              is_leader=self.group.is_leader(), epoch=state.epoch,
                              raft_term=self.group.term(),
                              servers=[server_pb(s) for s in list(state.servers.values())])

    @timed
    def AnnounceEngine(self, request: pb.AnnounceEngineRequest,
                       context: grpc.ServicerContext) -> pb.AnnounceEngineReply:
        if not self.group.is_leader():
            self._redirect(context)
        e = request.engine
        try:
            self.engines.announce(checked(e.url, e.model, e.events, e.bucket, request.ttl_s),
                                  request.ttl_s)
        except InvalidRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.AnnounceEngineReply()

    @timed
    def ListEngines(self, request: pb.ListEnginesRequest,
                    context: grpc.ServicerContext) -> pb.ListEnginesReply:
        if not self.group.is_leader():
            self._redirect(context)
        return pb.ListEnginesReply(engines=[
            pb.Engine(url=r.url, model=r.model, events=r.events, bucket=r.bucket)
            for r in self.engines.live()])

    def _submit(self, context: grpc.ServicerContext, command: Command) -> Applied | Refused:
        try:
            return self.group.submit(command)
        except MasterError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise                            # abort raises; this tells the type checker

    @staticmethod
    def _applied(context: grpc.ServicerContext, result: Applied | Refused) -> int:
        if isinstance(result, Refused):      # Register has no precondition: never refused
            context.abort(grpc.StatusCode.INTERNAL, result.reason)
            raise AssertionError(result.reason)
        return result.epoch

    def _redirect(self, context: grpc.ServicerContext) -> None:
        leader = self.group.leader()
        target = self.group.state.masters.get(leader or "", "")
        context.set_trailing_metadata(((LEADER_KEY, target),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      f"not the leader; the leader is {target or 'unknown (election running)'}")

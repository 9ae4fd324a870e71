"""The masters' tenant calls (``gcache tenant ...``, and the data servers' ``GetTenants``).

A mixin of ``service.MasterService``: the changes are Raft commands (``tenants``), submitted
from whichever member took the call and forwarded to the leader by pysyncobj. A new token is
made here, on that member, before its command is logged: only its hash enters the log and the
replicated table, and the token itself is in the reply alone (shown once; ``gcache tenant set
NAME --new-token`` makes another). Tenants need a cluster token: without one every caller is
the administrator and no server asks anybody to prove anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from gcache.errors import InvalidRequest
from gcache.master.metrics import timed
from gcache.master.state import Applied, Command, Refused
from gcache.master.tenants import (
    AddTenant,
    RemoveTenant,
    RevokeTenant,
    SetTenant,
    TenantCommand,
    TenantRecord,
)
from gcache.proto import master_pb2 as pb
from gcache.tenant_token import check_name, make_token, token_hash

if TYPE_CHECKING:
    from gcache.master.raft import RaftGroup

QUOTA_MAX = 1 << 62
STATE_TO_PB = {"active": pb.ACTIVE, "revoked": pb.REVOKED}


def tenant_pb(record: TenantRecord, *, with_hash: bool = False) -> pb.Tenant:
    return pb.Tenant(name=record.name, id=record.id,
                     token_sha256=record.token_sha256 if with_hash else b"",
                     memory_quota_bytes=record.memory_quota_bytes,
                     disk_quota_bytes=record.disk_quota_bytes, state=STATE_TO_PB[record.state])


class TenantRpcs:
    group: RaftGroup
    secured: bool

    # MasterService's: submits a command to the Raft group and waits for its outcome
    _submit: Callable[[grpc.ServicerContext, Command], Applied | Refused]

    @timed
    def AddTenant(self, request: pb.AddTenantRequest,
                  context: grpc.ServicerContext) -> pb.AddTenantReply:
        name = self._checked(context, request.name, request.memory_quota_bytes,
                             request.disk_quota_bytes)
        token = make_token(name)
        record = self._tenant_after(context, AddTenant(
            name, token_hash(token), request.memory_quota_bytes, request.disk_quota_bytes))
        return pb.AddTenantReply(token=token, tenant=tenant_pb(record))

    @timed
    def SetTenant(self, request: pb.SetTenantRequest,
                  context: grpc.ServicerContext) -> pb.SetTenantReply:
        memory = request.memory_quota_bytes if request.HasField("memory_quota_bytes") else None
        disk = request.disk_quota_bytes if request.HasField("disk_quota_bytes") else None
        name = self._checked(context, request.name, memory or 0, disk or 0)
        token = make_token(name) if request.new_token else ""
        record = self._tenant_after(context, SetTenant(
            name, memory, disk, token_hash(token) if token else None))
        return pb.SetTenantReply(token=token, tenant=tenant_pb(record))

    @timed
    def RevokeTenant(self, request: pb.TenantNameRequest,
                     context: grpc.ServicerContext) -> pb.TenantReply:
        name = self._checked(context, request.name, 0, 0)
        return pb.TenantReply(tenant=tenant_pb(self._tenant_after(context, RevokeTenant(name))))

    @timed
    def RemoveTenant(self, request: pb.TenantNameRequest,
                     context: grpc.ServicerContext) -> pb.TenantReply:
        name = self._checked(context, request.name, 0, 0)
        before = self.group.state.tenants.tenants.get(name)
        result = self._submit(context, RemoveTenant(name))
        if isinstance(result, Refused) or before is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          result.reason if isinstance(result, Refused) else f"no tenant {name!r}")
            raise AssertionError("abort raises")
        return pb.TenantReply(tenant=tenant_pb(before))

    @timed
    def GetTenants(self, request: pb.GetTenantsRequest,
                   context: grpc.ServicerContext) -> pb.TenantTable:
        """The table with token hashes (the data servers verify AUTH with them)."""
        if not self.group.is_ready():
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this member is catching up with the Raft log; ask another")
        table = self.group.state.tenants
        version = table.version
        if request.since_version == version and version:
            return pb.TenantTable(version=version, changed=False)
        return pb.TenantTable(version=version, changed=True, tenants=[
            tenant_pb(r, with_hash=True) for r in list(table.tenants.values())])

    def _checked(self, context: grpc.ServicerContext, name: str, *quotas: int) -> str:
        """``name``, once the call may go ahead: a secured group, a valid name and quotas."""
        if not self.secured:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "tenants need a cluster token: without one every caller is the "
                          "administrator (start the masters and servers with --token)")
        try:
            check_name(name)
        except InvalidRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if any(q >= QUOTA_MAX for q in quotas):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"a quota is {max(quotas)} bytes; at most {QUOTA_MAX - 1}")
        return name

    def _tenant_after(self, context: grpc.ServicerContext,
                      command: TenantCommand) -> TenantRecord:
        """Submit ``command``; the tenant as this member holds it once it applied."""
        result = self._submit(context, command)
        record = self.group.state.tenants.tenants.get(command.name)
        if isinstance(result, Refused) or record is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          result.reason if isinstance(result, Refused)
                          else f"tenant {command.name!r} was removed meanwhile")
            raise AssertionError("abort raises")
        return record

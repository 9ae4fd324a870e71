"""The tenant table in the masters' replicated state: who may use the data plane besides the
administrator, with what quotas.

Pure and deterministic, like ``state.ClusterState``, which holds one ``TenantTable`` and hands it
the tenant commands: every member applies the same commands in the same order. A command holds
what the leader decided before it was logged (the token's hash: the token itself is made by the
member that took the request, shown once, and never logged).

Invariants:
- A tenant's ``id`` is given at ``AddTenant`` from ``next_id`` and never reused, even after
  ``RemoveTenant``: a data server keys a tenant's values by its id (``gcache.server.
  tenant_keys``), so a tenant added again under a removed one's name never sees its values
  (a server that was down during the removal deletes them when it learns the table).
- ``version`` grows by one with every change; servers fetch the table when the heartbeat
  answer shows a version they have not seen.
- Quotas are bytes per data server (0: none reserved: everything the tenant holds is in the
  shared part and reclaimed first when room is short; ``docs/operations.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TENANT_STATES = ("active", "revoked")


@dataclass(frozen=True, slots=True)
class TenantRecord:
    name: str
    id: int
    token_sha256: bytes         # SHA-256 of the token (``gcache.tenant_token.token_hash``)
    memory_quota_bytes: int     # per server; 0 is none
    disk_quota_bytes: int       # per server; 0 is none
    state: str = "active"


# ---- commands --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AddTenant:
    """A new tenant; refused when the name is taken."""
    name: str
    token_sha256: bytes
    memory_quota_bytes: int
    disk_quota_bytes: int


@dataclass(frozen=True, slots=True)
class SetTenant:
    """New quotas (None: unchanged), or a new token's hash (a revoked tenant made active
    again with a fresh token: ``gcache tenant set NAME --new-token``)."""
    name: str
    memory_quota_bytes: int | None = None
    disk_quota_bytes: int | None = None
    token_sha256: bytes | None = None


@dataclass(frozen=True, slots=True)
class RevokeTenant:
    """The tenant's token no longer opens anything; its values stay until it is removed."""
    name: str


@dataclass(frozen=True, slots=True)
class RemoveTenant:
    """The tenant is gone; the servers delete its values."""
    name: str


TenantCommand = AddTenant | SetTenant | RevokeTenant | RemoveTenant


class TenantTable:
    def __init__(self) -> None:
        self.tenants: dict[str, TenantRecord] = {}
        self.version = 0
        self.next_id = 1              # 0 is the administrator's keys

    def apply(self, command: TenantCommand) -> str | None:
        """Apply one command; the reason it was refused, or None."""
        if isinstance(command, AddTenant):
            if command.name in self.tenants:
                return f"tenant {command.name!r} exists already"
            self.tenants[command.name] = TenantRecord(
                command.name, self.next_id, command.token_sha256,
                command.memory_quota_bytes, command.disk_quota_bytes)
            self.next_id += 1
        else:
            current = self.tenants.get(command.name)
            if current is None:
                return f"no tenant {command.name!r}"
            if isinstance(command, SetTenant):
                self.tenants[command.name] = _set(current, command)
            elif isinstance(command, RevokeTenant):
                self.tenants[command.name] = replace(current, state="revoked")
            else:
                del self.tenants[command.name]
        self.version += 1
        return None


def _set(current: TenantRecord, command: SetTenant) -> TenantRecord:
    record = current
    if command.memory_quota_bytes is not None:
        record = replace(record, memory_quota_bytes=command.memory_quota_bytes)
    if command.disk_quota_bytes is not None:
        record = replace(record, disk_quota_bytes=command.disk_quota_bytes)
    if command.token_sha256 is not None:
        record = replace(record, token_sha256=command.token_sha256, state="active")
    return record

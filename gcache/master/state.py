"""The master's replicated state: which servers exist, their state, and the map epoch.

Pure and deterministic: ``apply(command)`` is the only mutator, and every member of the Raft
group applies the same commands in the same order, so every member holds the same state. The
Raft library stays behind ``raft.py``; this module is tested without it.

Invariants:
- A server id is stable across its restarts (the server chooses and persists it); registering
  again updates its address and capacity and makes it alive.
- ``epoch`` grows by one whenever anything a client's placement depends on changes: a server
  joins, changes address or capacity, or changes state. Heartbeats are not commands (the leader
  holds them in memory), so a healthy cluster's epoch stands still.
- The map (what clients place keys on) is the servers that are alive or suspect: a suspect server
  keeps its keys until it is declared dead; draining, dead and departed servers are out.
- The tenant table (``tenants.TenantTable``) has a version of its own: tenants change no
  placement, so they never move the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gcache.errors import InvalidRequest
from gcache.master.tenants import (
    AddTenant,
    RemoveTenant,
    RevokeTenant,
    SetTenant,
    TenantCommand,
    TenantTable,
)

STATES = ("alive", "suspect", "dead", "draining", "left")


@dataclass(frozen=True, slots=True)
class ServerRecord:
    id: str
    address: str          # HOST:PORT of its data plane
    host_id: str
    capacity_bytes: int
    state: str = "alive"


# ---- commands: what the Raft log holds (pickled by pysyncobj, so plain frozen records) --------

@dataclass(frozen=True, slots=True)
class Register:
    """A server joins, or rejoins after a restart (alive again, address and capacity new)."""
    record: ServerRecord


@dataclass(frozen=True, slots=True)
class SetState:
    """Liveness moves a server between alive, suspect and dead."""
    server_id: str
    state: str


@dataclass(frozen=True, slots=True)
class Drain:
    """An operator asks a server to hand its keys over; refused for an unknown server."""
    server_id: str


@dataclass(frozen=True, slots=True)
class Leave:
    """A drained server is done; refused unless it is draining."""
    server_id: str


@dataclass(frozen=True, slots=True)
class AnnounceMaster:
    """A member's gRPC address, for followers' redirects."""
    raft: str
    grpc: str


Command = Register | SetState | Drain | Leave | AnnounceMaster | TenantCommand
TENANT_COMMANDS = (AddTenant, SetTenant, RevokeTenant, RemoveTenant)


# ---- results ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Applied:
    """The command took effect (or changed nothing); the map's epoch after it (a tenant
    command's: the tenant table's version)."""
    epoch: int


@dataclass(frozen=True, slots=True)
class Refused:
    """The command's precondition did not hold in log order; nothing changed."""
    reason: str


Result = Applied | Refused


class ClusterState:
    def __init__(self) -> None:
        self.servers: dict[str, ServerRecord] = {}
        self.epoch = 0
        self.masters: dict[str, str] = {}    # raft address -> gRPC address, for redirects
        self.tenants = TenantTable()

    def __setstate__(self, state: dict[str, object]) -> None:
        """A snapshot written before tenants existed has no table: an empty one."""
        self.__dict__.update(state)
        self.__dict__.setdefault("tenants", TenantTable())

    def apply(self, command: Command) -> Result:
        """Apply one command. Drain and leave check their precondition here, in log order,
        because a member's own view may lag the log."""
        if isinstance(command, Register):
            return Applied(self._register(command.record))
        if isinstance(command, SetState):
            return Applied(self._set_state(command.server_id, command.state))
        if isinstance(command, Drain):
            if command.server_id not in self.servers:
                return Refused(f"no server {command.server_id!r} to drain")
            return Applied(self._set_state(command.server_id, "draining"))
        if isinstance(command, Leave):
            record = self.servers.get(command.server_id)
            if record is None or record.state != "draining":
                return Refused(f"server {command.server_id!r} can leave only while it is "
                               "draining")
            return Applied(self._set_state(command.server_id, "left"))
        if isinstance(command, AnnounceMaster):
            self.masters[command.raft] = command.grpc
            return Applied(self.epoch)
        if isinstance(command, TENANT_COMMANDS):
            refused = self.tenants.apply(command)
            return Refused(refused) if refused else Applied(self.tenants.version)
        raise InvalidRequest(f"unknown command {command!r}")

    def _register(self, record: ServerRecord) -> int:
        record = replace(record, state="alive")
        if self.servers.get(record.id) != record:
            self.servers[record.id] = record
            self.epoch += 1
        return self.epoch

    def _set_state(self, server_id: str, state: str) -> int:
        if state not in STATES:
            raise InvalidRequest(f"state {state!r} is not one of {STATES}")
        current = self.servers.get(server_id)
        if current is not None and current.state != state:
            self.servers[server_id] = replace(current, state=state)
            self.epoch += 1
        return self.epoch

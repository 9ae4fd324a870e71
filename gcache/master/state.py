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
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

STATES = ("alive", "suspect", "dead", "draining", "left")
REFUSED = -1


@dataclass(frozen=True, slots=True)
class ServerRecord:
    id: str
    address: str          # HOST:PORT of its data plane
    host_id: str
    capacity_bytes: int
    state: str = "alive"


class ClusterState:
    def __init__(self) -> None:
        self.servers: dict[str, ServerRecord] = {}
        self.epoch = 0
        self.masters: dict[str, str] = {}    # raft address -> gRPC address, for redirects

    def apply(self, command: tuple) -> Any:
        """Apply one command; returns the epoch after it, or ``REFUSED`` for a drain of an
        unknown server or a leave of one that is not draining. Commands: ``("register",
        record)``, ``("set_state", id, state)``, ``("drain", id)``, ``("leave", id)``,
        ``("announce_master", raft, grpc)``. Drain and leave check their precondition here, in
        log order, because a member's own view may lag the log."""
        op = command[0]
        if op == "register":
            return self._register(command[1])
        if op == "set_state":
            return self._set_state(command[1], command[2])
        if op in ("drain", "leave"):
            record = self.servers.get(command[1])
            allowed = record is not None and (op == "drain" or record.state == "draining")
            if not allowed:
                return REFUSED
            return self._set_state(command[1], "draining" if op == "drain" else "left")
        if op == "announce_master":
            self.masters[command[1]] = command[2]
            return self.epoch
        raise ValueError(f"unknown command {op!r}")

    def _register(self, record: ServerRecord) -> int:
        record = replace(record, state="alive")
        if self.servers.get(record.id) != record:
            self.servers[record.id] = record
            self.epoch += 1
        return self.epoch

    def _set_state(self, server_id: str, state: str) -> int:
        if state not in STATES:
            raise ValueError(f"state {state!r} is not one of {STATES}")
        current = self.servers.get(server_id)
        if current is not None and current.state != state:
            self.servers[server_id] = replace(current, state=state)
            self.epoch += 1
        return self.epoch

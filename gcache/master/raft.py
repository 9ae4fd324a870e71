"""The Raft group, behind the few calls the master needs: pysyncobj lives only here.

``RaftGroup`` replicates ``ClusterState`` commands. A command submitted on a follower is
forwarded to the leader by pysyncobj; ``submit`` waits for it to be applied here, or raises
``Unavailable`` (no leader, no quorum, timeout). pysyncobj's failure codes and exceptions never
leave this module.

pysyncobj unpickles what arrives on the Raft port, so an open port would run any peer's code. With a
cluster token it is pysyncobj's ``password``: every message, the first included, is Fernet-encrypted
and authenticated (HMAC-SHA256) under a key derived from it, and one that does not verify is dropped
with its connection before anything is unpickled; each connection also agrees on a random session
key, so recorded messages cannot be replayed on another. Without a token the config keeps the Raft
address on loopback. The journal and snapshots live in ``data_dir``, so a restarted member comes
back with the state it had.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.syncobj import SyncObjException

from gcache.errors import Unavailable
from gcache.master.state import ClusterState, Command, Result

ROLE_REFRESH_S = 0.005    # how stale is_leader / leader / term may be (a Raft tick is ~1 ms)
# pysyncobj caches a peer's DNS answer for 600 s (a failed lookup for 30 s): a member rescheduled
# under the same name with a new address (a Kubernetes StatefulSet pod) would be unreachable to
# the others for up to ten minutes. Peers' names are re-resolved this often instead.
DNS_CACHE_S, DNS_FAIL_CACHE_S = 5.0, 1.0


class _Replica(SyncObj):  # type: ignore[misc]  # pysyncobj ships no type information
    if TYPE_CHECKING:
        # The pysyncobj calls RaftGroup makes, typed as 0.3.x (pinned) behaves.
        def getStatus(self) -> dict[str, object]: ...
        def addOnTickCallback(self, callback: Callable[[], None]) -> None: ...
        def isReady(self) -> bool: ...
        def destroy(self) -> None: ...

    def __init__(self, self_node: str, others: Sequence[str], conf: SyncObjConf,
                 on_applied: Callable[[], None]) -> None:
        self.state = ClusterState()
        self._on_applied = on_applied
        super().__init__(self_node, list(others), conf)

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj ships no type information
    def apply(self, command: Command) -> Result:
        result = self.state.apply(command)
        self._on_applied()
        return result


@dataclass(frozen=True, slots=True)
class _Role:
    """This member's view of the group, as the Raft thread last saw it."""
    leading: bool = False
    leader: str | None = None          # the leader's Raft address; None during an election
    term: int = 0


class _Outcome(TypedDict, total=False):     # filled by pysyncobj's callback
    result: Result | None     # None unless error is FAIL_REASON.SUCCESS
    error: int                # a FAIL_REASON


class RaftGroup:
    """One member of the group at ``self_addr`` (HOST:PORT) with ``peers``."""

    def __init__(self, self_addr: str, peers: Sequence[str], data_dir: str, *,
                 token: str | None = None,
                 election_timeout_s: tuple[float, float] = (0.4, 1.4)) -> None:
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        globalDnsResolver().setTimeouts(DNS_CACHE_S, DNS_FAIL_CACHE_S)
        conf = SyncObjConf(journalFile=os.path.join(data_dir, "raft.journal"),
                           fullDumpFile=os.path.join(data_dir, "raft.dump"),
                           raftMinTimeout=election_timeout_s[0],
                           raftMaxTimeout=election_timeout_s[1],
                           connectionTimeout=2.0, connectionRetryTime=1.0,
                           leaderFallbackTimeout=5.0, dynamicMembershipChange=False,
                           password=token)
        self.self_addr = self_addr
        self.changed = threading.Condition()
        self._role = _Role()
        self._role_at = 0.0
        self._replica = _Replica(self_addr, [p for p in peers if p != self_addr], conf,
                                 self._notify)
        self._replica.addOnTickCallback(self._observe)

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    @property
    def state(self) -> ClusterState:
        """The applied state (read-only for callers; may lag the leader's by a few entries)."""
        return self._replica.state

    def submit(self, command: Command, *, timeout_s: float = 3.0) -> Result:
        """Replicate ``command`` and return its result once applied here."""
        done = threading.Event()
        outcome: _Outcome = {}

        def callback(result: Result | None, error: int) -> None:
            outcome["result"], outcome["error"] = result, error
            done.set()

        try:
            self._replica.apply(command, callback=callback)
        except SyncObjException as exc:
            raise Unavailable(f"raft refused the command: {exc}") from None
        if not done.wait(timeout_s):
            raise Unavailable(f"raft did not apply the command within {timeout_s:.1f}s "
                              "(no leader or no quorum)")
        if outcome["error"] != FAIL_REASON.SUCCESS:
            raise Unavailable(f"raft command failed: {_reason(outcome['error'])}")
        result = outcome["result"]
        assert result is not None            # pysyncobj passes the result along with SUCCESS
        return result

    def _observe(self) -> None:
        """On the Raft thread, after a tick: read the role through the public ``getStatus()``,
        which is safe only here (from a gRPC thread it iterates dicts that this thread refills
        in place on an election), and publish it whole for the gRPC threads. At most every
        ``ROLE_REFRESH_S``: a tick comes with every message under load."""
        now = time.monotonic()
        if now - self._role_at < ROLE_REFRESH_S:
            return
        self._role_at = now
        status = self._replica.getStatus()
        leader, own = status.get("leader"), status.get("self")
        term = status.get("raft_term")
        self._role = _Role(leading=leader is not None and leader == own,
                           leader=None if leader is None else _address(leader),
                           term=term if isinstance(term, int) else 0)

    def is_leader(self) -> bool:
        return self._role.leading

    def leader(self) -> str | None:
        return self._role.leader

    def term(self) -> int:
        return self._role.term

    def is_ready(self) -> bool:
        return self._replica.isReady()

    def close(self) -> None:
        self._replica.destroy()


def _address(node: object) -> str:
    """A pysyncobj node's HOST:PORT (``TCPNode.address``)."""
    return str(getattr(node, "address", node))


def _reason(code: int) -> str:
    names: dict[int, str] = {v: k for k, v in vars(FAIL_REASON).items() if isinstance(v, int)}
    return names.get(code, str(code)).lower()

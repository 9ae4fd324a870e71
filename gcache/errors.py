"""GCache's one exception tree.

    GCacheError
    ├── ConfigError            a config key has a value that breaks its rule
    ├── InvalidRequest         a caller or peer asked for something malformed
    │   └── WrongType          an argument of the wrong kind: a str where bytes go, a non-buffer
    ├── ProtocolError          bytes on the wire that are not a valid frame
    ├── TransportError         the path to a peer failed
    │   ├── ConnectFailed
    │   ├── ConnectionLost
    │   └── IOTimeout
    ├── ServerError            the server answered with a failure status (.status)
    │   ├── NoSpace
    │   ├── ChecksumMismatch
    │   └── AuthFailed         missing or wrong cluster token
    ├── MasterError
    │   ├── NotRegistered      the masters do not know the server a request names
    │   └── Unavailable        no master answered
    │       └── NotLeader (.leader)  every member answered, none could serve (an election)
    ├── StartFailed            a local gcache-master or gcache-server process did not come up
    ├── DeviceError            a CUDA call failed
    ├── MissingDependency      an optional library a feature needs is not installed
    └── NoInstance             the router has no healthy engine instance for a request

A class that stands where Python would raise a builtin also derives from it, so that callers'
``except ValueError`` keeps working: ConfigError and InvalidRequest (so WrongType too) are
ValueErrors, WrongType is also a TypeError, and StartFailed, DeviceError and MissingDependency
are RuntimeErrors.

Absence is a value (None/False), failure is an exception. The SDK is the single place where a
TransportError or ServerError becomes a miss. OSError never crosses a module boundary: transports
translate it here, chaining with ``from``.
"""

from __future__ import annotations


class GCacheError(Exception):
    """Base of every error GCache raises on purpose."""


class ConfigError(GCacheError, ValueError):
    """A configuration value breaks its rule. Carries the key, the value and the rule."""

    def __init__(self, key: str, value: object, rule: str) -> None:
        self.key = key
        self.value = value
        self.rule = rule
        super().__init__(f"config {key}={_shown(key, value)!r}: {rule}")


def _shown(key: str, value: object) -> object:
    """``value`` as an error message may show it: a secret (the cluster token) never is,
    since messages end up in logs and engine start-up errors."""
    if _secret(key):
        return "<redacted>"
    if isinstance(value, dict):
        return {k: "<redacted>" if _secret(str(k)) else v for k, v in value.items()}
    return value


def _secret(key: str) -> bool:
    """``token``, ``gcache_token``, ``cluster.token``: the cluster's shared secret."""
    return key.lower().replace(".", "_").split("_")[-1] == "token"


class InvalidRequest(GCacheError, ValueError):
    """A request is malformed: bad key, bad size, unknown handle."""


class WrongType(InvalidRequest, TypeError):
    """An argument of the wrong kind, where Python itself would raise TypeError: a str where
    bytes go, an object that is not a buffer, a read-only buffer where one is written, a
    keyword argument the call does not take."""


class ProtocolError(GCacheError):
    """Bytes received are not a valid frame (bad magic, version, or declared sizes)."""


class TransportError(GCacheError):
    """The path to a peer failed; the peer may be fine."""


class ConnectFailed(TransportError):
    """No connection could be made to the peer."""


class ConnectionLost(TransportError):
    """The peer closed or reset the connection mid-exchange."""


class IOTimeout(TransportError):
    """One IO did not complete within its timeout."""


class ServerError(GCacheError):
    """The server answered with a failure status. ``status`` is the wire status name."""

    def __init__(self, status: str, message: str = "") -> None:
        self.status = status
        super().__init__(f"server status {status}" + (f": {message}" if message else ""))


class NoSpace(ServerError):
    """The server could not make room (every candidate segment is pinned)."""

    def __init__(self, message: str = "") -> None:
        super().__init__("NO_SPACE", message)


class ChecksumMismatch(ServerError):
    """Bytes did not match their xxh3_64 checksum."""

    def __init__(self, message: str = "") -> None:
        super().__init__("CHECKSUM_MISMATCH", message)


class AuthFailed(ServerError):
    """The server refused the data-plane handshake: no token, or the wrong one."""

    def __init__(self, message: str = "") -> None:
        super().__init__("AUTH_FAILED", message)


class MasterError(GCacheError):
    """A master RPC failed."""


class NotRegistered(MasterError):
    """The masters do not know the server a request names: a heartbeat before Register (or
    after the group lost the record), which must register again, or a drain of an unknown id."""


class Unavailable(MasterError):
    """No master answered."""


class NotLeader(Unavailable):
    """Every master asked answered that another must serve the call (not the leader, or still
    catching up with the log): an election or a restart is under way. ``leader`` names the
    leader one of them knew of, if any. An ``Unavailable``: callers retry it the same way."""

    def __init__(self, leader: str | None, detail: str = "") -> None:
        self.leader = leader
        super().__init__(detail or f"not the leader; leader is {leader or 'unknown'}")


class StartFailed(GCacheError, RuntimeError):
    """A local ``gcache-master`` or ``gcache-server`` process (``gcache.cli.local_masters``,
    ``local_cluster``) exited or was not ready in time, or no free port was found for it."""


class DeviceError(GCacheError, RuntimeError):
    """A CUDA runtime call failed (``cudaHostRegister`` of an arena); carries its error code."""


class MissingDependency(GCacheError, RuntimeError):
    """A feature needs an optional library that is not installed; the message says how to get
    it (``pip install 'gcache[plot]'``)."""


class NoInstance(GCacheError):
    """The router has no healthy engine instance to send a request to."""

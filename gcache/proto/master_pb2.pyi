from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVER_STATE_UNSPECIFIED: _ClassVar[ServerState]
    ALIVE: _ClassVar[ServerState]
    SUSPECT: _ClassVar[ServerState]
    DEAD: _ClassVar[ServerState]
    DRAINING: _ClassVar[ServerState]
    LEFT: _ClassVar[ServerState]

class TenantState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TENANT_STATE_UNSPECIFIED: _ClassVar[TenantState]
    ACTIVE: _ClassVar[TenantState]
    REVOKED: _ClassVar[TenantState]
SERVER_STATE_UNSPECIFIED: ServerState
ALIVE: ServerState
SUSPECT: ServerState
DEAD: ServerState
DRAINING: ServerState
LEFT: ServerState
TENANT_STATE_UNSPECIFIED: TenantState
ACTIVE: TenantState
REVOKED: TenantState

class Server(_message.Message):
    __slots__ = ("id", "address", "host_id", "capacity_bytes", "state")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    host_id: str
    capacity_bytes: int
    state: ServerState
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., host_id: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., state: _Optional[_Union[ServerState, str]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("server",)
    SERVER_FIELD_NUMBER: _ClassVar[int]
    server: Server
    def __init__(self, server: _Optional[_Union[Server, _Mapping]] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("id", "epoch")
    ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    id: str
    epoch: int
    def __init__(self, id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("epoch", "state", "tenants_version")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TENANTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    state: ServerState
    tenants_version: int
    def __init__(self, epoch: _Optional[int] = ..., state: _Optional[_Union[ServerState, str]] = ..., tenants_version: _Optional[int] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("vnodes", "group_width")
    VNODES_FIELD_NUMBER: _ClassVar[int]
    GROUP_WIDTH_FIELD_NUMBER: _ClassVar[int]
    vnodes: int
    group_width: int
    def __init__(self, vnodes: _Optional[int] = ..., group_width: _Optional[int] = ...) -> None: ...

class GetClusterMapRequest(_message.Message):
    __slots__ = ("since_epoch",)
    SINCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    since_epoch: int
    def __init__(self, since_epoch: _Optional[int] = ...) -> None: ...

class ClusterMap(_message.Message):
    __slots__ = ("epoch", "changed", "servers", "placement")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    changed: bool
    servers: _containers.RepeatedCompositeFieldContainer[Server]
    placement: Placement
    def __init__(self, epoch: _Optional[int] = ..., changed: _Optional[bool] = ..., servers: _Optional[_Iterable[_Union[Server, _Mapping]]] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("self_raft", "leader_raft", "leader_grpc", "is_leader", "epoch", "raft_term", "servers")
    SELF_RAFT_FIELD_NUMBER: _ClassVar[int]
    LEADER_RAFT_FIELD_NUMBER: _ClassVar[int]
    LEADER_GRPC_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RAFT_TERM_FIELD_NUMBER: _ClassVar[int]
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    self_raft: str
    leader_raft: str
    leader_grpc: str
    is_leader: bool
    epoch: int
    raft_term: int
    servers: _containers.RepeatedCompositeFieldContainer[Server]
    def __init__(self, self_raft: _Optional[str] = ..., leader_raft: _Optional[str] = ..., leader_grpc: _Optional[str] = ..., is_leader: _Optional[bool] = ..., epoch: _Optional[int] = ..., raft_term: _Optional[int] = ..., servers: _Optional[_Iterable[_Union[Server, _Mapping]]] = ...) -> None: ...

class Engine(_message.Message):
    __slots__ = ("url", "model", "events", "bucket")
    URL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    url: str
    model: str
    events: str
    bucket: int
    def __init__(self, url: _Optional[str] = ..., model: _Optional[str] = ..., events: _Optional[str] = ..., bucket: _Optional[int] = ...) -> None: ...

class AnnounceEngineRequest(_message.Message):
    __slots__ = ("engine", "ttl_s")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    engine: Engine
    ttl_s: float
    def __init__(self, engine: _Optional[_Union[Engine, _Mapping]] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class AnnounceEngineReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEnginesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEnginesReply(_message.Message):
    __slots__ = ("engines",)
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    engines: _containers.RepeatedCompositeFieldContainer[Engine]
    def __init__(self, engines: _Optional[_Iterable[_Union[Engine, _Mapping]]] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ("name", "id", "token_sha256", "memory_quota_bytes", "disk_quota_bytes", "state")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_SHA256_FIELD_NUMBER: _ClassVar[int]
    MEMORY_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    id: int
    token_sha256: bytes
    memory_quota_bytes: int
    disk_quota_bytes: int
    state: TenantState
    def __init__(self, name: _Optional[str] = ..., id: _Optional[int] = ..., token_sha256: _Optional[bytes] = ..., memory_quota_bytes: _Optional[int] = ..., disk_quota_bytes: _Optional[int] = ..., state: _Optional[_Union[TenantState, str]] = ...) -> None: ...

class AddTenantRequest(_message.Message):
    __slots__ = ("name", "memory_quota_bytes", "disk_quota_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    memory_quota_bytes: int
    disk_quota_bytes: int
    def __init__(self, name: _Optional[str] = ..., memory_quota_bytes: _Optional[int] = ..., disk_quota_bytes: _Optional[int] = ...) -> None: ...

class AddTenantReply(_message.Message):
    __slots__ = ("token", "tenant")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    token: str
    tenant: Tenant
    def __init__(self, token: _Optional[str] = ..., tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class SetTenantRequest(_message.Message):
    __slots__ = ("name", "memory_quota_bytes", "disk_quota_bytes", "new_token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    memory_quota_bytes: int
    disk_quota_bytes: int
    new_token: bool
    def __init__(self, name: _Optional[str] = ..., memory_quota_bytes: _Optional[int] = ..., disk_quota_bytes: _Optional[int] = ..., new_token: _Optional[bool] = ...) -> None: ...

class SetTenantReply(_message.Message):
    __slots__ = ("token", "tenant")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    token: str
    tenant: Tenant
    def __init__(self, token: _Optional[str] = ..., tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class TenantNameRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class TenantReply(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class GetTenantsRequest(_message.Message):
    __slots__ = ("since_version",)
    SINCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    since_version: int
    def __init__(self, since_version: _Optional[int] = ...) -> None: ...

class TenantTable(_message.Message):
    __slots__ = ("version", "changed", "tenants")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    version: int
    changed: bool
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    def __init__(self, version: _Optional[int] = ..., changed: _Optional[bool] = ..., tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ...) -> None: ...

"""Keys as the server keeps them: a tenant's keys behind a prefix of their own.

A connection proves who it is once (AUTH), and from then on every key it sends is scoped by
that, never by anything in the request: the handler turns each key it reads off the wire into
the internal key (``Scope.inner``) before anything else sees it, and the few keys it sends
back (LIST) into the tenant's own again (``Scope.outer``). The tier, the index, recovery, the
cold tier, mutable keys and the drain all see internal keys, so two tenants' ``"k"`` are two
values everywhere, and a tenant can form no key outside its own space: its keys are always
prefixed, whatever bytes it sends.

Internal keys:
- a tenant's: ``MARK`` (``0xFF 0xFE``, never in UTF-8) + its id (u32, big-endian) + the key;
- the administrator's (the cluster token; no tenant): the key as it is, as before tenants
  existed, so an arena or a disk of an earlier release reads back unchanged; an administrator
  key that itself starts with ``MARK`` is escaped behind id 0 (``MARK + 0`` + key), so the
  administrator can use any key and still never alias a tenant's.

Ids, not names: the masters never reuse an id, so a tenant added again under a removed one's
name never sees what the removed one left on a server that missed the removal. The owner of a
record is its key's id (``owner_of``; 0 for the administrator's): recovery, the per-tenant
counts and the drain tell a value's tenant from its key alone.

Parents (``FLAG_PARENT``) stay as the client sent them in the record (a parent is at most 63
bytes, the record's spare bits): a parent is the child's tenant's key (``parent_key``), so a
tenant's value can only ever hang from its own keys.

A client-visible key keeps its limit (1024 bytes); internal keys are up to
``MAX_INTERNAL_KEY_BYTES``.
"""

from __future__ import annotations

import struct

from gcache.frame import split_parent, with_parent
from gcache.keys import MAX_KEY_BYTES

MARK = b"\xff\xfe"
_ID = struct.Struct(">I")
PREFIX_BYTES = len(MARK) + _ID.size
MAX_INTERNAL_KEY_BYTES = MAX_KEY_BYTES + PREFIX_BYTES
ADMIN = 0                      # the owner of the administrator's keys


def prefix(tenant_id: int) -> bytes:
    return MARK + _ID.pack(tenant_id)


def owner_of(key: bytes) -> int:
    """The tenant id whose key this internal key is; ``ADMIN`` (0) for the administrator's."""
    if key[:2] == MARK and len(key) > PREFIX_BYTES:
        return int(_ID.unpack_from(key, 2)[0])
    return ADMIN


def visible(key: bytes) -> bytes:
    """The key as its owner sent it (for placement: clients place the keys they see)."""
    if key[:2] == MARK and len(key) > PREFIX_BYTES:
        return key[PREFIX_BYTES:]
    return key


def parent_key(child: bytes, parent: bytes) -> bytes:
    """The internal key of ``parent``, named by the internal key ``child``: the child's
    owner's key."""
    return Scope(owner_of(child)).inner(parent)


class Scope:
    """The key space a connection proved: a tenant's (``tenant_id`` > 0), or the
    administrator's."""

    __slots__ = ("_prefix", "tenant_id")

    def __init__(self, tenant_id: int = ADMIN) -> None:
        self.tenant_id = tenant_id
        self._prefix = prefix(tenant_id) if tenant_id else b""

    @property
    def is_tenant(self) -> bool:
        return self.tenant_id != ADMIN

    def inner(self, key: bytes) -> bytes:
        """The internal key of ``key`` as this scope sent it."""
        if self._prefix:
            return self._prefix + key
        return prefix(ADMIN) + key if key[:2] == MARK else key

    def outer(self, key: bytes) -> bytes:
        """``key`` (internal, of this scope) as this scope sees it."""
        return visible(key)

    def owns(self, key: bytes) -> bool:
        """Whether the internal ``key`` is in this scope."""
        return owner_of(key) == self.tenant_id

    def key_field(self, field: bytes, *, has_parent: bool) -> bytes:
        """A request's key field scoped: the key, or with ``FLAG_PARENT`` the key of
        ``key || parent || len`` (the parent stays relative: ``parent_key``). Raises
        ProtocolError for a malformed parent field."""
        if not has_parent:
            return self.inner(field)
        key, parent = split_parent(field)
        return with_parent(self.inner(key), parent)

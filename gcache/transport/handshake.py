"""The data plane's opening exchange, shared by the SDK and by a draining server.

HELLO, and AUTH (an HMAC of the server's nonce under the cluster token) when the server asks for
one; the reply carries the server's facts as JSON and, on a Unix socket, the arena descriptor.
A tenant token (``gcache.tenant_token``) makes AUTH a tenant's (``FLAG_TENANT``: proof, then
name), and the administrator may act as a tenant (``as_tenant``). A tenant never talks to a
server that asks for no AUTH: such a server could not scope its keys, and every key it put
would be everybody's.
"""

from __future__ import annotations

import json
from typing import Any

from gcache.errors import AuthFailed, ProtocolError
from gcache.frame import FLAG_TENANT, HEADER_SIZE, Header, Op, Status, auth_proof, unpack_header
from gcache.outcomes import raise_for_status
from gcache.tenant_token import admin_as_tenant_proof, tenant_of, tenant_proof, token_hash
from gcache.transport.stream import StreamConnection, close_fd


def handshake(conn: StreamConnection, timeout_s: float, token: str | None, *,
               with_fds: bool = False, as_tenant: str | None = None) -> tuple[bytearray, list[int]]:
    """HELLO, and AUTH when the server asks for it; the facts payload and any descriptors.
    ``as_tenant``: with the cluster token, act as that tenant (its keys, none other).

    Raises AuthFailed when the server wants a token we lack or refuses ours, or when this
    client holds a tenant's token and the server asks for none."""
    tenant = tenant_of(token)
    reply, payload, fds = exchange(conn, Header(Op.HELLO, 1), b"", timeout_s, with_fds)
    if reply.status == Status.AUTH_REQUIRED:
        if token is None:
            raise AuthFailed(f"{conn.peer} requires a cluster token and this client has none")
        body, flags = _auth_payload(token, bytes(payload), tenant or as_tenant)
        request = Header(Op.AUTH, 2, flags=flags, payload_len=len(body))
        reply, payload, fds = exchange(conn, request, body, timeout_s, with_fds)
    elif tenant is not None or as_tenant is not None:
        for fd in fds:
            close_fd(fd)
        raise AuthFailed(f"{conn.peer} asks for no token, so it cannot keep tenant "
                         f"{tenant or as_tenant!r}'s keys apart: refusing to use it")
    if reply.status == Status.AUTH_FAILED:
        raise AuthFailed(f"{conn.peer} refused this client's "
                         f"{'token for tenant ' + repr(tenant) if tenant else 'cluster token'}")
    raise_for_status(reply, "HELLO")
    return payload, fds


def _auth_payload(token: str, nonce: bytes, tenant: str | None) -> tuple[bytes, int]:
    """AUTH's payload and flags: the cluster token's proof; a tenant's proof and name; or the
    cluster token's proof of acting as ``tenant``."""
    if tenant is None:
        return auth_proof(token, nonce), 0
    if tenant_of(token) == tenant:
        return tenant_proof(token_hash(token), nonce, tenant) + tenant.encode(), FLAG_TENANT
    return admin_as_tenant_proof(token, nonce, tenant) + tenant.encode(), FLAG_TENANT


def exchange(conn: StreamConnection, request: Header, payload: bytes, timeout_s: float,
              with_fds: bool) -> tuple[Header, bytearray, list[int]]:
    conn.send((request.pack(), payload), timeout_s=timeout_s)
    if with_fds:
        raw, fds = conn.recv_fds(HEADER_SIZE, timeout_s=timeout_s)
    else:
        raw, fds = conn.recv_exact(HEADER_SIZE, timeout_s=timeout_s), []
    reply = unpack_header(raw, max_payload=1 << 20)
    if reply.op != request.op or reply.request_id != request.request_id:
        for fd in fds:
            close_fd(fd)
        raise ProtocolError(f"{request.op.name} answered with {reply.op.name}")
    return reply, conn.recv_exact(reply.payload_len, timeout_s=timeout_s), fds


# Facts a client acts on, and the type each must have; others are informational.
_FACT_TYPES: dict[str, type] = {"host_id": str, "unix_socket": str, "arena_id": str,
                                "arena_bytes": int, "lease_ttl_ms": int}


def parse_facts(payload: bytes | bytearray) -> dict[str, Any]:
    """The HELLO facts as a dict; ProtocolError when they are not a JSON object or a fact the
    client acts on has the wrong type (a lying or broken server is a miss, not a crash)."""
    try:
        facts = json.loads(bytes(payload))
    except ValueError as exc:
        raise ProtocolError(f"HELLO facts are not JSON: {exc}") from None
    if not isinstance(facts, dict):
        raise ProtocolError("HELLO facts are not a JSON object")
    for name, kind in _FACT_TYPES.items():
        value = facts.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise ProtocolError(f"HELLO fact {name!r} is {value!r}; must be {kind.__name__}")
        if kind is int and isinstance(value, int) and value < 0:
            raise ProtocolError(f"HELLO fact {name!r} is {value}; must not be negative")
    return facts

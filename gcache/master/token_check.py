"""Who may call the masters: the cluster token opens every call; an active tenant's token opens
the cluster map only (``GetClusterMap``: a tenant's clients place keys by it, and it names only
servers). Everything else (registration, drains, the tenant table with its token hashes) is the
administrator's. A gRPC interceptor, so no method can forget the check.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import TypeVar, cast

import grpc

from gcache.master.tenants import TenantTable
from gcache.master_client import TOKEN_KEY
from gcache.tenant_token import tenant_of, token_hash

Request = TypeVar("Request")
Response = TypeVar("Response")

TENANT_METHODS = ("/gcache.master.Master/GetClusterMap",)


class TokenCheck(grpc.ServerInterceptor):
    """Refuses every call whose ``gcache-token`` metadata is missing or wrong for its method;
    ``tenants()`` is this member's applied tenant table."""

    def __init__(self, token: str, tenants: Callable[[], TenantTable] | None = None) -> None:
        self._token = token.encode()
        self._tenants = tenants

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails],
                               grpc.RpcMethodHandler[Request, Response] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Request, Response] | None:
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get(TOKEN_KEY)
        if given is None:
            return _refusal("cluster token missing: send it in the gcache-token metadata")
        # a text key's value is a str: only "-bin" keys carry bytes
        text = cast(str, given)
        if hmac.compare_digest(text.encode(), self._token):
            return continuation(handler_call_details)
        name = tenant_of(text)
        if name is None or self._tenants is None:
            return _refusal("cluster token wrong")
        record = self._tenants().tenants.get(name)
        if (record is None or record.state != "active"
                or not hmac.compare_digest(record.token_sha256, token_hash(text))):
            return _refusal(f"tenant {name!r}: token wrong, revoked or unknown")
        if handler_call_details.method not in TENANT_METHODS:
            return _refusal(f"tenant {name!r}: a tenant's token opens only the cluster map; "
                            f"{handler_call_details.method} needs the cluster token")
        return continuation(handler_call_details)


def _refusal(message: str) -> grpc.RpcMethodHandler[Request, Response]:
    # Stands in for any method's handler: it reads no request and sends no response.
    def abort(request: object, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
    return grpc.unary_unary_rpc_method_handler(abort)

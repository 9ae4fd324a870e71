"""What one connection proved, and what it is told for it.

A connection starts unauthenticated when the server has a cluster token (HELLO then answers
with a nonce) and proves one of three things with AUTH:
- the cluster token (no flag: HMAC of the nonce under it): the administrator, whose keys are
  unscoped, as before tenants existed;
- a tenant's token (``FLAG_TENANT``: a proof keyed with the token's hash, then the name;
  ``gcache.tenant_token``): every key it sends is that tenant's (``tenant_keys.Scope``);
- the cluster token acting as a tenant (``FLAG_TENANT``, the proof keyed with the cluster
  token): the same scope, for the drain and an operator's reads. It may act for a revoked
  tenant (to look at what it left), never for a removed one.
The scope comes from the proof alone; nothing in a later request can change it.

A tenant is held to its proof for as long as the connection lives (``still_valid``, asked
before every request): once the table says it is revoked or removed, or holds another token for
it (``gcache tenant set --new-token``: a leaked token must stop working on open connections
too, and a revoke then re-activate within one heartbeat must still end them), its next request
is refused with AUTH_FAILED and the connection closed. A tenant's connection never gets the
arena's descriptor, the NIXL offer nor the Unix socket's path (``facts_for``): mapping the arena
or reading it over RDMA would show every tenant's values, so a tenant's values move over TCP.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Mapping

from gcache.frame import FLAG_TENANT, Status, auth_proof
from gcache.server.request_rules import AUTH_PROOF_BYTES, Refused
from gcache.server.tenant_keys import Scope
from gcache.server.tenant_table import Tenant, Tenants
from gcache.tenant_token import admin_as_tenant_proof, tenant_proof

log = logging.getLogger(__name__)


class ConnectionAuth:
    def __init__(self, token: str | None, tenants: Tenants, peer: str) -> None:
        self._token, self._tenants, self._peer = token, tenants, peer
        self.nonce = os.urandom(16)
        self.authenticated = token is None
        self.scope = Scope()
        self.tenant: Tenant | None = None
        self._acting = False             # the administrator acting as ``tenant``
        self._proven_hash = b""          # the tenant token's hash the proof was keyed with

    def verify(self, flags: int, payload: bytes) -> None:
        """Take an AUTH payload; raises Refused(AUTH_FAILED) when it proves nothing."""
        proof = payload[:AUTH_PROOF_BYTES]
        if not flags & FLAG_TENANT:
            if self._token is not None and not hmac.compare_digest(
                    proof, auth_proof(self._token, self.nonce)):
                log.warning("conn.auth_failed peer=%s", self._peer)
                raise Refused(Status.AUTH_FAILED, "wrong cluster token")
            self.authenticated = True
            return
        name = payload[AUTH_PROOF_BYTES:].decode("utf-8", errors="replace")
        tenant = self._tenants.by_name(name)
        if tenant is None:
            log.warning("conn.auth_failed peer=%s tenant=%r: unknown", self._peer, name[:40])
            raise Refused(Status.AUTH_FAILED, f"no tenant {name[:40]!r}")
        if tenant.active and hmac.compare_digest(
                proof, tenant_proof(tenant.token_sha256, self.nonce, name)):
            self._acting = False
        elif self._token is not None and hmac.compare_digest(
                proof, admin_as_tenant_proof(self._token, self.nonce, name)):
            self._acting = True
        else:
            self._tenants.count(tenant.id, refusals=1)
            log.warning("conn.auth_failed peer=%s tenant=%s active=%s", self._peer, name,
                        tenant.active)
            raise Refused(Status.AUTH_FAILED, f"tenant {name!r}: wrong or revoked token")
        self.tenant, self.scope, self.authenticated = tenant, Scope(tenant.id), True
        self._proven_hash = tenant.token_sha256

    def still_valid(self) -> bool:
        """Whether the connection may go on: its tenant (if any) is still active with the
        token it proved, or, for the administrator acting as one, still exists."""
        if self.tenant is None:
            return True
        if self._acting:
            return self._tenants.exists(self.tenant.id)
        now = self._tenants.by_id(self.tenant.id)
        return now is not None and now.active and hmac.compare_digest(now.token_sha256,
                                                                       self._proven_hash)


def facts_for(hello: Mapping[str, object], *, tenant: bool) -> bytes:
    """HELLO's facts as JSON; a tenant's leave out the arena's ways in (see the module
    docstring)."""
    if not tenant:
        return json.dumps(hello).encode()
    facts = {k: v for k, v in hello.items() if k != "nixl"}
    facts["unix_socket"] = ""
    return json.dumps(facts).encode()

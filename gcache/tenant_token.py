"""Tenant tokens: their form, the hash the masters keep of them, and the proofs AUTH carries.

A tenant token is ``<name>.<secret>``: the tenant's name (``NAME_RULE``), a dot, and 32 random
bytes in URL-safe base64 without padding (43 characters). The name rides in the token so that a
client holding nothing else knows whom it proves to be; the secret is what it proves. The
masters make the token once (``gcache tenant add``) and keep only its SHA-256
(``token_hash``), which they replicate to the data servers with the tenant table.

A data server never sees a tenant's token, only its hash, so AUTH for a tenant proves knowledge
of the hash: ``tenant_proof`` is HMAC-SHA256 keyed with the hash over the server's nonce, a
context string and the name. Anyone holding the hash could make it: the masters and servers,
which the administrator runs, hold it; a tenant holding its token computes it; nobody else.
The administrator (the cluster token) may act as a tenant (a draining server hands a tenant's
values to their new owner that way): ``admin_as_tenant_proof`` is keyed with the cluster token,
over another context, so neither proof stands in for the other.

Why a hash and not the token itself in the table: the table travels to every server and into
the masters' Raft journal; a leaked copy gives data-plane access as the tenant (the hash is the
data-plane key) but not the token, which the masters also accept on their API for the
cluster map. A revoked or removed tenant's hash is worthless: servers check the tenant's state
on every request.

A cluster token must not have a tenant token's form (``is_tenant_token``): the SDK tells the
two apart by form alone.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re

from gcache.errors import InvalidRequest

NAME_RULE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
NAME_TEXT = ("a tenant name is 1..32 characters: a lowercase letter, then lowercase letters, "
             "digits, '_' or '-'")
NAME_MAX_BYTES = 32
SECRET_BYTES = 32
_TOKEN_RULE = re.compile(r"^([a-z][a-z0-9_-]{0,31})\.([A-Za-z0-9_-]{43})$")
TENANT_CONTEXT = b"gcache-tenant-v1"
ADMIN_AS_TENANT_CONTEXT = b"gcache-admin-as-tenant-v1"


def check_name(name: str) -> str:
    """``name`` when it is a valid tenant name; raises InvalidRequest naming the rule."""
    if not isinstance(name, str) or not NAME_RULE.match(name):
        raise InvalidRequest(f"tenant name {name!r}: {NAME_TEXT}")
    return name


def make_token(name: str) -> str:
    """A new token for tenant ``name`` (shown once; the masters keep its hash)."""
    secret = base64.urlsafe_b64encode(os.urandom(SECRET_BYTES)).rstrip(b"=").decode()
    return f"{check_name(name)}.{secret}"


def tenant_of(token: str | None) -> str | None:
    """The tenant a token names, or None when it is not a tenant token (a cluster token)."""
    if token is None:
        return None
    match = _TOKEN_RULE.match(token)
    return match.group(1) if match else None


def is_tenant_token(token: str | None) -> bool:
    return tenant_of(token) is not None


def token_hash(token: str) -> bytes:
    """What the masters keep of a token: its SHA-256 (32 bytes)."""
    return hashlib.sha256(token.encode()).digest()


def tenant_proof(hashed: bytes, nonce: bytes, name: str) -> bytes:
    """AUTH's proof that the connection holds tenant ``name``'s token (whose hash is
    ``hashed``), answering ``nonce``."""
    return hmac.new(hashed, nonce + TENANT_CONTEXT + name.encode(), hashlib.sha256).digest()


def admin_as_tenant_proof(cluster_token: str, nonce: bytes, name: str) -> bytes:
    """AUTH's proof that the connection holds the cluster token and acts as tenant ``name``."""
    return hmac.new(cluster_token.encode(), nonce + ADMIN_AS_TENANT_CONTEXT + name.encode(),
                    hashlib.sha256).digest()

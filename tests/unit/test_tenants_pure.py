"""The pure parts of tenants: tokens and proofs (``gcache.tenant_token``), the server's scoped
keys (``gcache.server.tenant_keys``) and the masters' tenant table (``gcache.master.tenants``),
by tables."""

from __future__ import annotations

import pickle

import pytest

from gcache.errors import InvalidRequest
from gcache.master.state import Applied, ClusterState, Refused
from gcache.master.tenants import AddTenant, RemoveTenant, RevokeTenant, SetTenant
from gcache.server.tenant_keys import ADMIN, MARK, Scope, owner_of, parent_key, prefix, visible
from gcache.tenant_token import (
    admin_as_tenant_proof,
    check_name,
    make_token,
    tenant_of,
    tenant_proof,
    token_hash,
)

SECRET = "A" * 43

TOKENS = {   # token -> the tenant it names (None: a cluster token)
    "a_tenant_token_names_its_tenant": (f"alice.{SECRET}", "alice"),
    "names_may_carry_digits_dashes_and_underscores": (f"team-7_b.{SECRET}", "team-7_b"),
    "a_cluster_token_is_no_tenant_token": ("correct-horse-battery-staple", None),
    "a_short_secret_is_no_tenant_token": ("alice.short-secret-of-a-cluster-token", None),
    "an_upper_case_name_is_no_tenant_token": (f"Alice.{SECRET}", None),
    "a_secret_with_a_dot_is_no_tenant_token": (f"alice.{SECRET[:-1]}.", None),
    "no_token": (None, None),
}


@pytest.mark.parametrize("case", sorted(TOKENS))
def test_what_a_token_names(case):
    token, tenant = TOKENS[case]
    assert tenant_of(token) == tenant


def test_a_new_token_names_its_tenant_and_is_never_the_same_twice():
    first, second = make_token("alice"), make_token("alice")
    assert tenant_of(first) == tenant_of(second) == "alice" and first != second
    with pytest.raises(InvalidRequest, match="tenant name"):
        check_name("no spaces")


def test_the_proofs_differ_by_tenant_nonce_and_kind():
    token, nonce = make_token("alice"), b"n" * 16
    proof = tenant_proof(token_hash(token), nonce, "alice")
    assert proof == tenant_proof(token_hash(token), nonce, "alice") and len(proof) == 32
    assert proof != tenant_proof(token_hash(token), nonce, "alicf")
    assert proof != tenant_proof(token_hash(token), b"m" * 16, "alice")
    assert proof != admin_as_tenant_proof(token, nonce, "alice")


KEYS = {   # (scope's tenant, key sent) -> (internal key, its owner)
    "a_tenants_key_goes_behind_its_prefix": (7, b"k", prefix(7) + b"k", 7),
    "a_tenant_sending_anothers_internal_key_gets_its_own": (
        7, prefix(9) + b"k", prefix(7) + prefix(9) + b"k", 7),
    "the_administrators_key_is_kept_as_sent": (ADMIN, b"k", b"k", ADMIN),
    "the_administrators_key_that_looks_internal_is_escaped": (
        ADMIN, prefix(9) + b"k", prefix(ADMIN) + prefix(9) + b"k", ADMIN),
    "a_bare_mark_from_the_administrator_is_escaped_too": (
        ADMIN, MARK, prefix(ADMIN) + MARK, ADMIN),
}


@pytest.mark.parametrize("case", sorted(KEYS))
def test_keys_are_scoped_by_the_connections_tenant(case):
    tenant, sent, internal, owner = KEYS[case]
    scope = Scope(tenant)
    assert scope.inner(sent) == internal and owner_of(internal) == owner
    assert scope.owns(internal) and scope.outer(internal) == sent == visible(internal)


def test_a_parent_is_a_key_of_its_childs_tenant():
    assert parent_key(prefix(7) + b"child", b"parent") == prefix(7) + b"parent"
    assert parent_key(b"child", b"parent") == b"parent"
    assert parent_key(b"child", prefix(7) + b"p") == prefix(ADMIN) + prefix(7) + b"p"


def test_the_tenant_table_in_log_order():
    state = ClusterState()
    assert state.apply(AddTenant("alice", b"h" * 32, 8 << 30, 0)) == Applied(1)
    assert state.apply(AddTenant("alice", b"x" * 32, 0, 0)) == \
        Refused("tenant 'alice' exists already")
    assert state.apply(AddTenant("bob", b"b" * 32, 0, 0)) == Applied(2)
    assert state.apply(SetTenant("alice", disk_quota_bytes=1 << 40)) == Applied(3)
    alice = state.tenants.tenants["alice"]
    assert (alice.id, alice.memory_quota_bytes, alice.disk_quota_bytes) == (1, 8 << 30, 1 << 40)
    assert state.apply(RevokeTenant("alice")) == Applied(4)
    assert state.tenants.tenants["alice"].state == "revoked"
    assert state.apply(SetTenant("alice", token_sha256=b"n" * 32)) == Applied(5)
    assert state.tenants.tenants["alice"].state == "active"
    assert state.apply(RemoveTenant("alice")) == Applied(6)
    assert state.apply(RemoveTenant("alice")) == Refused("no tenant 'alice'")
    assert state.apply(AddTenant("alice", b"h" * 32, 0, 0)) == Applied(7)
    assert state.tenants.tenants["alice"].id == 3           # ids are never reused
    assert state.epoch == 0                                  # tenants move no placement


def test_tenant_commands_and_a_snapshot_before_tenants_survive_the_journal():
    commands = [AddTenant("a", b"h" * 32, 1, 2), SetTenant("a", 3, None, None),
                RevokeTenant("a"), RemoveTenant("a")]
    assert [pickle.loads(pickle.dumps(c)) for c in commands] == commands
    old = ClusterState()
    del old.__dict__["tenants"]                  # a snapshot of a release before tenants
    restored = pickle.loads(pickle.dumps(old))
    assert restored.tenants.tenants == {} and restored.tenants.next_id == 1

"""AclAuthorizer decisions against Kafka's AclAuthorizer rules, driven directly over a real embedded store.

The wire behaviour is tested with real clients in test_acls.py / test_acls_users.py / test_zk_acls.py; this file
pins the decision table (wildcards, prefixes, DENY over ALLOW, implied operations, hosts, super users,
allow.everyone.if.no.acl.found, authorizeByResourceType) where a client test would need dozens of brokers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kbroker.broker.security.acls import (
    AccessControlEntry,
    AclBindingFilter,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    java_host_address,
)
from kbroker.broker.security.acls import AclOperation as Op
from kbroker.broker.security.acls_store import LocalAclStore
from kbroker.broker.security.authorizer import AclAuthorizer

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def authorizer(tmp_path: Path, super_users: frozenset[str] = frozenset(), everyone: bool = False) -> AclAuthorizer:
    a = AclAuthorizer(LocalAclStore(str(tmp_path)), super_users, everyone)
    a.start()
    return a


def add(a: AclAuthorizer, rtype: ResourceType, name: str, ptype: PatternType, principal: str, op: Op,
        perm: AclPermissionType = ALLOW, host: str = "*") -> None:
    assert a.create_acls([(ResourcePattern(rtype, name, ptype), AccessControlEntry(principal, host, op, perm))]) == {
        ResourcePattern(rtype, name, ptype): None}


def test_literal_wildcard_and_prefixed_patterns(tmp_path: Path) -> None:
    a = authorizer(tmp_path)
    add(a, T, "orders", LIT, ALICE, Op.READ)
    add(a, T, "*", LIT, BOB, Op.READ)
    add(a, T, "pay", PRE, "User:carol", Op.WRITE)
    assert a.authorize(ALICE, HOST, Op.READ, T, "orders")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "orders2")  # literal is exact
    assert a.authorize(BOB, HOST, Op.READ, T, "anything")
    assert a.authorize("User:carol", HOST, Op.WRITE, T, "payments")
    assert a.authorize("User:carol", HOST, Op.WRITE, T, "pay")
    assert not a.authorize("User:carol", HOST, Op.WRITE, T, "pa")
    assert not a.authorize("User:carol", HOST, Op.WRITE, G, "payments")  # another resource type


def test_deny_wins_and_implies_nothing(tmp_path: Path) -> None:
    a = authorizer(tmp_path)
    add(a, T, "*", LIT, "User:*", Op.ALL)
    add(a, T, "secret", PRE, ALICE, Op.WRITE, DENY)
    assert a.authorize(ALICE, HOST, Op.READ, T, "secret-x")
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "secret-x")
    assert a.authorize(BOB, HOST, Op.WRITE, T, "secret-x")
    # A DENY of Write does not deny the Describe that an ALLOW of Write would have implied.
    assert a.authorize(ALICE, HOST, Op.DESCRIBE, T, "secret-x")
    add(a, T, "secret-x", LIT, ALICE, Op.ALL, DENY)
    assert not a.authorize(ALICE, HOST, Op.DESCRIBE, T, "secret-x")


@pytest.mark.parametrize(("granted", "asked", "allowed"), [
    (Op.READ, Op.DESCRIBE, True), (Op.WRITE, Op.DESCRIBE, True), (Op.DELETE, Op.DESCRIBE, True),
    (Op.ALTER, Op.DESCRIBE, True), (Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS, True), (Op.ALL, Op.CREATE, True),
    (Op.CREATE, Op.DESCRIBE, False), (Op.DESCRIBE, Op.READ, False), (Op.WRITE, Op.READ, False),
    (Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, False), (Op.WRITE, Op.IDEMPOTENT_WRITE, False),
])
def test_implied_operations(tmp_path: Path, granted: Op, asked: Op, allowed: bool) -> None:
    a = authorizer(tmp_path)
    add(a, T, "t", LIT, ALICE, granted)
    assert a.authorize(ALICE, HOST, asked, T, "t") is allowed


def test_hosts_principals_super_users_and_no_acl(tmp_path: Path) -> None:
    a = authorizer(tmp_path, super_users=frozenset({"User:root"}))
    add(a, G, "g", LIT, ALICE, Op.READ, host=HOST)
    assert a.authorize(ALICE, HOST, Op.READ, G, "g")
    assert not a.authorize(ALICE, "10.0.0.2", Op.READ, G, "g")
    assert not a.authorize("Group:alice", HOST, Op.READ, G, "g")  # the principal type matters
    assert a.authorize("User:root", "1.2.3.4", Op.DELETE, G, "g")
    assert not a.authorize(ALICE, HOST, Op.READ, G, "no-acls-here")
    lenient = authorizer(tmp_path / "lenient", everyone=True)
    add(lenient, G, "g", LIT, BOB, Op.READ)
    assert lenient.authorize(ALICE, HOST, Op.READ, G, "no-acls-here")
    assert not lenient.authorize(ALICE, HOST, Op.READ, G, "g")  # ACLs exist: they decide


def test_authorized_operations_bit_field(tmp_path: Path) -> None:
    a = authorizer(tmp_path)
    add(a, T, "t", LIT, ALICE, Op.WRITE)
    add(a, T, "t", LIT, ALICE, Op.ALTER_CONFIGS)
    bits = a.authorized_operations(ALICE, HOST, T, "t")
    assert bits == sum(1 << op for op in (Op.WRITE, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS))
    assert a.authorized_names(ALICE, HOST, Op.DESCRIBE, T, ["t", "u"]) == {"t"}


def test_authorize_by_resource_type(tmp_path: Path) -> None:
    """Kafka's authorizeByResourceType cases: may the principal Write to some topic at all?"""
    a = authorizer(tmp_path)
    assert not a.authorize_by_resource_type(ALICE, HOST, Op.WRITE, T)
    add(a, T, "foo", LIT, ALICE, Op.WRITE)
    assert a.authorize_by_resource_type(ALICE, HOST, Op.WRITE, T)
    add(a, T, "fo", PRE, ALICE, Op.WRITE, DENY)  # a dominant prefixed DENY covers the literal ALLOW
    assert not a.authorize_by_resource_type(ALICE, HOST, Op.WRITE, T)
    add(a, T, "bar", PRE, ALICE, Op.WRITE)
    assert a.authorize_by_resource_type(ALICE, HOST, Op.WRITE, T)
    add(a, T, "*", LIT, ALICE, Op.WRITE, DENY)
    assert not a.authorize_by_resource_type(ALICE, HOST, Op.WRITE, T)
    assert not a.authorize_by_resource_type(BOB, HOST, Op.WRITE, T)


def test_changes_take_effect_and_survive_a_restart(tmp_path: Path) -> None:
    a = authorizer(tmp_path)
    assert not a.authorize(ALICE, HOST, Op.READ, T, "t")  # remembered as denied...
    add(a, T, "t", LIT, ALICE, Op.READ)
    assert a.authorize(ALICE, HOST, Op.READ, T, "t")  # ...until the ACLs change
    again = authorizer(tmp_path)
    assert again.authorize(ALICE, HOST, Op.READ, T, "t")
    flt = AclBindingFilter(ResourceType.ANY, None, PatternType.ANY, ALICE, None, Op.ANY, AclPermissionType.ANY)
    [[(pattern, entry, error)]] = again.delete_acls([flt])
    assert (pattern.name, entry.operation, error) == ("t", Op.READ, None)
    assert not again.authorize(ALICE, HOST, Op.READ, T, "t")
    assert not authorizer(tmp_path).acls(flt)


def test_filters() -> None:
    lit, pre, star = (ResourcePattern(T, "orders", LIT), ResourcePattern(T, "ord", PRE),
                      ResourcePattern(T, "*", LIT))

    def f(name: str | None, ptype: PatternType, rtype: ResourceType = T) -> AclBindingFilter:
        return AclBindingFilter(rtype, name, ptype, None, None, Op.ANY, AclPermissionType.ANY)

    assert [f("orders", PatternType.MATCH).matches_pattern(p) for p in (lit, pre, star)] == [True, True, True]
    assert [f("orders", PatternType.ANY).matches_pattern(p) for p in (lit, pre, star)] == [True, False, False]
    assert [f("ord", PatternType.PREFIXED).matches_pattern(p) for p in (lit, pre, star)] == [False, True, False]
    assert [f(None, PatternType.LITERAL).matches_pattern(p) for p in (lit, pre, star)] == [True, False, True]
    assert not f(None, PatternType.ANY, G).matches_pattern(lit)
    assert f(None, PatternType.ANY, ResourceType.ANY).matches_pattern(lit)


def test_java_host_address() -> None:
    assert java_host_address("127.0.0.1") == "127.0.0.1"
    assert java_host_address("::1") == "0:0:0:0:0:0:0:1"
    assert java_host_address("2001:db8::ab") == "2001:db8:0:0:0:0:0:ab"
    assert java_host_address("::ffff:10.1.2.3") == "10.1.2.3"

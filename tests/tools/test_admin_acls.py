"""kbroker-admin acls (kafka-acls.sh's flags and output) against a real kbroker with the ACL authorizer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.broker_process import BrokerProcess
from tests.tools.test_admin_cli import admin

AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"


@pytest.fixture(scope="module")
def authz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("admin-acls"), {
        "authorizer.class.name": AUTHORIZER, "allow.everyone.if.no.acl.found": "true"})
    b.start()
    yield b
    b.stop()


def acls(b: BrokerProcess, *args: str, rc: int = 0) -> str:
    r = admin("acls", "--bootstrap-server", b.bootstrap, *args, rc=rc)
    return r.stdout if rc == 0 else r.stderr


def entry(principal: str, op: str, perm: str = "ALLOW", host: str = "*") -> str:
    return f" \t(principal={principal}, host={host}, operation={op}, permissionType={perm}) "


def test_add_list_remove(authz: BrokerProcess) -> None:
    out = acls(authz, "--add", "--allow-principal", "User:alice", "--consumer", "--topic", "orders",
               "--group", "billing")
    assert out.splitlines()[:4] == [
        "Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)`: ",
        entry("User:alice", "DESCRIBE"), entry("User:alice", "READ"), ""]
    assert ("Current ACLs for resource `ResourcePattern(resourceType=GROUP, name=billing, patternType=LITERAL)`: \n"
            + entry("User:alice", "READ") + "\n") in out
    acls(authz, "--add", "--deny-principal", "User:mallory", "--deny-host", "10.0.0.9", "--operation", "All",
         "--topic", "pay-", "--resource-pattern-type", "prefixed")
    listed = acls(authz, "--list")
    assert "ResourcePattern(resourceType=TOPIC, name=pay-, patternType=PREFIXED)" in listed
    assert entry("User:mallory", "ALL", "DENY", "10.0.0.9") in listed.splitlines()
    # MATCH: every pattern that applies to one topic name.
    match = acls(authz, "--list", "--topic", "pay-eu", "--resource-pattern-type", "match")
    assert "name=pay-, patternType=PREFIXED" in match and "name=orders" not in match
    assert "User:alice" in acls(authz, "--list", "--principal", "User:alice")
    removed = acls(authz, "--remove", "--force", "--topic", "orders")
    assert removed.splitlines()[1:3] == [entry("User:alice", "DESCRIBE"), entry("User:alice", "READ")]
    assert "name=orders" not in acls(authz, "--list")


def test_refusals_are_reported(authz: BrokerProcess) -> None:
    err = acls(authz, "--add", "--allow-principal", "User:alice", "--operation", "Write", "--group", "g", rc=1)
    assert err == "Error: ResourceType Group only supports operations Read,Describe,Delete,All\n"
    err = acls(authz, "--add", "--allow-principal", "alice", "--operation", "Read", "--topic", "t", rc=1)
    assert "expected TYPE:NAME" in err
    # Once the cluster has an ACL, ANONYMOUS (this tool, on PLAINTEXT) may no longer manage ACLs: the error is
    # said, not shown as an empty list (librdkafka drops DescribeAcls' error code; the tool asks again itself).
    r = admin("acls", "--bootstrap-server", authz.bootstrap, "--add", "--allow-principal", "User:bob", "--producer",
              "--idempotent", "--topic", "bob-", "--resource-pattern-type", "prefixed", rc=1)
    assert entry("User:bob", "IDEMPOTENT_WRITE") in r.stdout.splitlines()  # added, but no longer listable
    assert r.stderr.startswith("Error: listing ACLs: CLUSTER_AUTHORIZATION_FAILED")
    err = acls(authz, "--list", rc=1)
    assert err.startswith("Error: listing ACLs: CLUSTER_AUTHORIZATION_FAILED")
    err = acls(authz, "--remove", "--force", "--cluster", rc=1)
    assert "CLUSTER_AUTHORIZATION_FAILED" in err

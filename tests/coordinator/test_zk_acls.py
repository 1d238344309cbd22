"""ACLs in ZooKeeper (Kafka's /kafka-acl layout and change notifications) shared by two kbroker processes.

A change made through one broker is enforced by the other within a second; ACLs written straight into
ZooKeeper the way Kafka's tools write them are picked up too; a broker started later loads what is there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kazoo.client import KazooClient

from tests.broker_process import BrokerProcess
from tests.clients import RawClient
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
ANON = "User:ANONYMOUS"


def overrides(zk: ZooKeeperServer, broker_id: int) -> dict[str, str]:
    # allow.everyone.if.no.acl.found: no ACL on the cluster, so the brokers (ANONYMOUS over PLAINTEXT, like the
    # clients) keep their ClusterAction for controller requests and transaction markers.
    return {"zookeeper.connect": zk.connect, "broker.id": str(broker_id), "zookeeper.session.timeout.ms": "4000",
            "zookeeper.connection.timeout.ms": "5000", "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "true"}


@pytest.fixture(scope="module")
def brokers(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    base = tmp_path_factory.mktemp("zk-acls")
    b1 = BrokerProcess(base / "b1", overrides(zookeeper, 1)).start()
    b2 = BrokerProcess(base / "b2", overrides(zookeeper, 2)).start()
    yield b1, b2
    for b in (b1, b2):
        try:
            b.stop()
        except RuntimeError:
            b.kill()


def topic_error(b: BrokerProcess, topic: str) -> int:
    """The error code Metadata on this broker answers for the topic (0: visible)."""
    from kbroker.protocol.messages import MetadataRequest

    with RawClient(b.bootstrap) as raw:
        resp = raw.request(3, 9, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                                 allow_auto_topic_creation=False))
    return resp.topics[0].error_code  # type: ignore[no-any-return]


def seconds_until(cond, timeout: float = 10.0) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)
    return time.monotonic() - t0


def test_change_on_one_broker_is_enforced_by_the_other_within_a_second(
        brokers: tuple[BrokerProcess, BrokerProcess], zk_client: KazooClient) -> None:
    b1, b2 = brokers
    a1, a2 = AdminClient({"bootstrap.servers": b1.bootstrap}), AdminClient({"bootstrap.servers": b2.bootstrap})
    a1.create_topics([NewTopic("zk-acl-topic", 2, 1)])["zk-acl-topic"].result(20)
    seconds_until(lambda: topic_error(b2, "zk-acl-topic") == 0)
    # Only bob may read it: ANONYMOUS may not even describe it any more, on either broker. (Raw requests, so
    # each goes to the broker named: the admin clients pick any broker for ACL requests.)
    from kbroker.protocol.messages import CreateAclsRequest, DeleteAclsRequest

    bob = CreateAclsRequest.AclCreation(resource_type=2, resource_name="zk-acl-", resource_pattern_type=4,
                                        principal="User:bob", host="*", operation=3, permission_type=3)
    slash = CreateAclsRequest.AclCreation(resource_type=3, resource_name="a/b", resource_pattern_type=3,
                                          principal="User:bob", host="*", operation=3, permission_type=3)
    with RawClient(b1.bootstrap) as raw:
        results = raw.request(30, 3, CreateAclsRequest(creations=[bob, slash])).results
    assert [r.error_code for r in results] == [0, -1] and "'/'" in (results[1].error_message or "")
    assert not zk_client.exists("/kafka-acl/Group/a")
    assert topic_error(b1, "zk-acl-topic") == 29
    assert seconds_until(lambda: topic_error(b2, "zk-acl-topic") == 29) < 1.0
    expected = AclBinding(ResourceType.TOPIC, "zk-acl-", ResourcePatternType.PREFIXED, "User:bob", "*",
                          AclOperation.READ, AclPermissionType.ALLOW)
    assert [str(x) for x in a2.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY)).result(10)] == [str(expected)]
    # The znodes are Kafka's.
    data, _ = zk_client.get("/kafka-acl-extended/prefixed/Topic/zk-acl-")
    assert json.loads(data) == {"version": 1, "acls": [
        {"principal": "User:bob", "permissionType": "Allow", "operation": "Read", "host": "*"}]}
    notes = sorted(zk_client.get_children("/kafka-acl-extended-changes"))
    assert notes and all(n.startswith("acl_changes_") for n in notes)
    assert json.loads(zk_client.get(f"/kafka-acl-extended-changes/{notes[-1]}")[0]) == {
        "version": 1, "resourceType": "TOPIC", "name": "zk-acl-", "patternType": "PREFIXED"}
    # Deleted through the other broker: visible again on the first within a second.
    flt = DeleteAclsRequest.DeleteAclsFilter(resource_type_filter=2, resource_name_filter="zk-acl-",
                                             pattern_type_filter=4, principal_filter=None, host_filter=None,
                                             operation=1, permission_type=1)
    with RawClient(b2.bootstrap) as raw:
        [result] = raw.request(31, 3, DeleteAclsRequest(filters=[flt])).filter_results
    assert result.error_code == 0
    assert [(m.resource_name, m.principal, m.operation) for m in result.matching_acls] == [("zk-acl-", "User:bob", 3)]
    assert topic_error(b2, "zk-acl-topic") == 0
    assert seconds_until(lambda: topic_error(b1, "zk-acl-topic") == 0) < 1.0
    assert not zk_client.exists("/kafka-acl-extended/prefixed/Topic/zk-acl-")


def test_acls_written_like_kafka_tools_are_picked_up(brokers: tuple[BrokerProcess, BrokerProcess],
                                                     zk_client: KazooClient, tmp_path: Path,
                                                     zookeeper: ZooKeeperServer) -> None:
    b1, b2 = brokers
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("zk-tool", 1, 1)])["zk-tool"].result(20)
    seconds_until(lambda: topic_error(b1, "zk-tool") == 0 and topic_error(b2, "zk-tool") == 0)
    # What kafka-acls --authorizer-properties zookeeper.connect=... (AclAuthorizer in the tool) writes:
    # the literal resource's znode, then a legacy change notification "<RESOURCE_TYPE>:<name>".
    doc = {"version": 1, "acls": [{"principal": "User:carol", "permissionType": "Allow", "operation": "Describe",
                                   "host": "*"}]}
    zk_client.create("/kafka-acl/Topic/zk-tool", json.dumps(doc).encode(), makepath=True)
    zk_client.create("/kafka-acl-changes/acl_changes_", b"Topic:zk-tool", sequence=True, makepath=True)
    seconds_until(lambda: topic_error(b1, "zk-tool") == 29 and topic_error(b2, "zk-tool") == 29, timeout=5)
    # A broker started now loads every ACL at startup.
    b3 = BrokerProcess(tmp_path / "b3", overrides(zookeeper, 3)).start()
    try:
        assert topic_error(b3, "zk-tool") == 29
        assert "ACL authorizer started: 1 ACLs on 1 resource patterns" in b3.read_log()
    finally:
        b3.stop()
    zk_client.delete("/kafka-acl/Topic/zk-tool")
    zk_client.create("/kafka-acl-changes/acl_changes_", b"TOPIC:zk-tool", sequence=True)
    seconds_until(lambda: topic_error(b1, "zk-tool") == 0 and topic_error(b2, "zk-tool") == 0, timeout=5)
    assert ANON not in zk_client.get_children("/kafka-acl/Topic")


def test_unreadable_acl_znode_is_never_read_as_no_acls(brokers: tuple[BrokerProcess, BrokerProcess],
                                                       zk_client: KazooClient, tmp_path: Path,
                                                       zookeeper: ZooKeeperServer) -> None:
    b1, _ = brokers
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("zk-garbled", 1, 1)])["zk-garbled"].result(20)
    seconds_until(lambda: topic_error(b1, "zk-garbled") == 0)
    deny = {"version": 1, "acls": [{"principal": "User:ANONYMOUS", "permissionType": "Deny",
                                    "operation": "All", "host": "*"}]}
    zk_client.create("/kafka-acl/Topic/zk-garbled", json.dumps(deny).encode(), makepath=True)
    zk_client.create("/kafka-acl-changes/acl_changes_", b"TOPIC:zk-garbled", sequence=True)
    seconds_until(lambda: topic_error(b1, "zk-garbled") == 29, timeout=5)
    # Garbled in place: the brokers keep the DENY they know and say why.
    zk_client.set("/kafka-acl/Topic/zk-garbled", b'{"version": 1, "acls": [{"principal"')
    zk_client.create("/kafka-acl-changes/acl_changes_", b"TOPIC:zk-garbled", sequence=True)
    seconds_until(lambda: "Keeping the ACLs known for Topic:LITERAL:zk-garbled" in b1.read_log(), timeout=5)
    assert topic_error(b1, "zk-garbled") == 29
    # A broker starting now refuses to start rather than serve without that DENY.
    b4 = BrokerProcess(tmp_path / "b4", overrides(zookeeper, 4))
    with pytest.raises(RuntimeError) as info:
        b4.start(timeout=30)
    assert "cannot start the ACL authorizer: unreadable ACLs at /kafka-acl/Topic/zk-garbled" in str(info.value)
    zk_client.delete("/kafka-acl/Topic/zk-garbled")
    zk_client.create("/kafka-acl-changes/acl_changes_", b"TOPIC:zk-garbled", sequence=True)
    seconds_until(lambda: topic_error(b1, "zk-garbled") == 0, timeout=5)

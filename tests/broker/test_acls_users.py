"""The ACL matrix per authenticated user (SASL PLAIN over SASL_PLAINTEXT), with confluent-kafka, kafka-python
and kcat: what one user may do, another may not; DENY beats ALLOW; the super user does everything.

Users (PLAIN): admin (super.users), alice (Read on the prefixed topic pattern `pay-` and on group
`pay-readers`), bob (Write on `pay-orders`), eve (All on `pay-` but Write denied on `pay-orders`).
allow.everyone.if.no.acl.found is off: ANONYMOUS on the PLAINTEXT listener may do nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
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

from tests.broker.test_acls import consume_error, group_consume, produce_error
from tests.broker_process import BrokerProcess, free_port
from tests.clients import Msg, ck_produce, kcat
from tests.conftest import have_kcat
from tests.security_setup import plain_jaas

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret", "eve": "eve-secret"}


class UsersBroker(BrokerProcess):
    def __init__(self, data_dir: Any) -> None:
        self.sasl_port = free_port()
        port = free_port()
        super().__init__(data_dir, {
            "listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_jaas(USERS),
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:admin",
        }, port=port)

    @property
    def sasl(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"


def as_user(user: str) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": USERS[user]}


def admin_as(b: UsersBroker, user: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.sasl, "socket.timeout.ms": 10000, **as_user(user)})


def acl(rtype: ResourceType, name: str, user: str, op: AclOperation,
        pattern: ResourcePatternType = ResourcePatternType.LITERAL,
        permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(rtype, name, pattern, f"User:{user}", "*", op, permission)


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UsersBroker]:
    b = UsersBroker(tmp_path_factory.mktemp("acl-users"))
    b.start()
    root = admin_as(b, "admin")
    for t in ("pay-orders", "pay-audit", "hr-salaries"):
        root.create_topics([NewTopic(t, 1, 1)])[t].result(15)
        ck_produce(b.sasl, t, [Msg(b"k", f"{t}-{i}".encode()) for i in range(3)], **as_user("admin"))
    prefixed = ResourcePatternType.PREFIXED
    for f in root.create_acls([
        acl(ResourceType.TOPIC, "pay-", "alice", AclOperation.READ, prefixed),
        acl(ResourceType.GROUP, "pay-readers", "alice", AclOperation.READ),
        acl(ResourceType.TOPIC, "pay-orders", "bob", AclOperation.WRITE),
        acl(ResourceType.TOPIC, "pay-", "eve", AclOperation.ALL, prefixed),
        acl(ResourceType.TOPIC, "pay-orders", "eve", AclOperation.WRITE, permission=AclPermissionType.DENY),
    ]).values():
        f.result(10)
    yield b
    b.stop()


def conf(user: str) -> dict[str, Any]:
    # ck_produce turns underscores into dots: pass the SASL settings under their librdkafka names.
    return {k.replace(".", "_"): v for k, v in as_user(user).items()}


def test_reader_consumes_but_cannot_produce(users: UsersBroker) -> None:
    alice = conf("alice")
    assert sorted(admin_as(users, "alice").list_topics(timeout=10).topics) == ["pay-audit", "pay-orders"]
    got = group_consume_as(users, "alice", "pay-orders", "pay-readers", 3)
    assert got == [f"pay-orders-{i}".encode() for i in range(3)]
    assert produce_error(users.sasl, "pay-orders", **alice) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consume_error_as(users, "alice", "pay-audit", "some-other-group") == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert consume_error_as(users, "alice", "hr-salaries", "pay-readers") in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.UNKNOWN_TOPIC_OR_PART)
    if have_kcat():
        sasl = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=PLAIN",
                "-X", "sasl.username=alice", "-X", "sasl.password=alice-secret"]
        out = kcat(users.sasl, *sasl, "-C", "-t", "pay-audit", "-o", "beginning", "-e", "-q")
        assert out.stdout.split() == [f"pay-audit-{i}".encode() for i in range(3)]
        r = kcat(users.sasl, *sasl, "-P", "-t", "pay-audit", input=b"nope\n", check=False)
        assert b"authorization failed" in r.stderr.lower() or r.returncode != 0


def test_writer_produces_but_cannot_delete(users: UsersBroker) -> None:
    ck_produce(users.sasl, "pay-orders", [Msg(b"k", b"from-bob")], **conf("bob"))
    bob = admin_as(users, "bob")
    with pytest.raises(KafkaException) as info:
        bob.delete_topics(["pay-orders"])["pay-orders"].result(10)
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consume_error_as(users, "bob", "pay-orders", "pay-readers") in (
        KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert produce_error(users.sasl, "pay-audit", **conf("bob")) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # kafka-python as bob: no Describe on the cluster, so no ACL listing either.
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KpType
    from kafka.errors import ClusterAuthorizationFailedError

    kp = KafkaAdminClient(bootstrap_servers=users.sasl, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                          sasl_plain_username="bob", sasl_plain_password=USERS["bob"], request_timeout_ms=10000)
    try:
        assert kp.list_topics() == ["pay-orders"]
        with pytest.raises(ClusterAuthorizationFailedError):
            kp.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                       ResourcePatternFilter(KpType.ANY, None, ACLResourcePatternType.ANY)))
    finally:
        kp.close()


def test_deny_beats_allow(users: UsersBroker) -> None:
    eve = conf("eve")
    assert produce_error(users.sasl, "pay-orders", **eve) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    ck_produce(users.sasl, "pay-audit", [Msg(b"k", b"from-eve")], **eve)


def test_super_user_does_everything_and_anonymous_nothing(users: UsersBroker) -> None:
    root = admin_as(users, "admin")
    assert len(root.describe_acls(AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                                   AclOperation.ANY, AclPermissionType.ANY)).result(10)) == 5
    root.create_topics([NewTopic("scratch", 1, 1)])["scratch"].result(10)
    root.delete_topics(["scratch"])["scratch"].result(10)
    assert group_consume_as(users, "admin", "hr-salaries", "any-group", 3) == [f"hr-salaries-{i}".encode()
                                                                              for i in range(3)]
    anonymous = AdminClient({"bootstrap.servers": users.bootstrap})
    assert anonymous.list_topics(timeout=10).topics == {}
    assert produce_error(users.bootstrap, "pay-orders") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    log = users.read_log()
    assert "User:alice may not Write" in log and "User:bob may not Delete" in log


def group_consume_as(b: UsersBroker, user: str, topic: str, group: str, count: int) -> list[bytes]:
    return group_consume(b.sasl, topic, group, count, **as_user(user))


def consume_error_as(b: UsersBroker, user: str, topic: str, group: str) -> int:
    return consume_error(b.sasl, topic, group, **as_user(user))

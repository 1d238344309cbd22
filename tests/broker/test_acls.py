"""ACL authorization (authorizer.class.name) with real clients: confluent-kafka, kafka-python, kcat.

Until SASL is there every client is User:ANONYMOUS, so the matrix is driven by changing what ANONYMOUS may do
(ACLs for it, for User:* and for other users, host-restricted ACLs) and by super.users. The strict broker
starts once with ANONYMOUS as a super user to write its ACLs, then restarts without: that also shows the
embedded store keeps ACLs across restarts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection
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

from tests.broker_process import BrokerProcess
from tests.clients import Msg, ProduceFailed, RawClient, ck_consume, ck_produce, kcat, wait_until
from tests.conftest import have_kcat

AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
# librdkafka calls Kafka's CLUSTER resource type BROKER (code 4); its one resource is kafka-cluster.
ANON = "User:ANONYMOUS"
ANY_FILTER = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)


def allow(rtype: ResourceType, name: str, op: AclOperation, principal: str = ANON, host: str = "*",
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


def deny(rtype: ResourceType, name: str, op: AclOperation, principal: str = ANON, host: str = "*",
         pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return allow(rtype, name, op, principal, host, pattern, AclPermissionType.DENY)


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def create_acls(a: AdminClient, acls: list[AclBinding]) -> None:
    for f in a.create_acls(acls).values():
        f.result(10)


def delete_all_acls(a: AdminClient) -> None:
    for f in a.delete_acls([ANY_FILTER]).values():
        f.result(10)


def acls_cleared(bootstrap: str) -> Iterator[AdminClient]:
    """A fixture's body: an admin client on a broker without ACLs, and none left behind."""
    a = admin(bootstrap)
    delete_all_acls(a)
    yield a
    delete_all_acls(a)


def create_topic(a: AdminClient, name: str, partitions: int = 1) -> None:
    a.create_topics([NewTopic(name, partitions, 1)])[name].result(10)


def error_code(exc: BaseException) -> int:
    assert isinstance(exc, KafkaException), exc
    return exc.args[0].code()  # type: ignore[no-any-return]


def produce_error(bootstrap: str, topic: str, **conf: object) -> int:
    """The error a librdkafka producer reports: in the delivery report, or raised by produce() itself when a
    Metadata answer already told it the topic is not authorized (which comes first is a race in the client)."""
    with pytest.raises((ProduceFailed, KafkaException)) as info:
        ck_produce(bootstrap, topic, [Msg(b"k", b"v")], timeout=10, **conf)
    if isinstance(info.value, ProduceFailed):
        return info.value.errors[0].code()  # type: ignore[no-any-return]
    return error_code(info.value)


def consume_error(bootstrap: str, topic: str, group: str, **conf: object) -> int:
    """The first error a subscribed confluent consumer reports (authorization errors are fatal for it)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000, **conf})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is not None and m.error().code() != KafkaError._PARTITION_EOF:
                return m.error().code()  # type: ignore[no-any-return]
            assert m is None or m.error() is not None, f"consumed {m.value()!r} without authorization"
        raise AssertionError("the consumer reported no error")
    finally:
        c.close()


def init_producer_id_error(bootstrap: str) -> int:
    """What an idempotent producer's InitProducerId (no transactional id) is answered."""
    from kbroker.protocol.messages import InitProducerIdRequest

    with RawClient(bootstrap) as raw:
        resp = raw.request(22, 4, InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000,
                                                        producer_id=-1, producer_epoch=-1))
    return resp.error_code  # type: ignore[no-any-return]


def group_consume(bootstrap: str, topic: str, group: str, count: int, **conf: object) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000, "enable.auto.commit": False, **conf})
    out: list[bytes] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            out.append(m.value())
        c.commit(asynchronous=False)
    finally:
        c.close()
    return out


# ---------------------------------------------------------------- a lenient broker (allow.everyone.if.no.acl.found)


@pytest.fixture(scope="module")
def lenient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("acl-lenient"), {
        "authorizer.class.name": AUTHORIZER, "allow.everyone.if.no.acl.found": "true",
    })
    b.start()
    yield b
    b.stop()


@pytest.fixture
def clean(lenient: BrokerProcess) -> Iterator[AdminClient]:
    yield from acls_cleared(lenient.bootstrap)


def test_create_describe_delete_acls_confluent(lenient: BrokerProcess, clean: AdminClient) -> None:
    a = clean
    bindings = [
        allow(ResourceType.TOPIC, "orders", AclOperation.READ, "User:alice"),
        allow(ResourceType.TOPIC, "orders-", AclOperation.WRITE, "User:bob", pattern=ResourcePatternType.PREFIXED),
        deny(ResourceType.TOPIC, "orders", AclOperation.DELETE, "User:*", host="10.0.0.1"),
        allow(ResourceType.GROUP, "billing", AclOperation.READ, "User:alice"),
        allow(ResourceType.TRANSACTIONAL_ID, "tx-", AclOperation.WRITE, "User:bob",
              pattern=ResourcePatternType.PREFIXED),
        allow(ResourceType.TOPIC, "*", AclOperation.DESCRIBE, "User:carol"),
    ]
    create_acls(a, bindings)
    create_acls(a, bindings[:1])  # creating an existing ACL again is not an error
    assert sorted(map(str, a.describe_acls(ANY_FILTER).result(10))) == sorted(map(str, bindings))

    def described(**kw: object) -> set[str]:
        base = dict(restype=ResourceType.ANY, name=None, resource_pattern_type=ResourcePatternType.ANY,
                    principal=None, host=None, operation=AclOperation.ANY, permission_type=AclPermissionType.ANY)
        base.update(kw)
        return {str(b) for b in a.describe_acls(AclBindingFilter(*base.values())).result(10)}  # type: ignore[arg-type]

    # LITERAL / PREFIXED filters match exactly; MATCH finds every pattern that applies to a name.
    assert described(restype=ResourceType.TOPIC, name="orders",
                     resource_pattern_type=ResourcePatternType.LITERAL) == {str(bindings[0]), str(bindings[2])}
    assert described(resource_pattern_type=ResourcePatternType.PREFIXED) == {str(bindings[1]), str(bindings[4])}
    assert described(restype=ResourceType.TOPIC, name="orders-eu", resource_pattern_type=ResourcePatternType.MATCH
                     ) == {str(bindings[1]), str(bindings[5])}
    assert described(principal="User:alice") == {str(bindings[0]), str(bindings[3])}
    assert described(host="10.0.0.1", permission_type=AclPermissionType.DENY) == {str(bindings[2])}
    assert described(restype=ResourceType.GROUP, operation=AclOperation.READ) == {str(bindings[3])}

    deleted = a.delete_acls([
        AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.ANY, None, None, AclOperation.ANY,
                         AclPermissionType.ANY),
        AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None, AclOperation.ANY,
                         AclPermissionType.ANY),
    ])
    results = [sorted(map(str, f.result(10))) for f in deleted.values()]
    assert results == [sorted(map(str, [bindings[0], bindings[2]])), sorted(map(str, [bindings[1], bindings[4]]))]
    assert sorted(map(str, a.describe_acls(ANY_FILTER).result(10))) == sorted(map(str, [bindings[3], bindings[5]]))


def test_invalid_acls_are_refused(lenient: BrokerProcess, clean: AdminClient) -> None:
    from kbroker.protocol.messages import CreateAclsRequest, DescribeAclsRequest

    C = CreateAclsRequest.AclCreation
    good = C(resource_type=2, resource_name="t", resource_pattern_type=3, principal=ANON, host="*", operation=3,
             permission_type=3)
    bad = [
        C(resource_type=4, resource_name="my-cluster", resource_pattern_type=3, principal=ANON, host="*",
          operation=7, permission_type=3),  # the cluster is only ever kafka-cluster
        C(resource_type=6, resource_name="token", resource_pattern_type=3, principal=ANON, host="*", operation=8,
          permission_type=3),  # no delegation tokens
        C(resource_type=2, resource_name="", resource_pattern_type=3, principal=ANON, host="*", operation=3,
          permission_type=3),
        C(resource_type=2, resource_name="t", resource_pattern_type=2, principal=ANON, host="*", operation=3,
          permission_type=3),  # MATCH is a filter, not a pattern
        C(resource_type=2, resource_name="t", resource_pattern_type=3, principal="ANONYMOUS", host="*",
          operation=3, permission_type=3),
        C(resource_type=2, resource_name="t", resource_pattern_type=3, principal=ANON, host="*", operation=1,
          permission_type=3),  # ANY operation
        C(resource_type=9, resource_name="t", resource_pattern_type=3, principal=ANON, host="*", operation=3,
          permission_type=3),  # unknown resource type
    ]
    with RawClient(lenient.bootstrap) as raw:
        resp = raw.request(30, 3, CreateAclsRequest(creations=[good, *bad]))
        assert [r.error_code for r in resp.results] == [0] + [42] * len(bad)
        assert "kafka-cluster" in (resp.results[1].error_message or "")
        # Version 0 knows only literal patterns.
        v0 = raw.request(30, 0, CreateAclsRequest(creations=[good]))
        assert [r.error_code for r in v0.results] == [0]
        unknown = raw.request(29, 3, DescribeAclsRequest(resource_type_filter=99, pattern_type_filter=1,
                                                         operation=1, permission_type=1))
        assert unknown.error_code == 42
    # An UNKNOWN (0) code: Kafka cannot parse the request (DescribeAclsRequest.normalizeAndValidate) and closes the
    # connection.
    with RawClient(lenient.bootstrap) as raw, pytest.raises((ConnectionError, OSError)):
        raw.request(29, 3, DescribeAclsRequest(resource_type_filter=0, pattern_type_filter=1, operation=1,
                                               permission_type=1))
    with RawClient(lenient.bootstrap) as raw:
        listed = raw.request(29, 3, DescribeAclsRequest(resource_type_filter=1, resource_name_filter=None,
                                                        pattern_type_filter=1, principal_filter=None,
                                                        host_filter=None, operation=1, permission_type=1))
    assert listed.error_code == 0
    assert [(r.resource_type, r.resource_name, r.pattern_type, [a.operation for a in r.acls])
            for r in listed.resources] == [(2, "t", 3, [3])]


def test_kafka_python_acl_apis(lenient: BrokerProcess, clean: AdminClient) -> None:
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KpType

    a = KafkaAdminClient(bootstrap_servers=lenient.bootstrap, request_timeout_ms=10000)
    try:
        acl = ACL("User:dave", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                  ResourcePattern(KpType.TOPIC, "kp-", ACLResourcePatternType.PREFIXED))
        result = a.create_acls([acl])
        assert result["failed"] == [] and len(result["succeeded"]) == 1
        flt = ACLFilter("User:dave", None, ACLOperation.ANY, ACLPermissionType.ANY,
                        ResourcePatternFilter(KpType.ANY, None, ACLResourcePatternType.ANY))
        found, err = a.describe_acls(flt)
        assert err.errno == 0
        assert [(x.principal, x.operation, x.resource_pattern.resource_name,
                 x.resource_pattern.pattern_type) for x in found] == [
            ("User:dave", ACLOperation.WRITE, "kp-", ACLResourcePatternType.PREFIXED)]
        [(_, deleted, err)] = a.delete_acls([flt])
        assert err.errno == 0 and len(deleted) == 1
        assert a.describe_acls(flt)[0] == []
    finally:
        a.close()


def test_read_on_prefixed_topic_and_group_consumes_but_cannot_produce(lenient: BrokerProcess, clean: AdminClient,
                                                                      topic_name: str) -> None:
    topic, group = f"readers-{topic_name}", f"grp-{topic_name}"
    create_topic(clean, topic)
    ck_produce(lenient.bootstrap, topic, [Msg(b"k", f"v{i}".encode()) for i in range(5)])
    create_acls(clean, [
        allow(ResourceType.TOPIC, "readers-", AclOperation.READ, pattern=ResourcePatternType.PREFIXED),
        allow(ResourceType.GROUP, group, AclOperation.READ),
        # Another user's group: ACLs exist for it, none for ANONYMOUS.
        allow(ResourceType.GROUP, f"{group}-bob", AclOperation.READ, "User:bob"),
    ])
    assert group_consume(lenient.bootstrap, topic, group, 5) == [f"v{i}".encode() for i in range(5)]
    assert produce_error(lenient.bootstrap, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consume_error(lenient.bootstrap, topic, f"{group}-bob") == KafkaError.GROUP_AUTHORIZATION_FAILED
    if have_kcat():
        r = kcat(lenient.bootstrap, "-P", "-t", topic, input=b"x\n", check=False)
        assert r.returncode != 0 or "authorization" in (r.stderr or b"").decode().lower()
        out = kcat(lenient.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q")
        assert out.stdout.split() == [f"v{i}".encode() for i in range(5)]


def test_write_produces_but_cannot_delete_or_read(lenient: BrokerProcess, clean: AdminClient, topic_name: str) -> None:
    create_topic(clean, topic_name)
    create_acls(clean, [allow(ResourceType.TOPIC, topic_name, AclOperation.WRITE)])
    ck_produce(lenient.bootstrap, topic_name, [Msg(b"k", b"v")])
    if have_kcat():
        kcat(lenient.bootstrap, "-P", "-t", topic_name, input=b"from-kcat\n")
    with pytest.raises(KafkaException) as info:
        clean.delete_topics([topic_name])[topic_name].result(10)
    assert error_code(info.value) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consume_error(lenient.bootstrap, topic_name, f"g-{topic_name}") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Write implies Describe: the topic is visible, with exactly Write and Describe as authorized operations.
    [desc] = clean.describe_topics(TopicCollection([topic_name]), include_authorized_operations=True).values()
    assert sorted(op.name for op in desc.result(10).authorized_operations) == ["DESCRIBE", "WRITE"]


def test_deny_beats_allow_and_hosts_matter(lenient: BrokerProcess, clean: AdminClient, topic_name: str) -> None:
    create_topic(clean, topic_name)
    ck_produce(lenient.bootstrap, topic_name, [Msg(b"k", b"before")])
    create_acls(clean, [
        allow(ResourceType.TOPIC, topic_name, AclOperation.ALL, "User:*"),
        deny(ResourceType.TOPIC, topic_name[:6], AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
        deny(ResourceType.TOPIC, topic_name, AclOperation.READ, host="10.1.2.3"),  # another host: no effect
    ])
    assert produce_error(lenient.bootstrap, topic_name) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert [r.value for r in ck_consume(lenient.bootstrap, topic_name, [0], 1)] == [b"before"]
    create_acls(clean, [deny(ResourceType.TOPIC, topic_name, AclOperation.READ, host="127.0.0.1")])
    assert consume_error(lenient.bootstrap, topic_name, f"g-{topic_name}") == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_metadata_hides_undescribable_topics(lenient: BrokerProcess, clean: AdminClient, topic_name: str) -> None:
    from kbroker.protocol.messages import MetadataRequest

    hidden, shown = f"{topic_name}-hidden", f"{topic_name}-shown"
    create_topic(clean, hidden)
    create_topic(clean, shown)
    create_acls(clean, [allow(ResourceType.TOPIC, hidden, AclOperation.READ, "User:bob"),
                        allow(ResourceType.TOPIC, shown, AclOperation.READ)])
    topics = clean.list_topics(timeout=10).topics
    assert shown in topics and hidden not in topics
    with RawClient(lenient.bootstrap) as raw:
        one = raw.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=hidden)],
                                                 allow_auto_topic_creation=False,
                                                 include_topic_authorized_operations=True))
        [t] = one.topics
        assert (t.name, t.error_code, t.partitions) == (hidden, 29, [])
        # Asked for by id, the name is not disclosed either.
        all_topics = raw.request(3, 12, MetadataRequest(topics=None, include_topic_authorized_operations=True))
        by_name = {t.name: t for t in all_topics.topics}
        assert hidden not in by_name
        assert by_name[shown].topic_authorized_operations == (1 << 3) | (1 << 8)  # Read, and Describe it implies
        # DescribeTopicPartitions (KIP-966) the same way.
        from kbroker.protocol.messages import DescribeTopicPartitionsRequest as DTP

        named = raw.request(75, 0, DTP(topics=[DTP.TopicRequest(name=hidden), DTP.TopicRequest(name=shown)],
                                       response_partition_limit=100))
        assert [(t.name, t.error_code, len(t.partitions)) for t in named.topics] == [(hidden, 29, 0), (shown, 0, 1)]
        listed = raw.request(75, 0, DTP(topics=[], response_partition_limit=100))
        listed_names = {t.name for t in listed.topics}
        assert shown in listed_names and hidden not in listed_names
    create_acls(clean, [allow(ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE),
                        allow(ResourceType.BROKER, "kafka-cluster", AclOperation.ALTER)])
    with RawClient(lenient.bootstrap) as raw:
        md = raw.request(3, 10, MetadataRequest(topics=[], include_cluster_authorized_operations=True))
    assert md.cluster_authorized_operations == (1 << 8) | (1 << 7)


def test_groups_report_authorized_operations(lenient: BrokerProcess, clean: AdminClient, topic_name: str) -> None:
    group = f"ops-{topic_name}"
    create_topic(clean, topic_name)
    ck_produce(lenient.bootstrap, topic_name, [Msg(b"k", b"v")])
    assert group_consume(lenient.bootstrap, topic_name, group, 1) == [b"v"]
    create_acls(clean, [allow(ResourceType.GROUP, group, AclOperation.READ),
                        deny(ResourceType.GROUP, f"{group}-secret", AclOperation.DESCRIBE)])
    [f] = clean.describe_consumer_groups([group], include_authorized_operations=True).values()
    assert sorted(op.name for op in f.result(10).authorized_operations) == ["DESCRIBE", "READ"]
    [f] = clean.describe_consumer_groups([f"{group}-secret"]).values()
    with pytest.raises(KafkaException) as info:
        f.result(10)
    assert error_code(info.value) == KafkaError.GROUP_AUTHORIZATION_FAILED
    # Offsets of a group one may not describe stay hidden.
    from confluent_kafka import ConsumerGroupTopicPartitions

    [f] = clean.list_consumer_group_offsets([ConsumerGroupTopicPartitions(f"{group}-secret")]).values()
    with pytest.raises(KafkaException) as info:
        f.result(10)
    assert error_code(info.value) == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_group_configs_need_describe_and_alter_configs_on_the_group(lenient: BrokerProcess,
                                                                    clean: AdminClient) -> None:
    """Kafka's ConfigHelper / ControllerApis: DESCRIBE_CONFIGS and ALTER_CONFIGS on the GROUP resource (resource
    type 32 in the config APIs), GROUP_AUTHORIZATION_FAILED when refused."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource  # noqa: PLC0415
    from kafka.admin import ConfigResource as KpConfigResource  # noqa: PLC0415
    from kafka.admin import ConfigResourceType, KafkaAdminClient  # noqa: PLC0415

    key = "consumer.heartbeat.interval.ms"
    # A resource with ACLs is closed to everyone else: ALL for ANONYMOUS, then the one operation denied.
    create_acls(clean, [allow(ResourceType.GROUP, "cfg-", AclOperation.ALL, pattern=ResourcePatternType.PREFIXED),
                        deny(ResourceType.GROUP, "cfg-locked", AclOperation.ALTER_CONFIGS),
                        deny(ResourceType.GROUP, "cfg-hidden", AclOperation.DESCRIBE_CONFIGS)])
    res = ConfigResource(ResourceType.GROUP, "cfg-locked",
                         incremental_configs=[ConfigEntry(key, "6000", incremental_operation=AlterConfigOpType.SET)])
    [f] = clean.incremental_alter_configs([res]).values()
    with pytest.raises(KafkaException) as info:
        f.result(10)
    assert error_code(info.value) == KafkaError.GROUP_AUTHORIZATION_FAILED
    [f] = clean.describe_configs([ConfigResource(ResourceType.GROUP, "cfg-locked")]).values()
    assert f.result(10)[key].value == "5000"
    kp = KafkaAdminClient(bootstrap_servers=lenient.bootstrap)
    try:
        # raise_on_unknown=False: kafka-python would otherwise describe the group first to check the key.
        r = kp.alter_configs([KpConfigResource(ConfigResourceType.GROUP, "cfg-hidden", {key: "6000"})],
                             incremental=True, raise_on_unknown=False)
        assert "Error" not in str(r), r
    finally:
        kp.close()
    from kbroker.protocol.messages import DescribeConfigsRequest as D  # noqa: PLC0415

    with RawClient(lenient.bootstrap) as raw:
        r = raw.request(32, 4, D(resources=[D.DescribeConfigsResource(resource_type=32, resource_name="cfg-hidden",
                                                                     configuration_keys=None)])).results[0]
    assert (r.error_code, r.configs) == (KafkaError.GROUP_AUTHORIZATION_FAILED, [])


def test_transactional_id_and_idempotent_write(lenient: BrokerProcess, clean: AdminClient, topic_name: str) -> None:
    create_topic(clean, topic_name)
    create_acls(clean, [
        allow(ResourceType.TRANSACTIONAL_ID, "tx-bob", AclOperation.WRITE, "User:bob"),
        allow(ResourceType.BROKER, "kafka-cluster", AclOperation.ALL),
    ])
    p = Producer({"bootstrap.servers": lenient.bootstrap, "transactional.id": "tx-bob"})
    with pytest.raises(KafkaException) as info:
        p.init_transactions(15)
    assert error_code(info.value) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # A transactional id without ACLs is open to everyone here (allow.everyone.if.no.acl.found).
    p = Producer({"bootstrap.servers": lenient.bootstrap, "transactional.id": f"tx-{topic_name}"})
    p.init_transactions(15)
    p.begin_transaction()
    p.produce(topic_name, b"in-txn")
    p.commit_transaction(15)
    # Idempotent producers need IdempotentWrite on the cluster or Write on some topic.
    create_acls(clean, [deny(ResourceType.BROKER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE),
                        deny(ResourceType.TOPIC, "*", AclOperation.WRITE)])
    assert init_producer_id_error(lenient.bootstrap) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    for f in clean.delete_acls([AclBindingFilter(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, None, None,
                                                 AclOperation.ANY, AclPermissionType.ANY)]).values():
        f.result(10)
    ck_produce(lenient.bootstrap, topic_name, [Msg(b"k", b"idempotent")], enable_idempotence=True)


def test_acl_apis_without_authorizer_answer_security_disabled(broker: BrokerProcess) -> None:
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KpType
    from kafka.errors import SecurityDisabledError

    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        with pytest.raises(SecurityDisabledError):
            kp.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                       ResourcePatternFilter(KpType.ANY, None, ACLResourcePatternType.ANY)))
    finally:
        kp.close()
    a = admin(broker.bootstrap)
    with pytest.raises(KafkaException) as info:
        [f] = a.create_acls([allow(ResourceType.TOPIC, "t", AclOperation.READ)]).values()
        f.result(10)
    assert error_code(info.value) == KafkaError.SECURITY_DISABLED


def test_unknown_authorizer_class_stops_startup(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path, {"authorizer.class.name": "com.example.MyAuthorizer"})
    with pytest.raises(RuntimeError) as info:
        b.start(timeout=20)
    assert "authorizer.class.name" in str(info.value)
    b = BrokerProcess(tmp_path, {"authorizer.class.name": AUTHORIZER, "super.users": "alice"})
    with pytest.raises(RuntimeError) as info:
        b.start(timeout=20)
    assert "super.users" in str(info.value)


# ---------------------------------------------------------------- a strict broker (deny when no ACL matches)


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """ACLs written while ANONYMOUS is a super user, then the broker restarts with none."""
    data = tmp_path_factory.mktemp("acl-strict")
    b = BrokerProcess(data, {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                             "super.users": f"{ANON};User:admin"})
    b.start()
    a = admin(b.bootstrap)
    for t in ("app-orders", "app-audit", "secret"):
        create_topic(a, t)
        ck_produce(b.bootstrap, t, [Msg(b"k", f"{t}-{i}".encode()) for i in range(3)])
    create_acls(a, [
        allow(ResourceType.TOPIC, "app-", AclOperation.READ, pattern=ResourcePatternType.PREFIXED),
        allow(ResourceType.GROUP, "app-group", AclOperation.READ),
        allow(ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE),
    ])
    b.stop()
    b.overrides["super.users"] = "User:admin"
    b.start()
    yield b
    b.stop()


def test_strict_read_only_principal(strict: BrokerProcess) -> None:
    a = admin(strict.bootstrap)
    assert sorted(a.list_topics(timeout=10).topics) == ["app-audit", "app-orders"]
    assert group_consume(strict.bootstrap, "app-orders", "app-group", 3) == [f"app-orders-{i}".encode()
                                                                              for i in range(3)]
    assert produce_error(strict.bootstrap, "app-orders") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consume_error(strict.bootstrap, "app-audit", "other-group") == KafkaError.GROUP_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as info:
        a.create_topics([NewTopic("app-new", 1, 1)])["app-new"].result(10)
    assert error_code(info.value) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as info:
        [f] = a.create_acls([allow(ResourceType.TOPIC, "secret", AclOperation.READ)]).values()
        f.result(10)
    assert error_code(info.value) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # Describe on the cluster is granted: the ACLs can be listed, but not changed.
    found = a.describe_acls(ANY_FILTER).result(10)
    assert len(found) == 3
    # Neither Write anywhere nor IdempotentWrite: an idempotent producer cannot get a producer id.
    assert init_producer_id_error(strict.bootstrap) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    p = Producer({"bootstrap.servers": strict.bootstrap, "transactional.id": "tx-strict"})
    with pytest.raises(KafkaException) as info:
        p.init_transactions(15)
    assert error_code(info.value) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    from kbroker.protocol.messages import FindCoordinatorRequest

    with RawClient(strict.bootstrap) as raw:
        fc = raw.request(10, 3, FindCoordinatorRequest(key="tx-strict", key_type=1))
    assert fc.error_code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    log = strict.read_log()
    assert "TOPIC_AUTHORIZATION_FAILED" in log and "User:ANONYMOUS may not Write" in log


def test_strict_store_survives_restart(strict: BrokerProcess) -> None:
    doc = json.loads((strict.data_dir / "logs" / "kbroker-acls.json").read_text())
    assert {(r["resourceType"], r["patternType"], r["name"]) for r in doc["resources"]} == {
        ("Topic", "PREFIXED", "app-"), ("Group", "LITERAL", "app-group"), ("Cluster", "LITERAL", "kafka-cluster")}
    assert "ACL authorizer started: 3 ACLs on 3 resource patterns" in strict.read_log()
    wait_until(lambda: "app-orders" in admin(strict.bootstrap).list_topics(timeout=10).topics)


def test_broker_to_broker_apis_need_cluster_action(lenient: BrokerProcess, clean: AdminClient,
                                                   topic_name: str) -> None:
    from kbroker.protocol.messages import FetchRequest, LeaderAndIsrRequest, WriteTxnMarkersRequest

    create_topic(clean, topic_name)
    create_acls(clean, [allow(ResourceType.BROKER, "kafka-cluster", AclOperation.ALL),
                        deny(ResourceType.BROKER, "kafka-cluster", AclOperation.CLUSTER_ACTION)])
    W = WriteTxnMarkersRequest
    with RawClient(lenient.bootstrap) as raw:
        # A follower's fetch (replica id 7): every partition refused.
        fetch = raw.request(1, 12, FetchRequest(replica_id=7, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                                                topics=[FetchRequest.FetchTopic(topic=topic_name, partitions=[
                                                    FetchRequest.FetchPartition(partition=0, fetch_offset=0,
                                                                                partition_max_bytes=1 << 20)])]))
        assert [p.error_code for p in fetch.responses[0].partitions] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
        # The same fetch as a consumer reads (Read comes from allow.everyone.if.no.acl.found).
        consumer = raw.request(1, 12, FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                                                   topics=[FetchRequest.FetchTopic(topic=topic_name, partitions=[
                                                       FetchRequest.FetchPartition(partition=0, fetch_offset=0,
                                                                                   partition_max_bytes=1 << 20)])]))
        assert [p.error_code for p in consumer.responses[0].partitions] == [0]
        markers = raw.request(27, 1, W(markers=[W.WritableTxnMarker(
            producer_id=1, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
            topics=[W.WritableTxnMarkerTopic(name=topic_name, partition_indexes=[0])])]))
        assert [p.error_code for p in markers.markers[0].topics[0].partitions] == [
            KafkaError.CLUSTER_AUTHORIZATION_FAILED]
        lai = raw.request(4, 5, LeaderAndIsrRequest(controller_id=0, controller_epoch=1, broker_epoch=0,
                                                    topic_states=[], live_leaders=[]))
        assert lai.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_unreadable_acl_file_stops_startup(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path, {"authorizer.class.name": AUTHORIZER})
    (tmp_path / "logs").mkdir(parents=True)
    (tmp_path / "logs" / "kbroker-acls.json").write_text('{"version": 1, "resources": [{"resourceType": "Topic"')
    with pytest.raises(RuntimeError) as info:
        b.start(timeout=20)
    assert "cannot read the ACLs in" in str(info.value) and "Traceback" not in str(info.value)


def test_without_an_authorizer_any_client_commits_another_producers_transaction(broker: BrokerProcess,
                                                                                 topic_name: str) -> None:
    # Kafka 3.9 without an authorizer answers a stranger's WriteTxnMarkers like the coordinator's: the victim's
    # open transaction is committed. docs/security.md and configs/server.properties say so, and that the
    # authorizer closes it (test_broker_to_broker_apis_need_cluster_action: CLUSTER_AUTHORIZATION_FAILED).
    from kbroker.protocol.messages import DescribeProducersRequest, WriteTxnMarkersRequest

    docs = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert "WriteTxnMarkers: any client can commit or abort another producer's open transaction" in docs
    props = (Path(__file__).resolve().parents[2] / "configs" / "server.properties").read_text()
    assert "WriteTxnMarkers committing or aborting another producer's transaction" in props
    create_topic(admin(broker.bootstrap), topic_name)
    victim = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"victim-{topic_name}"})
    victim.init_transactions(15)
    victim.begin_transaction()
    victim.produce(topic_name, b"not yet committed", partition=0)
    victim.flush(15)
    D, W = DescribeProducersRequest, WriteTxnMarkersRequest
    with RawClient(broker.bootstrap) as raw:
        described = raw.request(61, 0, D(topics=[D.TopicRequest(name=topic_name, partition_indexes=[0])]))
        [state] = described.topics[0].partitions[0].active_producers
        assert state.current_txn_start_offset == 0
        markers = raw.request(27, 1, W(markers=[W.WritableTxnMarker(
            producer_id=state.producer_id, producer_epoch=state.producer_epoch, transaction_result=True,
            coordinator_epoch=0, topics=[W.WritableTxnMarkerTopic(name=topic_name, partition_indexes=[0])])]))
        assert [p.error_code for p in markers.markers[0].topics[0].partitions] == [0]
    got = ck_consume(broker.bootstrap, topic_name, [0], 1, timeout=15, **{"isolation.level": "read_committed"})
    assert [r.value for r in got] == [b"not yet committed"]
    try:
        victim.abort_transaction(15)
    except KafkaException:
        pass

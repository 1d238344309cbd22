"""Admin APIs through confluent-kafka's AdminClient, kafka-python's KafkaAdminClient, aiokafka and kcat.

CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, DescribeCluster and Metadata auto-creation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import kafka.errors as KErr
import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from kafka import KafkaAdminClient
from kafka import TopicPartition as KTP
from kafka.admin import AlterConfigOp
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType as KType

from tests.clients import (
    KpRaw,
    Msg,
    aio_consume,
    ck_consume,
    ck_consumer,
    ck_produce,
    kcat,
    kp_consume,
    kp_produce,
    wait_until,
)
from tests.conftest import have_kcat

T = 15  # seconds for admin futures


@pytest.fixture(scope="module")
def ck_admin(broker) -> AdminClient:
    # Metadata lookups by name must not auto-create what they look for.
    return AdminClient({"bootstrap.servers": broker.bootstrap, "allow.auto.create.topics": False})


@pytest.fixture(scope="module")
def kp_admin(broker) -> Iterator[KafkaAdminClient]:
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    yield a
    a.close()


def ck_error(fut) -> CKError:  # type: ignore[no-untyped-def]
    with pytest.raises(KafkaException) as e:
        fut.result(T)
    return e.value.args[0]


class _Topics:
    """`name in ck_topics(admin)` and `ck_topics(admin)[name]`, through Metadata requests naming the topic.

    (librdkafka's all-topics Metadata v12 request carries 3 stray bytes; see test_list_all_topics_confluent.)
    """

    def __init__(self, admin: AdminClient) -> None:
        self.admin = admin

    def _get(self, name: str):  # type: ignore[no-untyped-def]
        md = self.admin.list_topics(topic=name, timeout=T).topics.get(name)
        return None if md is None or md.error is not None else md

    def __contains__(self, name: str) -> bool:
        return self._get(name) is not None

    def __getitem__(self, name: str):  # type: ignore[no-untyped-def]
        md = self._get(name)
        if md is None:
            raise KeyError(name)
        return md


def ck_topics(admin: AdminClient) -> _Topics:
    return _Topics(admin)


# ---------------------------------------------------------------- CreateTopics


def test_create_topic_confluent(ck_admin, topic_name):
    fs = ck_admin.create_topics([NewTopic(topic_name, 4, 1, config={"retention.ms": "3600000"})], operation_timeout=T)
    assert fs[topic_name].result(T) is None
    md = ck_topics(ck_admin)[topic_name]
    assert sorted(md.partitions) == [0, 1, 2, 3]
    assert all(p.leader == 0 and p.replicas == [0] and p.isrs == [0] for p in md.partitions.values())
    cfg = ck_admin.describe_configs([ConfigResource("topic", topic_name)])
    entries = next(iter(cfg.values())).result(T)
    assert entries["retention.ms"].value == "3600000"
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def test_create_topic_kafka_python(kp_admin, ck_admin, topic_name):
    kp_admin.create_topics({topic_name: {"num_partitions": 2, "replication_factor": 1,
                                         "configs": {"cleanup.policy": "compact"}}})
    md = ck_topics(ck_admin)[topic_name]
    assert sorted(md.partitions) == [0, 1]
    # Broker defaults apply for -1 (KIP-464): num.partitions=1, default.replication.factor=1.
    name2 = topic_name + "-defaults"
    kp_admin.create_topics({name2: {}})
    assert sorted(ck_topics(ck_admin)[name2].partitions) == [0]
    described = kp_admin.describe_configs([KConfigResource(KType.TOPIC, topic_name)])
    assert described["topic"][topic_name]["cleanup.policy"]["value"] == "compact"


def test_create_topic_aiokafka(broker, ck_admin, topic_name):
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewTopic as ANewTopic

    async def run() -> None:
        a = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await a.start()
        try:
            await a.create_topics([ANewTopic(topic_name, 3, 1)])
            assert topic_name in await a.list_topics()
            await a.delete_topics([topic_name])
        finally:
            await a.close()

    asyncio.run(run())
    wait_until(lambda: topic_name not in ck_topics(ck_admin), what="topic deleted")


def test_create_validate_only(ck_admin, kp_admin, topic_name):
    fs = ck_admin.create_topics([NewTopic(topic_name, 3, 1)], validate_only=True, operation_timeout=T)
    assert fs[topic_name].result(T) is None
    kp_admin.create_topics({topic_name: {"num_partitions": 2, "replication_factor": 1}}, validate_only=True)
    assert topic_name not in ck_topics(ck_admin)
    # validate_only still reports errors.
    err = ck_error(ck_admin.create_topics([NewTopic(topic_name, 1, 3)], validate_only=True)[topic_name])
    assert err.code() == CKError.INVALID_REPLICATION_FACTOR


@pytest.mark.parametrize("bad", ["bad name", "a/b", "x" * 250, ".", "..", "ünïcode"])
def test_create_invalid_topic_name(ck_admin, kp_admin, bad):
    err = ck_error(ck_admin.create_topics([NewTopic(bad, 1, 1)], operation_timeout=T)[bad])
    assert err.code() == CKError.TOPIC_EXCEPTION
    with pytest.raises(KErr.InvalidTopicError):
        kp_admin.create_topics({bad: {"num_partitions": 1, "replication_factor": 1}})
    assert bad not in ck_topics(ck_admin)


def test_create_colliding_topic_name(ck_admin, topic_name):
    name = topic_name + ".dot"
    ck_admin.create_topics([NewTopic(name, 1, 1)])[name].result(T)
    other = topic_name + "_dot"
    err = ck_error(ck_admin.create_topics([NewTopic(other, 1, 1)])[other])
    assert err.code() == CKError.TOPIC_EXCEPTION
    assert "collides" in err.str()


def test_create_duplicate(ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    err = ck_error(ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name])
    assert err.code() == CKError.TOPIC_ALREADY_EXISTS
    with pytest.raises(KErr.TopicAlreadyExistsError):
        kp_admin.create_topics({topic_name: {"num_partitions": 1, "replication_factor": 1}})


def test_create_invalid_partitions(kp_admin, ck_admin, topic_name):
    for n in (0, -5):
        with pytest.raises(KErr.InvalidPartitionsError):
            kp_admin.create_topics({topic_name: {"num_partitions": n, "replication_factor": 1}})
    assert topic_name not in ck_topics(ck_admin)


def test_create_invalid_replication_factor(ck_admin, kp_admin, topic_name):
    err = ck_error(ck_admin.create_topics([NewTopic(topic_name, 1, 3)])[topic_name])
    assert err.code() == CKError.INVALID_REPLICATION_FACTOR
    with pytest.raises(KErr.InvalidReplicationFactorError):
        kp_admin.create_topics({topic_name: {"num_partitions": 1, "replication_factor": 2}})
    with pytest.raises(KErr.InvalidReplicationFactorError):
        kp_admin.create_topics({topic_name: {"num_partitions": 1, "replication_factor": 0}})
    assert topic_name not in ck_topics(ck_admin)


@pytest.mark.parametrize("config", [
    {"retention.ms": "abc"},
    {"cleanup.policy": "shred"},
    {"no.such.config": "1"},
    {"segment.bytes": "1"},
    {"max.message.bytes": "-7"},
])
def test_create_invalid_config(ck_admin, kp_admin, topic_name, config):
    err = ck_error(ck_admin.create_topics([NewTopic(topic_name, 1, 1, config=config)])[topic_name])
    assert err.code() == CKError.INVALID_CONFIG
    assert next(iter(config)) in err.str()
    with pytest.raises(KErr.InvalidConfigurationError):
        kp_admin.create_topics({topic_name: {"num_partitions": 1, "replication_factor": 1, "configs": config}})
    assert topic_name not in ck_topics(ck_admin)


def test_create_with_assignment(kp_admin, ck_admin, topic_name):
    kp_admin.create_topics({topic_name: {"assignments": {0: [0], 1: [0]}}})
    assert sorted(ck_topics(ck_admin)[topic_name].partitions) == [0, 1]
    bad = topic_name + "-bad"
    with pytest.raises(KErr.InvalidReplicationAssignmentError):
        kp_admin.create_topics({bad: {"assignments": {0: [7]}}})


def test_create_many_at_once(ck_admin, topic_name):
    names = [f"{topic_name}-{i}" for i in range(5)] + ["bad name"]
    fs = ck_admin.create_topics([NewTopic(n, 1, 1) for n in names], operation_timeout=T)
    for n in names[:-1]:
        assert fs[n].result(T) is None
    assert ck_error(fs["bad name"]).code() == CKError.TOPIC_EXCEPTION


# ---------------------------------------------------------------- DeleteTopics


def test_delete_topic_confluent(broker, ck_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(T)
    ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"old", partition=0)])
    assert ck_admin.delete_topics([topic_name], operation_timeout=T)[topic_name].result(T) is None
    assert topic_name not in ck_topics(ck_admin)
    err = ck_error(ck_admin.delete_topics([topic_name])[topic_name])
    assert err.code() == CKError.UNKNOWN_TOPIC_OR_PART
    # Re-creating the name gives a new, empty topic.
    ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    lo, hi = _watermarks(broker, topic_name, 0)
    assert (lo, hi) == (0, 0)
    ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"new", partition=0)])
    assert [r.value for r in ck_consume(broker.bootstrap, topic_name, [0], 1)] == [b"new"]


def test_delete_topic_kafka_python(broker, kp_admin, ck_admin, topic_name):
    kp_admin.create_topics({topic_name: {"num_partitions": 1, "replication_factor": 1}})
    kp_produce(broker.bootstrap, topic_name, [Msg(b"k", b"v", partition=0)])
    kp_admin.delete_topics([topic_name])
    assert topic_name not in ck_topics(ck_admin)
    with pytest.raises(KErr.UnknownTopicOrPartitionError):
        kp_admin.delete_topics([topic_name])


def test_delete_topic_by_id(broker, ck_admin, topic_name):
    """DeleteTopics v6 names topics by id (kafka-python's raw protocol classes)."""
    from kafka.protocol.admin.topics import DeleteTopicsRequest
    from kafka.protocol.metadata.metadata import MetadataRequest

    ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    with KpRaw(broker.bootstrap) as raw:
        md = raw.send(MetadataRequest(topics=[(None, topic_name)], allow_auto_topic_creation=False))
        topic_id = md.topics[0].topic_id
        assert md.topics[0].error_code == 0 and topic_id != b"\0" * 16
        resp = raw.send(DeleteTopicsRequest(topics=[(None, topic_id)], timeout_ms=5000))
        assert resp.responses[0].error_code == 0
        assert resp.responses[0].name == topic_name
        resp = raw.send(DeleteTopicsRequest(topics=[(None, topic_id)], timeout_ms=5000))
        assert resp.responses[0].error_code == KErr.UnknownTopicIdError.errno
    assert topic_name not in ck_topics(ck_admin)


# ---------------------------------------------------------------- CreatePartitions


def test_create_partitions_confluent(broker, ck_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(T)
    assert ck_admin.create_partitions([NewPartitions(topic_name, 5)], validate_only=True)[topic_name].result(T) is None
    assert len(ck_topics(ck_admin)[topic_name].partitions) == 2
    assert ck_admin.create_partitions([NewPartitions(topic_name, 5)])[topic_name].result(T) is None
    assert sorted(ck_topics(ck_admin)[topic_name].partitions) == [0, 1, 2, 3, 4]
    err = ck_error(ck_admin.create_partitions([NewPartitions(topic_name, 3)])[topic_name])
    assert err.code() == CKError.INVALID_PARTITIONS
    err = ck_error(ck_admin.create_partitions([NewPartitions(topic_name, 5)])[topic_name])
    assert err.code() == CKError.INVALID_PARTITIONS
    err = ck_error(ck_admin.create_partitions([NewPartitions(topic_name + "-nope", 5)])[topic_name + "-nope"])
    assert err.code() == CKError.UNKNOWN_TOPIC_OR_PART
    # A count no request may add at once is refused before anything is assigned (a fuzzed 2^31 - 1 once
    # grew the broker to 23 GB).
    err = ck_error(ck_admin.create_partitions([NewPartitions(topic_name, 100_000)])[topic_name])
    assert err.code() == CKError.POLICY_VIOLATION
    # The new partitions take and serve data.
    delivered = ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"p4", partition=4)])
    assert (delivered[0].partition, delivered[0].offset) == (4, 0)
    assert [r.value for r in kp_consume(broker.bootstrap, topic_name, [4], 1)] == [b"p4"]


def test_create_partitions_kafka_python(broker, kp_admin, ck_admin, topic_name):
    kp_admin.create_topics({topic_name: {"num_partitions": 1, "replication_factor": 1}})
    kp_admin.create_partitions({topic_name: 3})
    assert sorted(ck_topics(ck_admin)[topic_name].partitions) == [0, 1, 2]
    kp_admin.create_partitions({topic_name: {"count": 4, "assignments": [[0]]}})
    assert len(ck_topics(ck_admin)[topic_name].partitions) == 4
    with pytest.raises(KErr.InvalidPartitionsError):
        kp_admin.create_partitions({topic_name: 2})
    with pytest.raises(KErr.InvalidReplicationAssignmentError):
        kp_admin.create_partitions({topic_name: {"count": 6, "assignments": [[0]]}})
    with pytest.raises(KErr.InvalidReplicationAssignmentError):
        kp_admin.create_partitions({topic_name: {"count": 5, "assignments": [[9]]}})
    with pytest.raises(KErr.PolicyViolationError):
        kp_admin.create_partitions({topic_name: 10_005})
    kp_produce(broker.bootstrap, topic_name, [Msg(b"k", b"p3", partition=3)])
    assert [r.value for r in aio_consume(broker.bootstrap, topic_name, [3], 1)] == [b"p3"]


# ---------------------------------------------------------------- DeleteRecords


def _watermarks(broker, topic: str, partition: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    c = ck_consumer(broker.bootstrap)
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=T)
    finally:
        c.close()


def test_delete_records_confluent(broker, ck_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    ck_produce(broker.bootstrap, topic_name, [Msg(b"k", f"v{i}".encode(), partition=0) for i in range(100)])
    fs = ck_admin.delete_records([TopicPartition(topic_name, 0, 40)], operation_timeout=T)
    result = next(iter(fs.values())).result(T)
    assert result.low_watermark == 40
    assert _watermarks(broker, topic_name, 0) == (40, 100)
    # Consumers reading "from the beginning" now start at the new log start offset.
    got = kp_consume(broker.bootstrap, topic_name, [0], 60)
    assert [r.offset for r in got] == list(range(40, 100))
    got = ck_consume(broker.bootstrap, topic_name, [0], 60)
    assert got[0].offset == 40 and got[0].value == b"v40"
    # Beyond the high watermark is OFFSET_OUT_OF_RANGE.
    fs = ck_admin.delete_records([TopicPartition(topic_name, 0, 500)])
    assert ck_error(next(iter(fs.values()))).code() == CKError.OFFSET_OUT_OF_RANGE
    # -1 (OFFSET_END) deletes up to the high watermark.
    fs = ck_admin.delete_records([TopicPartition(topic_name, 0, -1)])
    assert next(iter(fs.values())).result(T).low_watermark == 100
    assert _watermarks(broker, topic_name, 0) == (100, 100)


def test_delete_records_kafka_python(broker, kp_admin, topic_name):
    from kafka import KafkaConsumer

    kp_admin.create_topics({topic_name: {"num_partitions": 2, "replication_factor": 1}})
    kp_produce(broker.bootstrap, topic_name, [Msg(b"k", b"v", partition=i % 2) for i in range(50)])
    res = kp_admin.delete_records({KTP(topic_name, 0): 10, KTP(topic_name, 1): 25})
    assert {tp.partition: md["low_watermark"] for tp, md in res.items()} == {0: 10, 1: 25}
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    try:
        tps = [KTP(topic_name, 0), KTP(topic_name, 1)]
        assert c.beginning_offsets(tps) == {tps[0]: 10, tps[1]: 25}
        assert c.end_offsets(tps) == {tps[0]: 25, tps[1]: 25}
    finally:
        c.close()
    # An earlier offset than the current log start does not move it back.
    res = kp_admin.delete_records({KTP(topic_name, 0): 5})
    assert res[KTP(topic_name, 0)]["low_watermark"] == 10
    got = aio_consume(broker.bootstrap, topic_name, [0], 15)
    assert [r.offset for r in got] == list(range(10, 25))


# ---------------------------------------------------------------- DescribeConfigs / AlterConfigs


def _ck_describe(admin: AdminClient, rtype: str, name: str) -> dict:
    return next(iter(admin.describe_configs([ConfigResource(rtype, name)]).values())).result(T)


def test_describe_topic_configs(ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"retention.ms": "12345"})])[topic_name].result(T)
    entries = _ck_describe(ck_admin, "topic", topic_name)
    assert entries["retention.ms"].value == "12345" and not entries["retention.ms"].is_default
    assert entries["cleanup.policy"].value == "delete"
    assert entries["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["segment.bytes"].value == "1073741824"  # broker's static log.segment.bytes
    assert entries["max.message.bytes"].value == "1048588"
    modified = kp_admin.describe_configs([KConfigResource(KType.TOPIC, topic_name)])["topic"][topic_name]
    assert set(modified) == {"retention.ms"}
    everything = kp_admin.describe_configs([KConfigResource(KType.TOPIC, topic_name)], config_filter="all")
    assert everything["topic"][topic_name]["retention.ms"]["value"] == "12345"
    assert set(everything["topic"][topic_name]) == set(entries)
    # Asking for named keys returns just those.
    only = kp_admin.describe_configs([KConfigResource(KType.TOPIC, topic_name, ["retention.ms", "cleanup.policy"])],
                                     config_filter="all")
    assert set(only["topic"][topic_name]) == {"retention.ms", "cleanup.policy"}


def test_describe_configs_errors(broker, ck_admin):
    from kafka.protocol.admin.configs import DescribeConfigsRequest

    fut = next(iter(ck_admin.describe_configs([ConfigResource("topic", "no-such-topic-xyz")]).values()))
    assert ck_error(fut).code() == CKError.UNKNOWN_TOPIC_OR_PART
    # kafka-python's admin client drops per-resource errors, so ask through its protocol classes.
    with KpRaw(broker.bootstrap) as raw:
        resp = raw.send(DescribeConfigsRequest(resources=[
            (KType.TOPIC, "no-such-topic-xyz", None),
            (KType.BROKER, "42", None),  # Kafka: "Unexpected broker id, expected 0 ..."
            (KType.BROKER, "0", ["num.partitions"]),
        ], include_synonyms=True))
        codes = [(r.resource_name, r.error_code) for r in resp.results]
        assert codes == [("no-such-topic-xyz", KErr.UnknownTopicOrPartitionError.errno),
                         ("42", KErr.InvalidRequestError.errno), ("0", 0)]
        [entry] = resp.results[2].configs
        assert (entry.name, entry.value) == ("num.partitions", "1")
        assert [(s.name, s.value) for s in entry.synonyms][0] == ("num.partitions", "1")


def test_describe_broker_configs(broker, ck_admin, kp_admin):
    entries = _ck_describe(ck_admin, "broker", "0")
    assert entries["num.partitions"].value == "1"
    assert entries["num.partitions"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert entries["log.dirs"].value == broker.overrides["log.dirs"]
    assert entries["broker.id"].is_read_only
    all_cfg = kp_admin.describe_configs([KConfigResource(KType.BROKER, "0")], config_filter="all")["broker"]["0"]
    assert all_cfg["auto.create.topics.enable"]["value"] == "true"
    assert all_cfg["message.max.bytes"]["value"] == "1048588"


def test_alter_topic_configs_confluent(ck_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"retention.ms": "1000000"})])[topic_name].result(T)
    # Legacy AlterConfigs replaces the whole set: keys left out return to their defaults.
    res = ConfigResource("topic", topic_name, set_config={"cleanup.policy": "compact"})
    next(iter(ck_admin.alter_configs([res]).values())).result(T)
    entries = _ck_describe(ck_admin, "topic", topic_name)
    assert entries["cleanup.policy"].value == "compact"
    assert entries["retention.ms"].is_default and entries["retention.ms"].value == "604800000"
    # validate_only changes nothing; bad values fail with INVALID_CONFIG.
    res = ConfigResource("topic", topic_name, set_config={"retention.ms": "5"})
    next(iter(ck_admin.alter_configs([res], validate_only=True).values())).result(T)
    assert _ck_describe(ck_admin, "topic", topic_name)["retention.ms"].is_default
    res = ConfigResource("topic", topic_name, set_config={"retention.ms": "soon"})
    assert ck_error(next(iter(ck_admin.alter_configs([res]).values()))).code() == CKError.INVALID_CONFIG
    res = ConfigResource("topic", topic_name + "-nope", set_config={"retention.ms": "5"})
    assert ck_error(next(iter(ck_admin.alter_configs([res]).values()))).code() == CKError.UNKNOWN_TOPIC_OR_PART


def test_incremental_alter_topic_configs_confluent(ck_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"retention.ms": "1000000"})])[topic_name].result(T)
    res = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("max.message.bytes", "20000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
    ])
    next(iter(ck_admin.incremental_alter_configs([res]).values())).result(T)
    entries = _ck_describe(ck_admin, "topic", topic_name)
    assert entries["retention.ms"].value == "1000000"  # untouched, unlike legacy AlterConfigs
    assert entries["max.message.bytes"].value == "20000"
    assert entries["cleanup.policy"].value == "delete,compact"
    res = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT),
    ])
    next(iter(ck_admin.incremental_alter_configs([res]).values())).result(T)
    entries = _ck_describe(ck_admin, "topic", topic_name)
    assert entries["retention.ms"].is_default
    assert entries["cleanup.policy"].value == "compact"
    res = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND),
    ])
    assert ck_error(next(iter(ck_admin.incremental_alter_configs([res]).values()))).code() == CKError.INVALID_CONFIG


def test_alter_configs_kafka_python(broker, kp_admin, ck_admin, topic_name):
    kp_admin.create_topics({topic_name: {"num_partitions": 1, "replication_factor": 1}})
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {"max.message.bytes": "5000"})],
                               incremental=False)
    assert r["topic"][topic_name] == "OK"
    assert _ck_describe(ck_admin, "topic", topic_name)["max.message.bytes"].value == "5000"
    # The new limit is enforced by Produce at once.
    from kafka.errors import MessageSizeTooLargeError

    with pytest.raises(MessageSizeTooLargeError):
        kp_produce(broker.bootstrap, topic_name, [Msg(b"k", b"x" * 8000, partition=0)], retries=0)
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {
        "retention.ms": (AlterConfigOp.SET, "7200000"),
        "max.message.bytes": (AlterConfigOp.DELETE, None),
    })], incremental=True)
    assert r["topic"][topic_name] == "OK"
    entries = _ck_describe(ck_admin, "topic", topic_name)
    assert entries["retention.ms"].value == "7200000"
    assert entries["max.message.bytes"].is_default
    kp_produce(broker.bootstrap, topic_name, [Msg(b"k", b"x" * 8000, partition=0)], retries=0)
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {"retention.ms": "never"})],
                               incremental=True)
    assert "InvalidConfiguration" in r["topic"][topic_name]


def test_alter_broker_configs(broker, ck_admin, kp_admin, topic_name):
    """Dynamic broker configs (message.max.bytes, log.retention.ms) through both alter APIs and both clients."""
    ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    res = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry("log.retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET),
    ])
    next(iter(ck_admin.incremental_alter_configs([res]).values())).result(T)
    try:
        entries = _ck_describe(ck_admin, "broker", "0")
        assert entries["log.retention.ms"].value == "86400000"
        assert entries["log.retention.ms"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value or \
            entries["log.retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        # Topics without their own retention.ms inherit it.
        assert _ck_describe(ck_admin, "topic", topic_name)["retention.ms"].value == "86400000"
        # Read-only broker configs cannot be changed.
        res = ConfigResource("broker", "0", incremental_configs=[
            ConfigEntry("num.io.threads", "9", incremental_operation=AlterConfigOpType.SET),
        ])
        assert ck_error(next(iter(ck_admin.incremental_alter_configs([res]).values()))).code() == \
            CKError.INVALID_CONFIG
        r = kp_admin.alter_configs([KConfigResource(KType.BROKER, "0", {"message.max.bytes": "2000000"})],
                                   incremental=True, raise_on_unknown=False)
        assert r["broker"]["0"] == "OK"
        assert _ck_describe(ck_admin, "broker", "0")["message.max.bytes"].value == "2000000"
        assert _ck_describe(ck_admin, "topic", topic_name)["max.message.bytes"].value == "2000000"
        r = kp_admin.alter_configs([KConfigResource(KType.BROKER, "0", {"message.max.bytes": "lots"})],
                                   incremental=True, raise_on_unknown=False)
        assert "InvalidConfiguration" in r["broker"]["0"]
    finally:
        res = ConfigResource("broker", "0", incremental_configs=[
            ConfigEntry("log.retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry("message.max.bytes", None, incremental_operation=AlterConfigOpType.DELETE),
        ])
        next(iter(ck_admin.incremental_alter_configs([res]).values())).result(T)
    entries = _ck_describe(ck_admin, "broker", "0")
    assert entries["message.max.bytes"].value == "1048588"
    assert _ck_describe(ck_admin, "topic", topic_name)["retention.ms"].value == "604800000"


# ---------------------------------------------------------------- DescribeCluster / Metadata


def test_describe_cluster(broker, ck_admin, kp_admin):
    from kafka.protocol.admin.cluster import DescribeClusterRequest

    desc = ck_admin.describe_cluster(request_timeout=T).result(T)
    assert desc.controller.id == 0
    assert [(n.id, n.host, n.port) for n in desc.nodes] == [(0, "127.0.0.1", broker.port)]
    assert desc.cluster_id and len(desc.cluster_id) == 22  # base64 of a 16-byte UUID, like Kafka's
    with KpRaw(broker.bootstrap) as raw:
        resp = raw.send(DescribeClusterRequest(include_cluster_authorized_operations=False))
        assert resp.error_code == 0
        assert resp.cluster_id == desc.cluster_id
        assert resp.controller_id == 0
        assert [(b.broker_id, b.host, b.port) for b in resp.brokers] == [(0, "127.0.0.1", broker.port)]
    # kafka-python's describe_cluster goes through Metadata: same answer.
    md = kp_admin.describe_cluster()
    assert md["cluster_id"] == desc.cluster_id and md["controller_id"] == 0


def test_metadata_and_describe_cluster_agree(broker, ck_admin, topic_name):
    c = ck_consumer(broker.bootstrap)
    try:
        md = c.list_topics(topic=topic_name, timeout=T)
        assert md.cluster_id == ck_admin.describe_cluster().result(T).cluster_id
        assert md.controller_id == 0
        assert md.topics[topic_name].error.code() == CKError.UNKNOWN_TOPIC_OR_PART  # not auto-created
    finally:
        c.close()


def test_list_all_topics_confluent(broker, ck_admin, kp_admin, topic_name):
    """AdminClient.list_topics() with no topic: Metadata v12 with a null topic array.

    librdkafka 2.16 writes the null compact array as 4 bytes (00 00 00 00) instead of 1, so the body
    ends with 3 bytes that Kafka's parser never reads and ignores. kbroker must not close the connection.
    """
    ck_admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(T)
    md = ck_admin.list_topics(timeout=T)
    assert sorted(md.topics[topic_name].partitions) == [0, 1]
    assert topic_name in kp_admin.list_topics()


@pytest.mark.skipif(not have_kcat(), reason="kcat not installed")
def test_auto_create_kcat(broker, ck_admin, topic_name):
    assert topic_name not in ck_topics(ck_admin)
    kcat(broker.bootstrap, "-P", "-t", topic_name, "-K:", input=b"a:1\nb:2\n")
    md = ck_topics(ck_admin)[topic_name]
    assert sorted(md.partitions) == [0]  # num.partitions=1
    out = kcat(broker.bootstrap, "-L", "-t", topic_name).stdout.decode()
    assert f'topic "{topic_name}" with 1 partitions' in out


def test_auto_create_clients(broker, ck_admin, topic_name):
    ck_produce(broker.bootstrap, topic_name + "-ck", [Msg(b"k", b"v")])
    kp_produce(broker.bootstrap, topic_name + "-kp", [Msg(b"k", b"v")])
    topics = ck_topics(ck_admin)
    assert topic_name + "-ck" in topics and topic_name + "-kp" in topics


def test_no_auto_create_when_not_allowed(broker, ck_admin, topic_name):
    """Metadata v4+ with allow_auto_topic_creation=false, and invalid names, create nothing."""
    from kafka.protocol.metadata.metadata import MetadataRequest

    with KpRaw(broker.bootstrap) as raw:
        md = raw.send(MetadataRequest(topics=[(None, topic_name)], allow_auto_topic_creation=False))
        assert md.topics[0].error_code == KErr.UnknownTopicOrPartitionError.errno
        md = raw.send(MetadataRequest(topics=[(None, "bad name!")], allow_auto_topic_creation=True))
        assert md.topics[0].error_code == KErr.InvalidTopicError.errno
    topics = ck_topics(ck_admin)
    assert topic_name not in topics and "bad name!" not in topics


def test_broker_default_resource(broker, ck_admin):
    """The empty broker name is the cluster-wide default: alterable, and describing it lists the dynamic defaults.

    (librdkafka refuses an empty resource name, so this goes through kafka-python's protocol classes.)
    """
    from kafka.protocol.admin.configs import DescribeConfigsRequest, IncrementalAlterConfigsRequest

    key = "log.cleaner.delete.retention.ms"

    def alter(raw: KpRaw, op: int, value: str | None) -> None:
        resp = raw.send(IncrementalAlterConfigsRequest(
            resources=[(KType.BROKER, "", [(key, op, value)])], validate_only=False))
        assert [r.error_code for r in resp.responses] == [0]

    def describe_default(raw: KpRaw) -> list[tuple[str, str, int]]:
        resp = raw.send(DescribeConfigsRequest(resources=[(KType.BROKER, "", None)], include_synonyms=False))
        [r] = resp.results
        assert r.error_code == 0
        return [(c.name, c.value, c.config_source) for c in r.configs]

    with KpRaw(broker.bootstrap) as raw:
        alter(raw, AlterConfigOp.SET, "3600000")
        try:
            assert describe_default(raw) == [(key, "3600000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)]
            # The per-broker view shows the dynamic default as the effective value.
            assert _ck_describe(ck_admin, "broker", "0")[key].value == "3600000"
        finally:
            alter(raw, AlterConfigOp.DELETE, None)
        assert describe_default(raw) == []
    assert _ck_describe(ck_admin, "broker", "0")[key].value == "86400000"

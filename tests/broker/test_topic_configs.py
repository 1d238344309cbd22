"""Topic and broker configs as Kafka 3.9 answers them: empty cleanup.policy, compression.type with broker-side
recompression, DescribeConfigs read-only flags, sources and synonyms.

Clients: confluent-kafka's AdminClient, kafka-python's KafkaAdminClient (and its protocol classes), raw frames.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka import KafkaAdminClient
from kafka.admin import AlterConfigOp
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType as KType

from tests.broker_process import BrokerProcess
from tests.clients import Msg, ck_consume, ck_produce, kp_consume, wait_until

T = 15


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # Fast retention and cleaner schedules, so "nothing was deleted" means something within seconds.
    b = BrokerProcess(Path(tmp_path_factory.mktemp("topic-configs")), {
        "log.retention.check.interval.ms": "100",
        "log.cleaner.backoff.ms": "100",
        "log.segment.delete.delay.ms": "0",
    })
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def ck_admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap, "allow.auto.create.topics": False})


@pytest.fixture(scope="module")
def kp_admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    yield a
    a.close()


def ck_describe(admin: AdminClient, rtype: str, name: str) -> dict:
    return next(iter(admin.describe_configs([ConfigResource(rtype, name)]).values())).result(T)


def kp_describe(admin: KafkaAdminClient, rtype: KType, name: str) -> dict:
    out = admin.describe_configs([KConfigResource(rtype, name)], config_filter="all")
    return out["topic" if rtype == KType.TOPIC else "broker"][name]


def ck_incremental(admin: AdminClient, rtype: str, name: str, *entries: ConfigEntry) -> None:
    next(iter(admin.incremental_alter_configs([ConfigResource(rtype, name, incremental_configs=list(entries))])
              .values())).result(T)


# ---------------------------------------------------------------- empty cleanup.policy


def test_empty_cleanup_policy_create_and_describe(ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"cleanup.policy": ""})])[topic_name].result(T)
    entry = ck_describe(ck_admin, "topic", topic_name)["cleanup.policy"]
    assert entry.value == "" and not entry.is_default
    assert kp_describe(kp_admin, KType.TOPIC, topic_name)["cleanup.policy"]["value"] == ""
    other = topic_name + "-kp"
    kp_admin.create_topics({other: {"num_partitions": 1, "replication_factor": 1,
                                    "configs": {"cleanup.policy": ""}}})
    assert ck_describe(ck_admin, "topic", other)["cleanup.policy"].value == ""


def test_subtract_cleanup_policy_to_nothing(ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"cleanup.policy": "compact,delete"})])[topic_name] \
        .result(T)
    ck_incremental(ck_admin, "topic", topic_name,
                   ConfigEntry("cleanup.policy", "compact,delete", incremental_operation=AlterConfigOpType.SUBTRACT))
    assert ck_describe(ck_admin, "topic", topic_name)["cleanup.policy"].value == ""
    # APPEND to the empty list starts from it, not from the broker default.
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {
        "cleanup.policy": (AlterConfigOp.APPEND, "compact")})], incremental=True)
    assert r["topic"][topic_name] == "OK"
    assert kp_describe(kp_admin, KType.TOPIC, topic_name)["cleanup.policy"]["value"] == "compact"
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {
        "cleanup.policy": (AlterConfigOp.SUBTRACT, "compact")})], incremental=True)
    assert r["topic"][topic_name] == "OK"
    assert kp_describe(kp_admin, KType.TOPIC, topic_name)["cleanup.policy"]["value"] == ""
    # Legacy AlterConfigs with the empty value.
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {"cleanup.policy": "delete"})],
                               incremental=False)
    assert r["topic"][topic_name] == "OK"
    next(iter(ck_admin.alter_configs([ConfigResource("topic", topic_name, set_config={"cleanup.policy": ""})])
              .values())).result(T)
    assert ck_describe(ck_admin, "topic", topic_name)["cleanup.policy"].value == ""
    # Anything but delete/compact is still refused.
    with pytest.raises(KafkaException) as e:
        ck_incremental(ck_admin, "topic", topic_name,
                       ConfigEntry("cleanup.policy", "shred", incremental_operation=AlterConfigOpType.APPEND))
    assert e.value.args[0].code() == CKError.INVALID_CONFIG


def test_empty_cleanup_policy_neither_deletes_nor_compacts(broker, ck_admin, topic_name):
    """retention.ms=1 and tiny segments would delete everything under "delete"; duplicate keys would be
    compacted away under "compact". With the empty policy every record stays."""
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={
        "cleanup.policy": "", "retention.ms": "1", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01",
        "segment.ms": "100"})])[topic_name].result(T)
    msgs = [Msg(b"same-key", b"v%03d" % i + b"x" * 200, partition=0)
            for i in range(60)]
    ck_produce(broker.bootstrap, topic_name, msgs, linger_ms=0, batch_num_messages=1)
    # A control topic under "delete" shows the schedule is running: its old segments go within the wait.
    control = topic_name + "-delete"
    ck_admin.create_topics([NewTopic(control, 1, 1, config={"retention.ms": "1", "segment.bytes": "1024"})])[control] \
        .result(T)
    ck_produce(broker.bootstrap, control, msgs, linger_ms=0, batch_num_messages=1)

    def control_start() -> int:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"})
        try:
            return c.get_watermark_offsets(TopicPartition(control, 0), timeout=T)[0]
        finally:
            c.close()

    wait_until(lambda: control_start() > 0, timeout=20, what="retention on the control topic")
    recs = ck_consume(broker.bootstrap, topic_name, [0], 60)
    assert [r.offset for r in recs] == list(range(60))
    assert [r.offset for r in kp_consume(broker.bootstrap, topic_name, [0], 60)] == list(range(60))
    assert "Traceback" not in broker.read_log()


def test_broker_log_cleanup_policy_subtract_to_nothing(ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    ck_incremental(ck_admin, "broker", "0",
                   ConfigEntry("log.cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT))
    try:
        assert ck_describe(ck_admin, "broker", "0")["log.cleanup.policy"].value == ""
        # Topics without their own cleanup.policy inherit the empty list.
        assert kp_describe(kp_admin, KType.TOPIC, topic_name)["cleanup.policy"]["value"] == ""
    finally:
        ck_incremental(ck_admin, "broker", "0",
                       ConfigEntry("log.cleanup.policy", None, incremental_operation=AlterConfigOpType.DELETE))
    assert ck_describe(ck_admin, "topic", topic_name)["cleanup.policy"].value == "delete"

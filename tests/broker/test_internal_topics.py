"""The coordinators' topics (__consumer_offsets, __transaction_state) cannot be emptied, deleted, repartitioned or
switched away from compaction through the admin APIs (issue 39 item 2): DeleteRecords gets Kafka's
INVALID_TOPIC_EXCEPTION on every partition, and after a restart every group's offsets and every open transaction are
still there."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterConfigsRequest,
    DeleteRecordsRequest,
    ListOffsetsRequest,
)

from tests.broker_process import BrokerProcess
from tests.clients import Msg, RawClient, ck_conf, ck_produce, wait_until
from tests.txn_support import RawTxnProducer, high_watermark_and_lso

T = 15
INTERNAL = {"__consumer_offsets": 50, "__transaction_state": 50}


def _log_starts(bootstrap: str, topic: str, partitions: int) -> list[int]:
    req = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name=topic,
                partitions=[
                    ListOffsetsRequest.ListOffsetsPartition(partition_index=p, timestamp=-2)
                    for p in range(partitions)
                ],
            )
        ],
    )
    with RawClient(bootstrap) as raw:
        resp = raw.request(2, 4, req)
    assert all(p.error_code == 0 for p in resp.topics[0].partitions), resp
    return [p.offset for p in sorted(resp.topics[0].partitions, key=lambda p: p.partition_index)]


def _committed(bootstrap: str, group: str, topic: str) -> int:
    c = Consumer(ck_conf(bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        return c.committed([TopicPartition(topic, 0)], 10)[0].offset
    finally:
        c.close()


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    c = Consumer(ck_conf(bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def test_internal_topics_cannot_be_emptied_deleted_or_repartitioned(
    broker: BrokerProcess, topic_name: str
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"v", partition=0)] * 3)
    _commit(broker.bootstrap, f"{topic_name}-g", topic_name, 3)
    txn = RawTxnProducer(broker.bootstrap, f"{topic_name}-txn")
    assert txn.add_partitions(topic_name, [0]) == {0: 0}
    assert txn.produce(topic_name, 0, [b"open"]) == (0, 3)
    assert high_watermark_and_lso(broker.bootstrap, topic_name, [0]) == {0: (4, 3)}
    starts = {t: _log_starts(broker.bootstrap, t, n) for t, n in INTERNAL.items()}

    # DeleteRecords up to the high watermark on every partition: Kafka's INVALID_TOPIC_EXCEPTION each.
    D = DeleteRecordsRequest
    req = D(
        timeout_ms=5000,
        topics=[
            D.DeleteRecordsTopic(
                name=t, partitions=[D.DeleteRecordsPartition(partition_index=p, offset=-1) for p in range(n)]
            )
            for t, n in INTERNAL.items()
        ],
    )
    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(21, 2, req)
    for t in resp.topics:
        assert [p.error_code for p in t.partitions] == [ErrorCode.INVALID_TOPIC_EXCEPTION] * INTERNAL[t.name]
        assert {p.low_watermark for p in t.partitions} == {-1}
    # A partition that does not exist is that first.
    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(
            21,
            2,
            D(
                timeout_ms=5000,
                topics=[
                    D.DeleteRecordsTopic(
                        name="__consumer_offsets",
                        partitions=[D.DeleteRecordsPartition(partition_index=50, offset=-1)],
                    )
                ],
            ),
        )
    assert resp.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    # DeleteTopics and CreatePartitions through a real client.
    for t in INTERNAL:
        with pytest.raises(Exception) as deleted:
            admin.delete_topics([t], operation_timeout=10)[t].result(T)
        assert deleted.value.args[0].code() == ErrorCode.INVALID_TOPIC_EXCEPTION, deleted.value
        with pytest.raises(Exception) as grown:
            admin.create_partitions([NewPartitions(t, 60)])[t].result(T)
        assert grown.value.args[0].code() == ErrorCode.INVALID_TOPIC_EXCEPTION, grown.value

    # Retention may not replace compaction, neither incrementally nor by a whole new config set.
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        "__consumer_offsets",
        incremental_configs=[
            ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(Exception) as altered:
        admin.incremental_alter_configs([res])[res].result(T)
    assert altered.value.args[0].code() == ErrorCode.INVALID_CONFIG, altered.value
    A = AlterConfigsRequest
    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(
            33,
            2,
            A(
                validate_only=False,
                resources=[
                    A.AlterConfigsResource(
                        resource_type=2,
                        resource_name="__transaction_state",
                        configs=[A.AlterableConfig(name="retention.ms", value="1000")],
                    )
                ],
            ),
        )
    assert resp.responses[0].error_code == ErrorCode.INVALID_CONFIG, resp
    # Anything that keeps compaction is fine.
    ok = ConfigResource(
        ConfigResource.Type.TOPIC,
        "__consumer_offsets",
        incremental_configs=[
            ConfigEntry("segment.ms", "604800000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([ok])[ok].result(T)

    broker.restart()
    assert {t: _log_starts(broker.bootstrap, t, n) for t, n in INTERNAL.items()} == starts
    assert len(admin.list_topics(timeout=T).topics["__consumer_offsets"].partitions) == 50
    assert _committed(broker.bootstrap, f"{topic_name}-g", topic_name) == 3
    # The open transaction is still its owner's to end (same producer id and epoch, a new connection).
    txn.close()
    txn.raw = RawClient(broker.bootstrap)
    wait_until(
        lambda: txn.end(commit=False) != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        timeout=T,
        what="the transaction coordinator loaded",
    )
    txn.close()
    wait_until(
        lambda: high_watermark_and_lso(broker.bootstrap, topic_name, [0]) == {0: (5, 5)},
        timeout=T,
        what="the abort marker",
    )

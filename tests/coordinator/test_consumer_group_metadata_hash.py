"""A KIP-848 consumer group follows its subscribed topics' metadata through the group metadata hash, as Kafka 4.1+
(KIP-1101): partitions added to a subscribed topic change the hash, the group epoch is bumped and the new
partitions assigned, so a confluent-kafka consumer (group.protocol=consumer) reads them; every ConsumerGroupMetadata
record carries the hash of the topics at its epoch (Kafka's Utils.computeTopicHash, checked against Kafka's own
code in test_group_metadata_hash.py), and no ConsumerGroupPartitionMetadata record is written."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kbroker.coordinator.consumer_group_records import RecordType
from kbroker.coordinator.group_metadata_hash import group_hash, topic_hash
from kbroker.coordinator.group_records import parse_record
from kbroker.protocol.messages import MetadataRequest

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess
from tests.group_helpers import group_epoch_records, kip848_broker

T = 30


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"), kip848_broker(**{"offsets.topic.num.partitions": "1"})
    )
    b.start()
    yield b
    b.stop()


def record_types(bootstrap: str, group: str) -> set[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-" + uuid.uuid4().hex})
    try:
        tp = TopicPartition("__consumer_offsets", 0, 0)
        _, high = c.get_watermark_offsets(tp, timeout=T)
        c.assign([tp])
        out: set[int] = set()
        seen = -1
        deadline = time.monotonic() + T
        while seen < high - 1 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen = m.offset()
                r = parse_record(m.key(), m.value())
                if getattr(r, "group_id", None) == group and hasattr(r, "type"):
                    out.add(int(r.type))  # type: ignore[union-attr]
        return out
    finally:
        c.close()


def test_added_partitions_are_assigned_by_a_new_epoch(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    with WireClient(broker.bootstrap) as w:
        md = w.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic_name)]))
        tid = bytes(md.topics[0].topic_id)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(topic_name, b"a0", partition=0)
    p.flush(T)
    c = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": "1000",
        }
    )
    c.subscribe([topic_name])
    got: list[tuple[int, str]] = []

    def poll_until(want: set[str]) -> None:
        deadline = time.monotonic() + 60
        while not want <= {v for _, v in got} and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.value().decode()))

    try:
        poll_until({"a0"})
        admin.create_partitions([NewPartitions(topic_name, 3)])[topic_name].result(T)
        p = Producer({"bootstrap.servers": broker.bootstrap})  # one that knows the new partitions
        for i in (1, 2):
            p.produce(topic_name, f"b{i}".encode(), partition=i)
        p.flush(T)
        poll_until({"b1", "b2"})
        c.commit(asynchronous=False)
    finally:
        c.close()
    assert sorted(got) == [(0, "a0"), (1, "b1"), (2, "b2")]
    records = group_epoch_records(broker.bootstrap, group)
    one = group_hash({topic_name: topic_hash(tid, topic_name, [[]])})
    three = group_hash({topic_name: topic_hash(tid, topic_name, [[], [], []])})
    hashes = [h for _, h in records]
    assert [e for e, _ in records] == sorted(e for e, _ in records)
    assert hashes.index(one) < hashes.index(three)
    # the consumer left last: a group without members subscribes to nothing, whose hash is 0
    assert set(hashes) <= {one, three, 0} and records[-1][1] == 0
    assert int(RecordType.PARTITION_METADATA) not in record_types(broker.bootstrap, group)

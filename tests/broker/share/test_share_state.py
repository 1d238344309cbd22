"""Share-partition state in __share_group_state: acknowledgements survive a kill -9 of the broker, the records a
consumer held but never acknowledged come back with their delivery counts, and acquiring alone writes nothing, as
Kafka's SharePartition (confluent-kafka ShareConsumer)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import AcknowledgeType, Consumer, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import AlterShareGroupOffsetsRequest, DescribeShareGroupOffsetsRequest

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        {
            "group.share.heartbeat.interval.ms": "500",
            "group.share.min.heartbeat.interval.ms": "100",
            "offsets.topic.num.partitions": "2",
            "share.coordinator.state.topic.num.partitions": "2",
        },
    )
    b.start()
    yield b
    b.stop()


def poll_some(c: ShareConsumer, want: int, timeout: float) -> list[tuple[str, int, object]]:
    got: list[tuple[str, int, object]] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += [(m.value().decode(), m.delivery_count(), m) for m in c.poll(0.5) if m.error() is None]
    return got


def earliest_group(broker: BrokerProcess, topic: str) -> str:
    """A one-partition topic and a share group named after it that starts at the earliest offset."""
    group = "g-" + topic
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([res])[res].result(30)
    return group


def explicit_consumer(broker: BrokerProcess, group: str, topic: str) -> ShareConsumer:
    c = ShareConsumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"}
    )
    c.subscribe([topic])
    return c


def produce(broker: BrokerProcess, topic: str, values: list[str]) -> Producer:
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for v in values:
        p.produce(topic, v.encode())
    p.flush(30)
    return p


def test_acknowledgements_survive_a_kill(broker: BrokerProcess, topic_name: str) -> None:
    group = earliest_group(broker, topic_name)
    produce(broker, topic_name, [f"v{i}" for i in range(10)])
    c = explicit_consumer(broker, group, topic_name)
    got = poll_some(c, 10, 60)
    assert sorted(v for v, _, _ in got) == sorted(f"v{i}" for i in range(10))
    accepted = {f"v{i}" for i in range(0, 10, 2)}
    for v, _, m in got:
        if v in accepted:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
    c.commit_sync()
    broker.kill()  # the odd records are still acquired, never acknowledged
    c.close()
    broker.restart()
    c = explicit_consumer(broker, group, topic_name)
    try:
        again = poll_some(c, 5, 60)
        for _, _, m in again:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        c.commit_sync()
        more = poll_some(c, 1, 3)
    finally:
        c.close()
    assert sorted(v for v, _, _ in again) == sorted({f"v{i}" for i in range(10)} - accepted)
    assert all(count == 2 for _, count, _ in again), [(v, n) for v, n, _ in again]
    assert more == []
    with WireClient(broker.bootstrap) as w:
        D = DescribeShareGroupOffsetsRequest
        got = w.request(
            90,
            1,
            D(
                groups=[
                    D.DescribeShareGroupOffsetsRequestGroup(
                        group_id=group,
                        topics=[
                            D.DescribeShareGroupOffsetsRequestTopic(topic_name=topic_name, partitions=[0])
                        ],
                    )
                ]
            ),
        )
        p0 = got.groups[0].topics[0].partitions[0]
        assert (p0.error_code, p0.start_offset, p0.lag) == (0, 10, 0)


def test_offsets_reset_by_the_admin_api(broker: BrokerProcess, topic_name: str) -> None:
    """AlterShareGroupOffsets on a group without members: a share consumer then starts at the new offset."""
    group = "g-" + topic_name
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        p.produce(topic_name, f"v{i}".encode())
    p.flush(30)
    A = AlterShareGroupOffsetsRequest
    with WireClient(broker.bootstrap) as w:
        r = w.request(
            91,
            0,
            A(
                group_id=group,
                topics=[
                    A.AlterShareGroupOffsetsRequestTopic(
                        topic_name=topic_name,
                        partitions=[
                            A.AlterShareGroupOffsetsRequestPartition(partition_index=0, start_offset=7)
                        ],
                    )
                ],
            ),
        )
        assert (r.error_code, r.responses[0].partitions[0].error_code) == (0, 0)
    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    c.subscribe([topic_name])
    try:
        got = poll_some(c, 3, 60)
        with WireClient(broker.bootstrap) as w:
            busy = w.request(91, 0, A(group_id=group, topics=[]))
            assert busy.error_code == ErrorCode.NON_EMPTY_GROUP
    finally:
        c.close()
    assert sorted(v for v, _, _ in got) == ["v7", "v8", "v9"]


def state_log_end(bootstrap: str) -> int:
    """Records written to __share_group_state so far (both partitions: the fixture's two)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return sum(c.get_watermark_offsets(TopicPartition("__share_group_state", p), 10)[1] for p in range(2))
    finally:
        c.close()


def test_acquiring_writes_no_state(broker: BrokerProcess, topic_name: str) -> None:
    """Kafka writes a share-partition's state for acknowledgements, releases and expired locks, never for an
    acquisition: records acquired and never acknowledged add nothing to __share_group_state, and after a kill -9
    the ones acquired since the last write come back as a first delivery."""
    group = earliest_group(broker, topic_name)
    p = produce(broker, topic_name, [f"a{i}" for i in range(5)])
    c = explicit_consumer(broker, group, topic_name)
    first = poll_some(c, 5, 60)
    assert sorted(v for v, _, _ in first) == [f"a{i}" for i in range(5)]
    written = state_log_end(broker.bootstrap)
    assert written > 0  # the share-partition's state was initialized
    for i in range(5):
        p.produce(topic_name, f"b{i}".encode())
    p.flush(30)  # the same producer: no new producer id written anywhere
    # a second member acquires the new records: the first still holds its own, unacknowledged
    c2 = explicit_consumer(broker, group, topic_name)
    second = poll_some(c2, 5, 60)
    assert sorted(v for v, _, _ in second) == [f"b{i}" for i in range(5)]
    assert state_log_end(broker.bootstrap) == written
    broker.kill()
    c.close()
    c2.close()
    broker.restart()
    c = explicit_consumer(broker, group, topic_name)
    try:
        again = poll_some(c, 10, 60)
    finally:
        c.close()
    assert sorted(v for v, _, _ in again) == sorted(v for v, _, _ in first + second)
    # the b records were acquired after the last write: a first delivery again, as in Kafka (the a records may
    # have been in the snapshot that initialized the share-partition, and then count their delivery)
    assert {count for v, count, _ in again if v.startswith("b")} == {1}, [(v, n) for v, n, _ in again]

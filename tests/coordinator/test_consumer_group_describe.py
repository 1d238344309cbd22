"""Describing a KIP-848 consumer group with the admin clients against a real kbroker process.

Kafka 3.9 describes a consumer-protocol group only through ConsumerGroupDescribe: its GroupMetadataManager
.describeGroups looks the id up as a classic group and, for a group of another type, answers DescribeGroups
(v0-v5) with the Dead state, no protocol type and no members, without an error. confluent-kafka (librdkafka 2.10+)
and the Java Admin (see tests/java/test_java_consumer_groups.py) ask ConsumerGroupDescribe first; kafka-python's
describe_groups asks DescribeGroups only and so sees what it sees against Kafka.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupType
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kbroker.protocol.messages import DescribeGroupsRequest

from tests.broker_process import BrokerProcess
from tests.clients import RawClient, wait_until


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), {
        "group.consumer.heartbeat.interval.ms": "300", "group.consumer.min.heartbeat.interval.ms": "100",
        "offsets.topic.num.partitions": "4"})
    b.start()
    yield b
    b.stop()


def test_consumer_group_described_by_confluent_and_kafka_python(broker: BrokerProcess, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 4, 1)])[topic_name].result(30)
    group = "describe-" + topic_name
    members = [Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "group.protocol": "consumer",
                         "client.id": f"member-{i}"}) for i in range(2)]
    try:
        for c in members:
            c.subscribe([topic_name])

        def shared() -> bool:
            for c in members:
                c.poll(0.05)
            sizes = [len(c.assignment()) for c in members]
            return all(sizes) and sum(sizes) == 4

        wait_until(shared, timeout=30, what="both members assigned")
        [f] = admin.describe_consumer_groups([group]).values()
        d = f.result(10)
        assert (d.state, d.type, d.partition_assignor) == (ConsumerGroupState.STABLE, ConsumerGroupType.CONSUMER,
                                                           "uniform")
        assert sorted(m.client_id for m in d.members) == ["member-0", "member-1"]
        assigned = sorted(tp.partition for m in d.members for tp in m.assignment.topic_partitions)
        assert assigned == [0, 1, 2, 3]
        # kafka-python's describe_groups speaks DescribeGroups: Dead, as Kafka 3.9 answers it.
        kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            got = kp.describe_groups([group])[group]
        finally:
            kp.close()
        assert (got["error"], got["group_state"], got["protocol_type"], got["members"]) == (None, "Dead", "", [])
        with RawClient(broker.bootstrap) as raw:
            r = raw.request(15, 5, DescribeGroupsRequest(groups=[group], include_authorized_operations=False))
        [g] = r.groups
        assert (g.error_code, g.group_state, g.protocol_type, g.protocol_data, g.members) == (0, "Dead", "", "", [])
    finally:
        for c in members:
            c.close()
    # Both left: ConsumerGroupDescribe shows the group Empty, still of the consumer type.
    deadline = time.monotonic() + 10
    while True:
        [f] = admin.describe_consumer_groups([group]).values()
        d = f.result(10)
        if d.state == ConsumerGroupState.EMPTY or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (d.state, d.type, d.members) == (ConsumerGroupState.EMPTY, ConsumerGroupType.CONSUMER, [])


def test_leaving_member_is_told_no_heartbeat_interval(broker: BrokerProcess, topic_name: str) -> None:
    """Kafka's consumerGroupLeave answers the member id and the leave epoch only: heartbeat_interval_ms 0."""
    from kbroker.protocol.messages import ConsumerGroupHeartbeatRequest

    group = "leave-" + topic_name
    with RawClient(broker.bootstrap) as c:

        def heartbeat(member: str, epoch: int) -> object:
            return c.request(68, 0, ConsumerGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=epoch, rebalance_timeout_ms=5000,
                subscribed_topic_names=[topic_name] if epoch == 0 else None, topic_partitions=[] if epoch == 0 else None))

        joined = heartbeat("", 0)
        assert (joined.error_code, joined.heartbeat_interval_ms) == (0, 300)  # type: ignore[attr-defined]
        left = heartbeat(joined.member_id, -1)  # type: ignore[attr-defined]
        assert (left.error_code, left.member_epoch, left.heartbeat_interval_ms) == (0, -1, 0)  # type: ignore[attr-defined]

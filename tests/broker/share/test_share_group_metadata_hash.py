"""A share group follows its subscribed topics' metadata as Kafka 4.x does (KIP-1101): partitions added to a
subscribed topic, or the topic deleted and made again, change the group metadata hash, so the group's next
heartbeat bumps the group epoch, the new share-partitions are initialized and assigned. A confluent-kafka
ShareConsumer then receives the records of the new partitions; the ShareGroupMetadata records in
__consumer_offsets carry the hash of the topics as they were at each epoch (Kafka's Utils.computeTopicHash,
checked against Kafka's own code in tests/coordinator/test_group_metadata_hash.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kbroker.coordinator.group_metadata_hash import group_hash, topic_hash
from kbroker.protocol.messages import MetadataRequest, ShareGroupDescribeRequest, ShareGroupHeartbeatRequest

from kbroker_tools.wire import WireClient
from tests.broker.share.group_configs import set_group_configs
from tests.broker_process import BrokerProcess
from tests.clients import wait_until
from tests.group_helpers import group_epoch_records

T = 30


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        {
            "group.share.heartbeat.interval.ms": "500",
            "group.share.min.heartbeat.interval.ms": "100",
            "offsets.topic.num.partitions": "1",
            "share.coordinator.state.topic.num.partitions": "1",
        },
    )
    b.start()
    yield b
    b.stop()


def produce(bootstrap: str, topic: str, values: dict[int, list[str]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for partition, vs in values.items():
        for v in vs:
            p.produce(topic, v.encode(), partition=partition)
    p.flush(T)


def poll_until(c: ShareConsumer, got: list[tuple[int, str]], want: set[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not want <= {v for _, v in got} and time.monotonic() < deadline:
        got += [(m.partition(), m.value().decode()) for m in c.poll(0.5) if m.error() is None]


def describe(bootstrap: str, group: str) -> Any:
    with WireClient(bootstrap) as w:
        return w.request(77, 1, ShareGroupDescribeRequest(group_ids=[group])).groups[0]


def topic_id(bootstrap: str, topic: str) -> bytes:
    with WireClient(bootstrap) as w:
        md = w.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]))
    return bytes(md.topics[0].topic_id)


def test_added_partitions_reach_the_share_consumer(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    set_group_configs(admin, group, {"share.auto.offset.reset": "earliest"})
    produce(broker.bootstrap, topic_name, {0: ["a0", "a1"]})
    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    c.subscribe([topic_name])
    got: list[tuple[int, str]] = []
    try:
        poll_until(c, got, {"a0", "a1"})
        assert sorted(got) == [(0, "a0"), (0, "a1")]
        before = describe(broker.bootstrap, group)
        tid = topic_id(broker.bootstrap, topic_name)

        admin.create_partitions([NewPartitions(topic_name, 3)])[topic_name].result(T)
        # the member is given the new partitions on a heartbeat (the group epoch moves on), then reads them
        wait_until(
            lambda: (
                sorted(
                    p
                    for t in describe(broker.bootstrap, group).members[0].assignment.topic_partitions
                    for p in t.partitions
                )
                == [0, 1, 2]
            ),
            timeout=T,
            interval=0.3,
            what="the new partitions assigned",
        )
        produce(broker.bootstrap, topic_name, {0: ["b0"], 1: ["b1"], 2: ["b2"]})
        poll_until(c, got, {"b0", "b1", "b2"})
    finally:
        c.close()
    assert sorted(got) == [(0, "a0"), (0, "a1"), (0, "b0"), (1, "b1"), (2, "b2")]
    after = describe(broker.bootstrap, group)
    assert after.group_epoch > before.group_epoch
    records = group_epoch_records(broker.bootstrap, group)
    one = group_hash({topic_name: topic_hash(tid, topic_name, [[]])})
    three = group_hash({topic_name: topic_hash(tid, topic_name, [[], [], []])})
    hashes = [h for _, h in records]
    # epochs only go up; every record carries the hash of the topic as it was: one partition, then three
    assert [e for e, _ in records] == sorted(e for e, _ in records)
    assert one in hashes and three in hashes
    assert hashes.index(one) < hashes.index(three) and set(hashes) <= {0, one, three}
    # the consumer left last: a group without members subscribes to nothing, whose hash is 0
    assert records[-1] == (after.group_epoch, 0)
    assert [h for h in hashes if h][-1] == three


def heartbeat(w: WireClient, group: str, member: str, epoch: int, topics: list[str] | None) -> Any:
    r = w.request(
        76,
        1,
        ShareGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=epoch, subscribed_topic_names=topics
        ),
    )
    assert r.error_code == 0, r
    return r


def test_a_topic_made_again_is_assigned_under_its_new_id(broker: BrokerProcess, topic_name: str) -> None:
    """Deleted, the topic leaves the assignment; made again (a new topic id, the same name), its share-partitions
    are initialized afresh and assigned, each change a new group epoch."""
    group = "g-" + topic_name
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(T)
    old = topic_id(broker.bootstrap, topic_name)
    member = str(uuid.uuid4())
    with WireClient(broker.bootstrap) as w:
        epoch = heartbeat(w, group, member, 0, [topic_name]).member_epoch

        def assignment() -> dict[bytes, list[int]]:
            nonlocal epoch
            r = heartbeat(w, group, member, epoch, None)
            epoch = r.member_epoch
            d = describe(broker.bootstrap, group)
            return {bytes(t.topic_id): sorted(t.partitions) for t in d.members[0].assignment.topic_partitions}

        wait_until(
            lambda: assignment() == {old: [0, 1]}, timeout=T, interval=0.3, what="the first assignment"
        )
        first = describe(broker.bootstrap, group).group_epoch
        admin.delete_topics([topic_name])[topic_name].result(T)
        wait_until(lambda: assignment() == {}, timeout=T, interval=0.3, what="the deleted topic unassigned")
        gone = describe(broker.bootstrap, group).group_epoch
        assert gone > first
        wait_until(
            lambda: _created(admin, topic_name, 3),
            timeout=T,
            interval=0.5,
            what="the topic made again (deletion finished)",
        )
        new = topic_id(broker.bootstrap, topic_name)
        assert new != old
        wait_until(
            lambda: assignment() == {new: [0, 1, 2]}, timeout=T, interval=0.3, what="the new topic assigned"
        )
        assert describe(broker.bootstrap, group).group_epoch > gone
    records = group_epoch_records(broker.bootstrap, group)
    assert records[-1][1] == group_hash({topic_name: topic_hash(new, topic_name, [[], [], []])})
    assert (first, group_hash({topic_name: topic_hash(old, topic_name, [[], []])})) in records
    assert (gone, 0) in records  # no subscribed topic exists: Kafka's hash of no topics


def _created(admin: AdminClient, topic: str, partitions: int) -> bool:
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(T)
        return True
    except KafkaException as e:  # the old topic still being deleted: try again
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
        return False

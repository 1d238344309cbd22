"""Share groups across three brokers on ZooKeeper: a ShareGroupHeartbeat reaching a broker that does not lead the
group's __consumer_offsets partition (or has not heard of the topic) answers NOT_COORDINATOR; the group moves
with its __consumer_offsets partition (a controlled shutdown) and a confluent-kafka ShareConsumer carries on as
the same member; DeleteShareGroupOffsets and AlterShareGroupOffsets on the group coordinator reach the
share-partition on another broker (its state epoch), so the next consumer reads by the new state there."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsRequest,
    ShareGroupDescribeRequest,
    ShareGroupHeartbeatRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker.share.test_share_sessions import acquired, share_fetch
from tests.broker.share.test_share_state_cluster import cluster, leader_of  # noqa: F401 - the fixture
from tests.broker_process import BrokerProcess
from tests.clients import wait_until

T = 30


def heartbeat_error(bootstrap: str, group: str, topic: str) -> int:
    with WireClient(bootstrap) as w:
        r = w.request(
            76,
            1,
            ShareGroupHeartbeatRequest(
                group_id=group, member_id=str(uuid.uuid4()), member_epoch=0, subscribed_topic_names=[topic]
            ),
        )
    return int(r.error_code)


def describe(bootstrap: str, group: str) -> object:
    with WireClient(bootstrap) as w:
        return w.request(77, 1, ShareGroupDescribeRequest(group_ids=[group])).groups[0]


def poll(c: ShareConsumer, want: int, timeout: float = T) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += [m.value().decode() for m in c.poll(0.5) if m.error() is None]
    return got


def test_group_moves_and_offsets_reach_other_brokers(
    cluster: dict[int, BrokerProcess],  # noqa: F811 - the fixture
    topic_name: str,
) -> None:
    b1, b2, b3 = cluster[1], cluster[2], cluster[3]
    group = "g-" + topic_name
    # no broker has heard of __consumer_offsets: none takes itself for the group's coordinator
    assert {b: heartbeat_error(cluster[b].bootstrap, group, topic_name) for b in cluster} == {
        b: ErrorCode.NOT_COORDINATOR for b in cluster
    }
    admin = AdminClient({"bootstrap.servers": b3.bootstrap})
    # the group on broker 1 then 2; the state on broker 2; the share-partition on broker 3 throughout
    made = admin.create_topics(
        [
            NewTopic(
                "__consumer_offsets",
                num_partitions=1,
                replica_assignment=[[1, 2]],
                config={"cleanup.policy": "compact"},
            ),
            NewTopic(
                "__share_group_state",
                num_partitions=1,
                replica_assignment=[[2]],
                config={"cleanup.policy": "compact"},
            ),
            NewTopic(topic_name, num_partitions=1, replica_assignment=[[3]]),
        ]
    )
    for f in made.values():
        f.result(T)
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in {
                "share.auto.offset.reset": "earliest",
                "share.heartbeat.interval.ms": "500",
                "share.session.timeout.ms": "6000",
            }.items()
        ],
    )
    admin.incremental_alter_configs([res])[res].result(T)
    wait_until(lambda: leader_of(b1.bootstrap, "__consumer_offsets") == 1, timeout=T, what="broker 1 leads")
    # a follower of the group's partition, and a broker with no replica of it, are not its coordinator
    assert heartbeat_error(b2.bootstrap, group, topic_name) == ErrorCode.NOT_COORDINATOR
    assert heartbeat_error(b3.bootstrap, group, topic_name) == ErrorCode.NOT_COORDINATOR
    p = Producer({"bootstrap.servers": b3.bootstrap, "acks": "all"})
    for i in range(5):
        p.produce(topic_name, f"v{i}".encode())
    assert p.flush(T) == 0

    c = ShareConsumer({"bootstrap.servers": b3.bootstrap, "group.id": group})
    try:
        c.subscribe([topic_name])
        assert sorted(poll(c, 5)) == [f"v{i}" for i in range(5)]
        c.commit_sync()
        before = describe(b1.bootstrap, group)
        assert before.error_code == 0 and len(before.members) == 1
        b1.stop()  # controlled shutdown: broker 2 leads __consumer_offsets and loads the group from it
        after = wait_until(
            lambda: (d := describe(b2.bootstrap, group)).error_code == 0 and d, timeout=T, what="moved"
        )
        assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
        assert [(m.member_id, m.member_epoch) for m in after.members] == [
            (m.member_id, m.member_epoch) for m in before.members
        ]
        for i in range(5, 8):
            p.produce(topic_name, f"v{i}".encode())
        assert p.flush(T) == 0
        assert sorted(poll(c, 3)) == [f"v{i}" for i in range(5, 8)]
        c.commit_sync()
        # past the 6 s session counted from the load: only its heartbeats to broker 2 keep it
        poll(c, 1 << 30, 7)
        # the same member, at the same epoch: it never had to join again
        still = describe(b2.bootstrap, group)
        assert [(m.member_id, m.member_epoch) for m in still.members] == [
            (m.member_id, m.member_epoch) for m in before.members
        ]
    finally:
        c.close()
    wait_until(lambda: describe(b2.bootstrap, group).members == [], timeout=T, what="the consumer left")

    with WireClient(b2.bootstrap) as w:
        D = DeleteShareGroupOffsetsRequest
        deleted = w.request(
            92, 0, D(group_id=group, topics=[D.DeleteShareGroupOffsetsRequestTopic(topic_name=topic_name)])
        )
        assert (deleted.error_code, deleted.responses[0].error_code) == (0, 0)
    topic_id = bytes(
        next(t.topic_id for t in describe_topics(b3.bootstrap, topic_name) if t.name == topic_name)
    )
    # broker 3's share-partition (start offset 8) learns that its state is gone: all 8 records again
    assert first_read(b2, b3, group, topic_name, topic_id, "after DeleteShareGroupOffsets") == [
        (o, 1) for o in range(8)
    ]
    assert alter(b2.bootstrap, group, topic_name, 6) == (0, [0])
    assert first_read(b2, b3, group, topic_name, topic_id, "after AlterShareGroupOffsets") == [(6, 1), (7, 1)]
    # -1 on the coordinator (broker 2) for a partition led by broker 3: Kafka's uninitialized start offset,
    # which broker 3 resolves by the group's share.auto.offset.reset (earliest) on its next read
    assert alter(b2.bootstrap, group, topic_name, -1) == (0, [0])
    assert alter(b2.bootstrap, group, topic_name, -2) == (0, [ErrorCode.INVALID_REQUEST])
    assert first_read(b2, b3, group, topic_name, topic_id, "after AlterShareGroupOffsets to -1") == [
        (o, 1) for o in range(8)
    ]
    # DeleteGroups on the group coordinator: broker 3's share-partition reads the (deleted) state again
    admin.delete_consumer_groups([group])[group].result(T)
    assert first_read(b2, b3, group, topic_name, topic_id, "after DeleteGroups") == [(o, 1) for o in range(8)]


def first_read(
    coordinator: BrokerProcess, leader: BrokerProcess, group: str, topic: str, topic_id: bytes, what: str
) -> list[tuple[int, int]]:
    """A new member (joined on the group coordinator) reads from the share-partition's leader: (offset, delivery
    count) of what it acquires first; it then closes its share session (releasing them) and leaves."""
    member = str(uuid.uuid4())
    join_at(coordinator.bootstrap, group, topic, member)
    with WireClient(leader.bootstrap) as w:
        got = wait_until(
            lambda: acquired(share_fetch(w, group, member, 0, topic_id, wait_ms=1000)) or None,
            timeout=T,
            what=f"records {what}",
        )
        share_fetch(w, group, member, -1, topic_id)
    leave(coordinator.bootstrap, group, member)
    return offsets(got)


def alter(bootstrap: str, group: str, topic: str, start: int) -> tuple[int, list[int]]:
    A = AlterShareGroupOffsetsRequest
    with WireClient(bootstrap) as w:
        r = w.request(
            91,
            0,
            A(
                group_id=group,
                topics=[
                    A.AlterShareGroupOffsetsRequestTopic(
                        topic_name=topic,
                        partitions=[
                            A.AlterShareGroupOffsetsRequestPartition(partition_index=0, start_offset=start)
                        ],
                    )
                ],
            ),
        )
    return int(r.error_code), [int(p.error_code) for p in r.responses[0].partitions]


def offsets(ranges: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """(offset, delivery count) of every acquired record."""
    return [(o, n) for first, last, n in ranges for o in range(first, last + 1)]


def describe_topics(bootstrap: str, topic: str) -> list[object]:
    from kbroker.protocol.messages import MetadataRequest

    with WireClient(bootstrap) as w:
        md = w.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]))
    return list(md.topics)


def join_at(bootstrap: str, group: str, topic: str, member: str) -> None:
    with WireClient(bootstrap) as w:
        r = w.request(
            76,
            1,
            ShareGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=0, subscribed_topic_names=[topic]
            ),
        )
    assert r.error_code == 0, r


def leave(bootstrap: str, group: str, member: str) -> None:
    with WireClient(bootstrap) as w:
        r = w.request(76, 1, ShareGroupHeartbeatRequest(group_id=group, member_id=member, member_epoch=-1))
    assert r.error_code == 0, r

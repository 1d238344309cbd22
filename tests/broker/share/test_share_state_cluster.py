"""A share-partition's new leader without a replica of __share_group_state (three brokers on ZooKeeper, the state
on the third alone) reads the saved state from the share coordinator with ReadShareGroupState and resumes from it
after a leadership change: acknowledged records stay done, held ones come back counting their delivery."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    DescribeShareGroupOffsetsRequest,
    FindCoordinatorRequest,
    MetadataRequest,
    ShareGroupHeartbeatRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker.share.group_configs import EARLIEST_LONG_LOCKS, set_group_configs
from tests.broker.share.test_share_sessions import ACCEPT, acquired, share_fetch
from tests.broker.share.test_share_state_rpcs import read
from tests.broker_process import BrokerProcess, wait_all_registered
from tests.clients import wait_until
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

T = 30


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[int, BrokerProcess]]:
    reason = zookeeper_missing()
    if reason is not None:
        pytest.skip(reason)
    zk = ZooKeeperServer(tmp_path / "zk").start()
    common = {
        "zookeeper.connect": zk.connect,
        "offsets.topic.num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "share.coordinator.state.topic.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "controlled.shutdown.retry.backoff.ms": "200",
        "group.share.min.heartbeat.interval.ms": "100",
        "group.share.min.session.timeout.ms": "1000",
    }
    bs = {b: BrokerProcess(tmp_path / f"b{b}", {**common, "broker.id": str(b)}) for b in (1, 2, 3)}
    try:
        for b in (3, 2, 1):  # broker 3 is the controller: broker 1, stopped, is not
            bs[b].start()
        wait_all_registered(list(bs.values()), timeout=T)
        yield bs
    finally:
        for b in bs.values():
            b.stop()
        zk.stop()


def leader_of(bootstrap: str, topic: str) -> int:
    with WireClient(bootstrap) as w:
        md = w.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]))
    parts = md.topics[0].partitions
    return int(parts[0].leader_id) if parts else -1  # the topic not known to this broker yet


def joined(cluster: dict[int, BrokerProcess], group: str, topic: str) -> str | None:
    """The member id, once the group's coordinator (__consumer_offsets made on first FindCoordinator) answers."""
    with WireClient(cluster[3].bootstrap) as w:
        fc = w.request(10, 4, FindCoordinatorRequest(key_type=0, coordinator_keys=[group]))
    node = fc.coordinators[0].node_id
    if fc.coordinators[0].error_code or node not in cluster:
        return None
    member = str(uuid.uuid4())
    with WireClient(cluster[node].bootstrap) as w:
        r = w.request(
            76,
            1,
            ShareGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=0, subscribed_topic_names=[topic]
            ),
        )
    return member if r.error_code == 0 else None


def test_new_leader_without_a_state_replica_resumes(
    cluster: dict[int, BrokerProcess], topic_name: str
) -> None:
    b1, b2, b3 = cluster[1], cluster[2], cluster[3]
    admin = AdminClient({"bootstrap.servers": b3.bootstrap})
    # the state on broker 3 alone, the share-partition led by 1 then 2: neither has a replica of the state
    made = admin.create_topics(
        [
            NewTopic(
                "__share_group_state",
                num_partitions=1,
                replica_assignment=[[3]],
                config={"cleanup.policy": "compact"},
            ),
            NewTopic(topic_name, num_partitions=1, replica_assignment=[[1, 2]]),
        ]
    )
    for f in made.values():
        f.result(T)
    group = "g-" + topic_name
    set_group_configs(admin, group, EARLIEST_LONG_LOCKS, T)
    p = Producer({"bootstrap.servers": b1.bootstrap, "acks": "all"})
    for i in range(10):
        p.produce(topic_name, f"v{i}".encode(), partition=0)
    assert p.flush(T) == 0
    with WireClient(b1.bootstrap) as w:
        md = w.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic_name)]))
        topic_id = bytes(md.topics[0].topic_id)
    member = wait_until(lambda: joined(cluster, group, topic_name), timeout=T, what="a member joined")
    with WireClient(b1.bootstrap) as w:
        first = share_fetch(w, group, member, 0, topic_id, wait_ms=10_000)
        assert acquired(first) == [(0, 9, 1)]
        # accepted, written to broker 3 (WriteShareGroupState) before the answer; 5..9 stay held
        done = share_fetch(w, group, member, 1, topic_id, acks=[(0, 4, ACCEPT)])
        assert [p.acknowledge_error_code for t in done.responses for p in t.partitions] == [0]
    b1.stop()  # controlled shutdown: broker 2 leads the partition
    wait_until(lambda: leader_of(b2.bootstrap, topic_name) == 2, timeout=T, what="broker 2 leads")
    with WireClient(b2.bootstrap) as w:
        # broker 2 is not the share coordinator of the state
        assert read(w, group, topic_id, 0, 5).error_code == ErrorCode.NOT_COORDINATOR
        # DescribeShareGroupOffsets on broker 2 asks broker 3 with ReadShareGroupStateSummary
        D = DescribeShareGroupOffsetsRequest
        described = w.request(
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
        p0 = described.groups[0].topics[0].partitions[0]
        assert (p0.error_code, p0.start_offset, p0.lag) == (0, 5, 5)
        again = share_fetch(w, group, member, 0, topic_id, wait_ms=10_000)
        assert acquired(again) == [(5, 9, 2)]
    with WireClient(b3.bootstrap) as w:
        # broker 2's read carried its leader epoch: the former leader's epoch is fenced now
        assert read(w, group, topic_id, 0, 0).error_code == ErrorCode.FENCED_LEADER_EPOCH

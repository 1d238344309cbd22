"""A share-partition whose state write fails takes the acknowledgement back, as Kafka's SharePartition rolls back
the state transitions of a failed persister write: three brokers on ZooKeeper, the share-partition led by broker 1,
its state on broker 2 alone. Broker 2 killed, an acknowledgement cannot be written: it is answered
COORDINATOR_NOT_AVAILABLE (after the persister's retries) and the records are the member's again, under the locks
they had. Broker 2 back, the records come back to the group once those locks expire (a second delivery) and their
acknowledgement is written then: nothing is lost, nothing acknowledged twice, and the saved state ends at
the end of the log."""

from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    MetadataRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker.share.group_configs import set_group_configs
from tests.broker.share.test_share_sessions import ACCEPT, ack_errors, acquired, share_fetch
from tests.broker.share.test_share_state_cluster import cluster, joined, leader_of  # noqa: F401 - cluster: a fixture
from tests.broker_process import BrokerProcess
from tests.clients import wait_until
from tests.group_helpers import share_group_offsets

T = 30
# long enough for the cluster to see broker 2 gone before the held records' locks expire
LOCK_MS = 15000


def offsets(bootstrap: str, group: str, topic: str) -> tuple[int, int, int]:
    """DescribeShareGroupOffsets of partition 0: (error, start offset, lag)."""
    return share_group_offsets(bootstrap, group, topic, [0])[0]


def test_a_failed_state_write_rolls_the_acknowledgement_back(
    cluster: dict[int, BrokerProcess],  # noqa: F811 - the fixture imported above
    topic_name: str,
) -> None:
    b1, b2, b3 = cluster[1], cluster[2], cluster[3]
    admin = AdminClient({"bootstrap.servers": b3.bootstrap})
    made = admin.create_topics(
        [
            NewTopic(
                "__share_group_state",
                num_partitions=1,
                replica_assignment=[[2]],
                config={"cleanup.policy": "compact"},
            ),
            NewTopic(topic_name, num_partitions=1, replica_assignment=[[1]]),
        ]
    )
    for f in made.values():
        f.result(T)
    group = "g-" + topic_name
    set_group_configs(
        admin,
        group,
        {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": str(LOCK_MS)},
        T,
    )
    p = Producer({"bootstrap.servers": b1.bootstrap, "acks": "all"})
    for i in range(10):
        p.produce(topic_name, f"v{i}".encode(), partition=0)
    assert p.flush(T) == 0
    with WireClient(b1.bootstrap) as w:
        md = w.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic_name)]))
        topic_id = bytes(md.topics[0].topic_id)
    member = wait_until(lambda: joined(cluster, group, topic_name), timeout=T, what="a member joined")
    # the failed write is retried for about 15 s before the acknowledgement is answered
    with WireClient(b1.bootstrap, timeout=60) as w:
        assert acquired(share_fetch(w, group, member, 0, topic_id, wait_ms=10_000)) == [(0, 9, 1)]
        # 0..4 accepted and written to broker 2 (WriteShareGroupState) before the answer
        assert ack_errors(share_fetch(w, group, member, 1, topic_id, acks=[(0, 4, ACCEPT)])) == [0]
        assert offsets(b1.bootstrap, group, topic_name)[:2] == (0, 5)

        b2.kill()
        wait_until(
            lambda: leader_of(b3.bootstrap, "__share_group_state") == -1, timeout=T, what="no state leader"
        )
        # 5..9 accepted: the write cannot reach a share coordinator; Kafka's SharePartition answers the
        # persister's error as COORDINATOR_NOT_AVAILABLE and takes the acknowledgement back
        r = share_fetch(w, group, member, 2, topic_id, acks=[(5, 9, ACCEPT)])
        assert ack_errors(r) == [ErrorCode.COORDINATOR_NOT_AVAILABLE]
        assert acquired(r) == []  # nothing else to deliver: 5..9 are still held by the member

        b2.restart()
        wait_until(
            lambda: leader_of(b3.bootstrap, "__share_group_state") == 2, timeout=T, what="broker 2 leads"
        )
        # the locks taken at the first fetch have expired: 5..9 come back (a second delivery), 0..4 never do
        again = share_fetch(w, group, member, 3, topic_id, wait_ms=LOCK_MS + 10_000)
        assert acquired(again) == [(5, 9, 2)]
        assert ack_errors(share_fetch(w, group, member, 4, topic_id, acks=[(5, 9, ACCEPT)])) == [0]
        assert acquired(share_fetch(w, group, member, 5, topic_id, wait_ms=2000)) == []
    # the saved state, read from broker 2 through broker 1: everything done, once
    assert offsets(b1.bootstrap, group, topic_name) == (0, 10, 0)
    assert "Could not write the state of share-partition" in b1.read_log()

"""ReadShareGroupState (84), WriteShareGroupState (85), DeleteShareGroupState (86) and ReadShareGroupStateSummary
(87) over the wire, as a share-partition leader or group coordinator on another broker sends them: a round trip
write -> read -> summary -> delete, a never-written share-partition, and Kafka's errors; DeleteGroups of a share
group deleting its share-partitions' state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    ApiVersionsRequest,
    DeleteShareGroupStateRequest,
    ReadShareGroupStateRequest,
    ReadShareGroupStateSummaryRequest,
    ShareGroupHeartbeatRequest,
    WriteShareGroupStateRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker.share.test_share_sessions import ACCEPT, ack_errors, acquired, join, setup, share_fetch
from tests.broker_process import BrokerProcess

Q = ReadShareGroupStateRequest
W = WriteShareGroupStateRequest


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        {"offsets.topic.num.partitions": "1", "share.coordinator.state.topic.num.partitions": "2"},
    )
    b.start()
    yield b
    b.stop()


def read(w: WireClient, group: str, topic_id: bytes, partition: int, leader_epoch: int) -> object:
    r = w.request(
        84,
        0,
        Q(
            group_id=group,
            topics=[
                Q.ReadStateData(
                    topic_id=topic_id,
                    partitions=[Q.PartitionData(partition=partition, leader_epoch=leader_epoch)],
                )
            ],
        ),
    )
    assert r.results[0].topic_id == topic_id
    return r.results[0].partitions[0]


def write(w: WireClient, group: str, topic_id: bytes, start: int, leader_epoch: int) -> int:
    r = w.request(
        85,
        0,
        W(
            group_id=group,
            topics=[
                W.WriteStateData(
                    topic_id=topic_id,
                    partitions=[
                        W.PartitionData(
                            partition=0,
                            state_epoch=0,
                            leader_epoch=leader_epoch,
                            start_offset=start,
                            state_batches=[
                                W.StateBatch(
                                    first_offset=3, last_offset=4, delivery_state=0, delivery_count=2
                                ),
                                W.StateBatch(
                                    first_offset=6, last_offset=6, delivery_state=4, delivery_count=5
                                ),
                            ],
                        )
                    ],
                )
            ],
        ),
    )
    return int(r.results[0].partitions[0].error_code)


def summary_of(w: WireClient, group: str, topic_id: bytes) -> tuple[int, int, int]:
    """(error, start offset, delivery complete count) of partition 0's saved state: a plain read, fencing
    nobody."""
    S = ReadShareGroupStateSummaryRequest
    p = (
        w.request(
            87,
            1,
            S(
                group_id=group,
                topics=[S.ReadStateSummaryData(topic_id=topic_id, partitions=[S.PartitionData(partition=0)])],
            ),
        )
        .results[0]
        .partitions[0]
    )
    return p.error_code, p.start_offset, p.delivery_complete_count


def test_write_then_read_and_errors(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    topic_id = setup(broker, topic_name, group, 3)
    with WireClient(broker.bootstrap) as w:
        versions = {
            k.api_key: (k.min_version, k.max_version) for k in w.request(18, 3, ApiVersionsRequest()).api_keys
        }
        assert (versions[84], versions[85], versions[87]) == ((0, 0), (0, 0), (0, 1))
        assert versions[86] == (0, 0) and 83 not in versions
        # a share consumer's first fetch makes __share_group_state
        member = join(w, group, topic_name)
        first = share_fetch(w, group, member, 0, topic_id, wait_ms=5000)
        assert (
            sum(a.last_offset - a.first_offset + 1 for a in first.responses[0].partitions[0].acquired_records)
            == 3
        )
        other = group + "-other"
        never = read(w, other, topic_id, 0, 0)
        assert (never.error_code, never.start_offset, never.state_batches) == (0, -1, [])
        assert write(w, other, topic_id, 3, 2) == 0
        got = read(w, other, topic_id, 0, 2)
        assert (got.error_code, got.start_offset) == (0, 3)
        assert [
            (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in got.state_batches
        ] == [
            (3, 4, 0, 2),
            (6, 6, 4, 5),
        ]
        # a read by a newer leader of the share-partition fences the former one, for reads and writes alike
        assert read(w, other, topic_id, 0, 3).error_code == 0
        assert read(w, other, topic_id, 0, 2).error_code == ErrorCode.FENCED_LEADER_EPOCH
        assert write(w, other, topic_id, 5, 2) == ErrorCode.FENCED_LEADER_EPOCH
        S = ReadShareGroupStateSummaryRequest
        summary = (
            w.request(
                87,
                1,
                S(
                    group_id=other,
                    topics=[
                        S.ReadStateSummaryData(topic_id=topic_id, partitions=[S.PartitionData(partition=0)])
                    ],
                ),
            )
            .results[0]
            .partitions[0]
        )
        assert (
            summary.error_code,
            summary.start_offset,
            summary.leader_epoch,
            summary.delivery_complete_count,
        ) == (
            0,
            3,
            3,
            1,
        )
        X = DeleteShareGroupStateRequest
        for _ in range(2):  # the second deletes nothing, without error
            deleted = w.request(
                86,
                0,
                X(
                    group_id=other,
                    topics=[X.DeleteStateData(topic_id=topic_id, partitions=[X.PartitionData(partition=0)])],
                ),
            )
            assert deleted.results[0].partitions[0].error_code == 0
        gone = read(w, other, topic_id, 0, 3)
        assert (gone.error_code, gone.start_offset, gone.state_batches) == (0, -1, [])
        assert read(w, other, bytes(16), 0, 0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert read(w, other, topic_id, 7, 0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert read(w, other, topic_id, -1, 0).error_code == ErrorCode.INVALID_REQUEST


def test_delete_groups_deletes_the_share_state(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    topic_id = setup(broker, topic_name, group, 5)
    with WireClient(broker.bootstrap) as w:
        member = join(w, group, topic_name)
        assert acquired(share_fetch(w, group, member, 0, topic_id, wait_ms=5000)) == [(0, 4, 1)]
        assert ack_errors(share_fetch(w, group, member, 1, topic_id, acks=[(0, 2, ACCEPT)])) == [0]
        # 0..2 accepted and written; 3..4 held
        assert summary_of(w, group, topic_id) == (0, 3, 0)
        left = w.request(76, 1, ShareGroupHeartbeatRequest(group_id=group, member_id=member, member_epoch=-1))
        assert left.error_code == 0
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_consumer_groups([group])[group].result(30)
    with WireClient(broker.bootstrap) as w:
        # tombstoned in __share_group_state: nothing saved for the share-partition any more
        assert summary_of(w, group, topic_id) == (0, -1, -1)
        gone = read(w, group, topic_id, 0, 0)
        assert (gone.error_code, gone.start_offset, gone.state_batches) == (0, -1, [])
        # a new group of the same name starts by share.auto.offset.reset (earliest): every record, first delivery
        again = join(w, group, topic_name)
        assert acquired(share_fetch(w, group, again, 0, topic_id, wait_ms=5000)) == [(0, 4, 1)]

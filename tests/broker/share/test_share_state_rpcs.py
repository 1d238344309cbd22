"""InitializeShareGroupState (83), ReadShareGroupState (84), WriteShareGroupState (85), DeleteShareGroupState (86)
and ReadShareGroupStateSummary (87) over the wire, as a share-partition leader or group coordinator on another
broker sends them: a round trip write -> read -> summary -> delete, a never-written share-partition, state epochs
(initialize, fenced writes) and Kafka's errors; a heartbeat initializing the share-partitions it assigns;
DeleteGroups of a share group deleting its share-partitions' state."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
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
    ApiVersionsRequest,
    DeleteShareGroupStateRequest,
    InitializeShareGroupStateRequest,
    ReadShareGroupStateRequest,
    ReadShareGroupStateSummaryRequest,
    ShareGroupDescribeRequest,
    ShareGroupHeartbeatRequest,
    WriteShareGroupStateRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker.share.test_share_sessions import ACCEPT, ack_errors, acquired, join, setup, share_fetch
from tests.broker_process import BrokerProcess
from tests.clients import RawClient

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


def initialize(
    w: WireClient, group: str, topic_id: bytes, partition: int, state_epoch: int, start: int
) -> int:
    I = InitializeShareGroupStateRequest  # noqa: E741 - Kafka's message, named like Q and W
    r = w.request(
        83,
        0,
        I(
            group_id=group,
            topics=[
                I.InitializeStateData(
                    topic_id=topic_id,
                    partitions=[
                        I.PartitionData(partition=partition, state_epoch=state_epoch, start_offset=start)
                    ],
                )
            ],
        ),
    )
    assert r.results[0].topic_id == topic_id
    return int(r.results[0].partitions[0].error_code)


def delete(w: WireClient, group: str, topic_id: bytes) -> int:
    X = DeleteShareGroupStateRequest
    r = w.request(
        86,
        0,
        X(
            group_id=group,
            topics=[X.DeleteStateData(topic_id=topic_id, partitions=[X.PartitionData(partition=0)])],
        ),
    )
    return int(r.results[0].partitions[0].error_code)


def write(
    w: WireClient, group: str, topic_id: bytes, start: int, leader_epoch: int, state_epoch: int = 0
) -> int:
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
                            state_epoch=state_epoch,
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
        assert versions[83] == versions[86] == (0, 0)
        # a share consumer's first fetch makes __share_group_state
        member = join(w, group, topic_name)
        first = share_fetch(w, group, member, 0, topic_id, wait_ms=5000)
        assert (
            sum(a.last_offset - a.first_offset + 1 for a in first.responses[0].partitions[0].acquired_records)
            == 3
        )
        other = group + "-other"
        # nobody initialized it: Kafka's share coordinator refuses reads and writes alike
        never = read(w, other, topic_id, 0, 0)
        assert (never.error_code, never.error_message, never.state_epoch, never.start_offset) == (
            ErrorCode.INVALID_REQUEST,
            "Read operation on uninitialized share partition not allowed.",
            0,
            0,
        )
        assert write(w, other, topic_id, 3, 2) == ErrorCode.INVALID_REQUEST
        assert initialize(w, other, topic_id, 0, 0, -1) == 0
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
        assert (gone.error_code, gone.start_offset, gone.state_batches) == (ErrorCode.INVALID_REQUEST, 0, [])
        assert write(w, other, topic_id, 3, 3) == ErrorCode.INVALID_REQUEST
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
        assert (gone.error_code, gone.start_offset, gone.state_batches) == (ErrorCode.INVALID_REQUEST, 0, [])
        # a new group of the same name starts by share.auto.offset.reset (earliest): every record, first delivery
        again = join(w, group, topic_name)
        assert acquired(share_fetch(w, group, again, 0, topic_id, wait_ms=5000)) == [(0, 4, 1)]


def test_initialize_sets_the_state_epoch(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    topic_id = setup(broker, topic_name, group, 3)
    with WireClient(broker.bootstrap) as w:
        # the heartbeat that first assigns the topic has its share-partitions initialized (state epoch = the
        # group epoch, no start offset yet: the leader applies share.auto.offset.reset on its first read)
        member = join(w, group, topic_name)
        first = read(w, group, topic_id, 0, 0)
        assert (first.error_code, first.state_epoch, first.start_offset, first.state_batches) == (
            0,
            1,
            -1,
            [],
        )
        assert acquired(share_fetch(w, group, member, 0, topic_id, wait_ms=5000)) == [(0, 2, 1)]
        assert ack_errors(share_fetch(w, group, member, 1, topic_id, acks=[(0, 2, ACCEPT)])) == [0]
        done = read(w, group, topic_id, 0, 0)
        assert (done.state_epoch, done.start_offset) == (1, 3)

        other = group + "-raw"
        assert initialize(w, other, topic_id, 0, 3, 5) == 0
        got = read(w, other, topic_id, 0, 0)
        assert (got.error_code, got.state_epoch, got.start_offset, got.state_batches) == (0, 3, 5, [])
        # a writer that read an older state epoch is fenced; one at the current epoch writes
        assert write(w, other, topic_id, 6, 0, state_epoch=2) == ErrorCode.FENCED_STATE_EPOCH
        assert write(w, other, topic_id, 6, 0, state_epoch=3) == 0
        assert initialize(w, other, topic_id, 0, 2, 0) == ErrorCode.FENCED_STATE_EPOCH
        # initialized again without a start offset: the state and its epoch stay (a group coordinator retrying)
        assert initialize(w, other, topic_id, 0, 4, -1) == 0
        kept = read(w, other, topic_id, 0, 0)
        assert (kept.state_epoch, kept.start_offset, len(kept.state_batches)) == (3, 6, 2)
        # a start offset resets it (AlterShareGroupOffsets)
        assert initialize(w, other, topic_id, 0, 5, 1) == 0
        reset = read(w, other, topic_id, 0, 0)
        assert (reset.state_epoch, reset.start_offset, reset.state_batches) == (5, 1, [])
        # deleted: a writer holding the initialized state is refused (uninitialized), it must read again
        assert delete(w, other, topic_id) == 0
        assert write(w, other, topic_id, 6, 0, state_epoch=5) == ErrorCode.INVALID_REQUEST
        assert initialize(w, other, topic_id, -1, 1, 0) == ErrorCode.INVALID_REQUEST
        assert initialize(w, other, topic_id, 9, 1, 0) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert initialize(w, other, bytes(16), 0, 1, 0) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_initialize_over_raw_frames(broker: BrokerProcess, topic_name: str) -> None:
    """InitializeShareGroupState as raw frames: an empty group id is INVALID_REQUEST per partition, a truncated
    body closes the connection (Kafka's answer to a request it cannot parse) and the broker serves on."""
    group = "g-" + topic_name
    topic_id = setup(broker, topic_name, group, 1)
    I = InitializeShareGroupStateRequest  # noqa: E741 - Kafka's message, named like Q and W
    body = I(
        group_id="",
        topics=[
            I.InitializeStateData(topic_id=topic_id, partitions=[I.PartitionData(partition=0, state_epoch=1)])
        ],
    )
    with RawClient(broker.bootstrap) as raw:
        r = raw.request(83, 0, body)
        assert [(p.partition, p.error_code) for p in r.results[0].partitions] == [
            (0, ErrorCode.INVALID_REQUEST)
        ]
        whole = raw.frame(83, 0, I(group_id=group, topics=body.topics))
        cut = whole[4:-6]  # the partition's fields cut short
        raw.send_bytes(len(cut).to_bytes(4, "big") + cut)
        assert raw.closed_by_peer()
    with WireClient(broker.bootstrap) as w:
        assert initialize(w, group + "-after", topic_id, 0, 1, 0) == 0


def test_an_uninitialized_share_partition_is_not_served(broker: BrokerProcess, topic_name: str) -> None:
    """As Kafka's: the leader does not initialize a share-partition by itself. Its read is refused
    (INVALID_REQUEST), which the fetch answers as UNKNOWN_SERVER_ERROR for that partition, at once and writing
    nothing; once a member subscribes to it, the heartbeat initializes it and it is served."""
    group = "g-" + topic_name
    topic_id = setup(broker, topic_name, group, 3)
    setup(broker, topic_name + "-other", group, 1)
    with WireClient(broker.bootstrap) as w:
        member = join(w, group, topic_name + "-other")  # topic_name's share-partition stays uninitialized
        started = time.monotonic()
        r = share_fetch(w, group, member, 0, topic_id, wait_ms=5000)
        assert time.monotonic() - started < 4
        assert [(p.error_code, list(p.acquired_records)) for t in r.responses for p in t.partitions] == [
            (ErrorCode.UNKNOWN_SERVER_ERROR, [])
        ]
        assert read(w, group, topic_id, 0, 0).error_code == ErrorCode.INVALID_REQUEST
        share_fetch(w, group, member, -1, topic_id)
        subscriber = join(w, group, topic_name)
        assert read(w, group, topic_id, 0, 0).error_code == 0
        assert acquired(share_fetch(w, group, subscriber, 0, topic_id, wait_ms=5000)) == [(0, 2, 1)]


def test_describe_shows_the_assignment_each_member_was_given(broker: BrokerProcess, topic_name: str) -> None:
    """ShareGroupDescribe shows a member's current assignment, the one its last heartbeat answer gave it (Kafka's
    assignedPartitions), not its new target: until the member heartbeats again."""
    group = "g-" + topic_name
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 4, 1)])[topic_name].result(30)

    def beat(w: WireClient, member: str, epoch: int) -> tuple[int, list[int]]:
        r = w.request(
            76,
            1,
            ShareGroupHeartbeatRequest(
                group_id=group,
                member_id=member,
                member_epoch=epoch,
                subscribed_topic_names=[topic_name] if epoch == 0 else None,
            ),
        )
        assert r.error_code == 0, r
        got = [p for tp in r.assignment.topic_partitions for p in tp.partitions] if r.assignment else None
        return r.member_epoch, sorted(got) if got is not None else None

    def described(w: WireClient) -> dict[str, tuple[int, list[int]]]:
        g = w.request(77, 1, ShareGroupDescribeRequest(group_ids=[group])).groups[0]
        assert g.error_code == 0
        return {
            m.member_id: (
                m.member_epoch,
                sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions),
            )
            for m in g.members
        }

    with WireClient(broker.bootstrap) as w:
        a, b = "a-" + topic_name, "b-" + topic_name
        a_epoch, a_parts = beat(w, a, 0)
        assert a_parts == [0, 1, 2, 3]
        b_epoch, b_parts = beat(w, b, 0)
        assert b_parts and len(b_parts) < 4
        # a's target shrank with b's arrival, but a was not told yet: it still holds all four
        assert described(w) == {a: (a_epoch, [0, 1, 2, 3]), b: (b_epoch, b_parts)}
        a_epoch, a_parts = beat(w, a, a_epoch)
        assert a_parts is not None and not set(a_parts) & set(b_parts)
        assert described(w) == {a: (a_epoch, a_parts), b: (b_epoch, b_parts)}


def test_a_change_whose_records_are_not_written_is_rolled_back(
    broker: BrokerProcess, topic_name: str
) -> None:
    """As Kafka's coordinator runtime reverts to the last written offset: a heartbeat whose records
    __consumer_offsets refuses (here larger than its max.message.bytes) answers UNKNOWN_SERVER_ERROR (Kafka's
    mapping of RECORD_TOO_LARGE) and leaves the group as it was: no new subscription, no new member, same epoch."""
    group = "g-" + topic_name
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
    long_names = [topic_name + "-" + "x" * 200 + str(i) for i in range(20)]

    def beat(w: WireClient, member: str, epoch: int, topics: list[str]) -> tuple[int, int]:
        r = w.request(
            76,
            1,
            ShareGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=epoch, subscribed_topic_names=topics
            ),
        )
        return int(r.error_code), int(r.member_epoch)

    def described(w: WireClient) -> tuple[int, dict[str, list[str]]]:
        g = w.request(77, 1, ShareGroupDescribeRequest(group_ids=[group])).groups[0]
        assert g.error_code == 0
        return g.group_epoch, {m.member_id: sorted(m.subscribed_topic_names) for m in g.members}

    def offsets_topic_max_bytes(value: str | None) -> None:
        op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
        res = ConfigResource(
            ResourceType.TOPIC,
            "__consumer_offsets",
            incremental_configs=[ConfigEntry("max.message.bytes", value or "", incremental_operation=op)],
        )
        admin.incremental_alter_configs([res])[res].result(30)

    with WireClient(broker.bootstrap) as w:
        a = "a-" + topic_name
        code, epoch = beat(w, a, 0, [topic_name])
        assert code == 0
        before = described(w)
        assert before[1] == {a: [topic_name]}
        offsets_topic_max_bytes("1024")
        try:
            assert beat(w, a, epoch, [topic_name, *long_names])[0] == ErrorCode.UNKNOWN_SERVER_ERROR
            assert beat(w, "b-" + topic_name, 0, long_names)[0] == ErrorCode.UNKNOWN_SERVER_ERROR
            assert described(w) == before
        finally:
            offsets_topic_max_bytes(None)
        # written once __consumer_offsets takes the records: the same heartbeat applies
        assert beat(w, a, epoch, [topic_name, *long_names])[0] == 0
        after = described(w)
        assert after[0] > before[0] and after[1] == {a: sorted([topic_name, *long_names])}


def test_a_caller_without_cluster_action_is_refused_as_kafka(tmp_path: Path) -> None:
    """The five share-state RPCs from a principal without CLUSTER_ACTION on the cluster (ANONYMOUS, Kafka's ACL
    authorizer, no ACLs): Kafka 4.x's toGlobalErrorResponse, each partition of each topic in order,
    CLUSTER_AUTHORIZATION_FAILED with Errors' message and the other fields at the schema's defaults; nothing is
    read or written. Sent as WireClient's and RawClient's frames alike."""
    b = BrokerProcess(tmp_path, {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"})
    b.start()
    a, c = bytes(range(16)), bytes(range(1, 17))
    denied = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
    I, X, S = InitializeShareGroupStateRequest, DeleteShareGroupStateRequest, ReadShareGroupStateSummaryRequest  # noqa: E741
    requests = [
        (83, 0, I(group_id="g", topics=[I.InitializeStateData(topic_id=t, partitions=[
            I.PartitionData(partition=p, state_epoch=1) for p in ps]) for t, ps in ((a, [0, 2]), (c, [1]))])),
        (84, 0, Q(group_id="g", topics=[Q.ReadStateData(topic_id=t, partitions=[
            Q.PartitionData(partition=p, leader_epoch=3) for p in ps]) for t, ps in ((a, [0, 2]), (c, [1]))])),
        (85, 0, W(group_id="g", topics=[W.WriteStateData(topic_id=t, partitions=[
            W.PartitionData(partition=p, leader_epoch=3, start_offset=5, state_batches=[
                W.StateBatch(first_offset=5, last_offset=6, delivery_state=0, delivery_count=1)])
            for p in ps]) for t, ps in ((a, [0, 2]), (c, [1]))])),
        (86, 0, X(group_id="g", topics=[X.DeleteStateData(topic_id=t, partitions=[
            X.PartitionData(partition=p) for p in ps]) for t, ps in ((a, [0, 2]), (c, [1]))])),
        (87, 1, S(group_id="g", topics=[S.ReadStateSummaryData(topic_id=t, partitions=[
            S.PartitionData(partition=p, leader_epoch=3) for p in ps]) for t, ps in ((a, [0, 2]), (c, [1]))])),
    ]
    try:
        with WireClient(b.bootstrap) as w, RawClient(b.bootstrap) as raw:
            for key, version, body in requests:
                for r in (w.request(key, version, body), raw.request(key, version, body)):
                    assert [
                        (bytes(t.topic_id), [(p.partition, p.error_code, p.error_message) for p in t.partitions])
                        for t in r.results
                    ] == [(a, [(0, *denied), (2, *denied)]), (c, [(1, *denied)])], key
                    for p in (p for t in r.results for p in t.partitions):
                        if key == 84:
                            assert (p.state_epoch, p.start_offset, p.state_batches) == (0, 0, [])
                        if key == 87:
                            assert (p.state_epoch, p.leader_epoch, p.start_offset, p.delivery_complete_count) == (
                                0, 0, 0, -1)
        # nothing was made: no partition of the share-group state topic on disk
        assert not list((b.data_dir / "logs").glob("__share_group_state-*"))
    finally:
        b.stop()

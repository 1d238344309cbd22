"""More stateful sequences for the differential harness: a classic group committing and fetching offsets through
its life (generation and member checks, describe, list, delete), a transaction committing offsets with a producer
fenced by a newer epoch, a topic's life (create, add partitions, alter configs, delete) and a classic group's
rebalance and sync timeouts."""

from __future__ import annotations

import struct
import time
from typing import Any

from kbroker.protocol import records
from kbroker.protocol.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteGroupsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    EndTxnRequest,
    HeartbeatRequest,
    InitProducerIdRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    MetadataRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
    TxnOffsetCommitRequest,
)

from tests.differential.harness import Pair
from tests.differential.scenarios import PRODUCE, produce

OFFSET_COMMIT, OFFSET_FETCH, JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE_GROUPS, LIST_GROUPS = (
    8,
    9,
    11,
    12,
    13,
    14,
    15,
    16,
)
CREATE_TOPICS, DELETE_TOPICS, INIT_PID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN = 19, 20, 22, 24, 25, 26
TXN_OFFSET_COMMIT, DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE_PARTITIONS = 28, 32, 33, 37
DELETE_GROUPS, OFFSET_DELETE, METADATA = 42, 47, 3
GROUP, TXN, TOPIC = "diff-group-offsets", "diff-txn-offsets", "diff-life"


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0 (Kafka reads the group's subscribed topics from it)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def _commit(
    group: str, generation: int, member: str, offset: int, topic: str = "diff-b"
) -> OffsetCommitRequest:
    P = OffsetCommitRequest.OffsetCommitRequestPartition
    return OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member,
        topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(
                name=topic,
                partitions=[
                    P(partition_index=p, committed_offset=offset, committed_metadata="m") for p in (0, 1)
                ],
            )
        ],
    )


def _fetch_offsets(group: str, topic: str | None = "diff-b", stable: bool = False) -> OffsetFetchRequest:
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    topics = (
        None
        if topic is None
        else [OffsetFetchRequest.OffsetFetchRequestTopics(name=topic, partition_indexes=[0, 1, 2])]
    )
    return OffsetFetchRequest(groups=[G(group_id=group, topics=topics)], require_stable=stable)


def range_join(group: str, topic: str, member: str, rebalance_timeout_ms: int) -> JoinGroupRequest:
    """JoinGroup v7 of a classic consumer member subscribed to `topic` with the range assignor (10 s session)."""
    return JoinGroupRequest(
        group_id=group,
        session_timeout_ms=10000,
        rebalance_timeout_ms=rebalance_timeout_ms,
        member_id=member,
        protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=subscription(topic))],
    )


def group_offsets(pair: Pair) -> None:
    """A one-member classic group commits offsets with good and wrong generations and member ids, fetches them,
    is described and listed while Stable, refuses deleting its subscribed topic's offsets and itself, leaves, and is
    deleted once Empty."""

    def join(member: str) -> JoinGroupRequest:
        return range_join(GROUP, "diff-b", member, rebalance_timeout_ms=5000)

    first_ours, first_theirs, _ = pair.both(JOIN, 7, join(""))
    ours, theirs, _ = pair.each(JOIN, 7, join(first_ours.member_id), join(first_theirs.member_id))
    members, generations = (ours.member_id, theirs.member_id), (ours.generation_id, theirs.generation_id)
    A = SyncGroupRequest.SyncGroupRequestAssignment
    pair.each(
        SYNC,
        5,
        *(
            SyncGroupRequest(
                group_id=GROUP,
                generation_id=g,
                member_id=m,
                protocol_type="consumer",
                protocol_name="range",
                assignments=[A(member_id=m, assignment=b"\x00\x00")],
            )
            for m, g in zip(members, generations, strict=True)
        ),
    )
    pair.each(OFFSET_COMMIT, 8, *(_commit(GROUP, g, m, 5) for m, g in zip(members, generations, strict=True)))
    pair.each(
        OFFSET_COMMIT, 8, *(_commit(GROUP, g + 1, m, 6) for m, g in zip(members, generations, strict=True))
    )
    pair.both(OFFSET_COMMIT, 8, _commit(GROUP, generations[0], "not-a-member", 7))
    pair.both(OFFSET_COMMIT, 8, _commit(GROUP, -1, "", 8))  # a simple commit into a group with members
    pair.both(OFFSET_FETCH, 8, _fetch_offsets(GROUP))
    pair.both(OFFSET_FETCH, 8, _fetch_offsets(GROUP, topic=None))
    pair.both(DESCRIBE_GROUPS, 5, DescribeGroupsRequest(groups=[GROUP, "diff-no-group"]))
    pair.both(LIST_GROUPS, 4, ListGroupsRequest(states_filter=["Stable"]))
    D = OffsetDeleteRequest.OffsetDeleteRequestTopic
    offset_delete = OffsetDeleteRequest(
        group_id=GROUP,
        topics=[
            D(name="diff-b", partitions=[OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=0)])
        ],
    )
    pair.both(OFFSET_DELETE, 0, offset_delete)  # GROUP_SUBSCRIBED_TO_TOPIC
    pair.both(DELETE_GROUPS, 2, DeleteGroupsRequest(groups_names=[GROUP]))  # NON_EMPTY_GROUP
    pair.each(
        LEAVE,
        4,
        *(
            LeaveGroupRequest(group_id=GROUP, members=[LeaveGroupRequest.MemberIdentity(member_id=m)])
            for m in members
        ),
    )
    pair.both(DESCRIBE_GROUPS, 5, DescribeGroupsRequest(groups=[GROUP]))
    pair.both(OFFSET_DELETE, 0, offset_delete)  # Empty: deleted
    pair.both(OFFSET_FETCH, 8, _fetch_offsets(GROUP))
    pair.both(DELETE_GROUPS, 2, DeleteGroupsRequest(groups_names=[GROUP, GROUP + "-missing"]))
    pair.both(OFFSET_FETCH, 8, _fetch_offsets(GROUP, topic=None))


def _pid(resp: Any) -> tuple[int, int]:
    return (getattr(resp, "producer_id", -1), getattr(resp, "producer_epoch", -1))


def txn_offsets(pair: Pair) -> None:
    """A transaction commits a group's offsets (AddOffsetsToTxn, TxnOffsetCommit, read back as unstable, then
    committed); a second InitProducerId bumps the epoch and the old epoch is fenced."""
    init = InitProducerIdRequest(transactional_id=TXN, transaction_timeout_ms=60000)
    ours, theirs, _ = pair.both(INIT_PID, 4, init)
    sides = (_pid(ours), _pid(theirs))
    pair.each(
        ADD_OFFSETS,
        3,
        *(
            AddOffsetsToTxnRequest(
                transactional_id=TXN, producer_id=p, producer_epoch=e, group_id=GROUP + "-txn"
            )
            for p, e in sides
        ),
    )
    T = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    P = TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition
    pair.each(
        TXN_OFFSET_COMMIT,
        3,
        *(
            TxnOffsetCommitRequest(
                transactional_id=TXN,
                group_id=GROUP + "-txn",
                producer_id=p,
                producer_epoch=e,
                generation_id=-1,
                member_id="",
                topics=[
                    T(
                        name="diff-b",
                        partitions=[P(partition_index=1, committed_offset=11, committed_metadata="")],
                    )
                ],
            )
            for p, e in sides
        ),
    )
    pair.both(OFFSET_FETCH, 8, _fetch_offsets(GROUP + "-txn", stable=True))  # UNSTABLE_OFFSET_COMMIT
    pair.both(OFFSET_FETCH, 8, _fetch_offsets(GROUP + "-txn"))  # not yet visible
    pair.each(
        END_TXN,
        3,
        *(
            EndTxnRequest(transactional_id=TXN, producer_id=p, producer_epoch=e, committed=True)
            for p, e in sides
        ),
    )
    time.sleep(1.0)  # Kafka writes the markers after answering EndTxn
    pair.both(OFFSET_FETCH, 8, _fetch_offsets(GROUP + "-txn", stable=True))
    again = [
        InitProducerIdRequest(
            transactional_id=TXN, transaction_timeout_ms=60000, producer_id=p, producer_epoch=e
        )
        for p, e in sides
    ]
    pair.each(INIT_PID, 4, *again)  # the same producer bumps its epoch
    A = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
    pair.each(
        ADD_PARTITIONS,
        3,
        *(
            AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=TXN,
                v3_and_below_producer_id=p,
                v3_and_below_producer_epoch=e,
                v3_and_below_topics=[A(name="diff-a", partitions=[0])],
            )
            for p, e in sides
        ),
    )  # the old epoch: PRODUCER_FENCED (INVALID_PRODUCER_EPOCH before v2... v3 knows it)
    pair.each(INIT_PID, 4, *again)  # the old epoch again: PRODUCER_FENCED


def topic_life(pair: Pair) -> None:
    """A topic created with a config, grown by CreatePartitions, altered with AlterConfigs (which replaces every
    dynamic config), deleted, then produced to and described."""
    C = CreateTopicsRequest.CreatableTopic
    cfg = [CreateTopicsRequest.CreatableTopicConfig(name="retention.ms", value="600000")]
    create = CreateTopicsRequest(
        topics=[C(name=TOPIC, num_partitions=2, replication_factor=1, configs=cfg)], timeout_ms=10000
    )
    pair.both(CREATE_TOPICS, 7, create)
    pair.both(CREATE_TOPICS, 7, create)  # TOPIC_ALREADY_EXISTS
    P = CreatePartitionsRequest.CreatePartitionsTopic
    for count in (3, 2, 3):  # grow; fewer than it has; as many as it has
        pair.both(
            CREATE_PARTITIONS,
            3,
            CreatePartitionsRequest(
                topics=[P(name=TOPIC, count=count, assignments=None)], timeout_ms=10000, validate_only=False
            ),
        )
    R = AlterConfigsRequest.AlterConfigsResource
    V = AlterConfigsRequest.AlterableConfig
    for configs in ([V(name="cleanup.policy", value="compact")], [V(name="retention.ms", value="nope")]):
        pair.both(
            ALTER_CONFIGS,
            2,
            AlterConfigsRequest(
                resources=[R(resource_type=2, resource_name=TOPIC, configs=configs)], validate_only=False
            ),
        )
    D = DescribeConfigsRequest.DescribeConfigsResource
    pair.both(
        DESCRIBE_CONFIGS,
        4,
        DescribeConfigsRequest(
            resources=[
                D(resource_type=2, resource_name=TOPIC, configuration_keys=["retention.ms", "cleanup.policy"])
            ]
        ),
    )
    metadata = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)], allow_auto_topic_creation=False
    )
    pair.both(METADATA, 12, metadata)
    S = DeleteTopicsRequest.DeleteTopicState
    pair.both(
        DELETE_TOPICS,
        6,
        DeleteTopicsRequest(topics=[S(name=TOPIC), S(name="diff-never-created")], timeout_ms=10000),
    )
    time.sleep(1.0)  # Kafka's controller finishes the deletion and updates every broker's metadata
    pair.both(METADATA, 12, metadata)
    pair.both(PRODUCE, 9, produce(TOPIC, 0, records.build_batch([(b"k", b"v", [], int(time.time() * 1000))])))
    pair.both(
        CREATE_PARTITIONS,
        3,
        CreatePartitionsRequest(
            topics=[P(name=TOPIC, count=4, assignments=None)], timeout_ms=10000, validate_only=False
        ),
    )


def classic_rebalance(pair: Pair) -> None:
    """Timeouts of a classic group: a second member's join waits out the rebalance timeout for the first, which never
    rejoins and is removed; the second never sends SyncGroup and is removed in turn when the rebalance timeout passes
    again (Kafka's pending-sync expiry), leaving the group Empty."""
    group = "diff-rebalance"

    def join(member: str) -> JoinGroupRequest:
        return range_join(group, "diff-a", member, rebalance_timeout_ms=1000)

    def joined(first: tuple[Any, Any, Any]) -> tuple[Any, Any]:
        ours, theirs, _ = pair.each(JOIN, 7, join(first[0].member_id), join(first[1].member_id))
        return ours, theirs

    one = joined(pair.both(JOIN, 7, join("")))
    A = SyncGroupRequest.SyncGroupRequestAssignment
    pair.each(
        SYNC,
        5,
        *(
            SyncGroupRequest(
                group_id=group,
                generation_id=r.generation_id,
                member_id=r.member_id,
                protocol_type="consumer",
                protocol_name="range",
                assignments=[A(member_id=r.member_id, assignment=b"")],
            )
            for r in one
        ),
    )
    two = joined(pair.both(JOIN, 7, join("")))  # waits the rebalance timeout out: the first member is removed
    pair.each(
        HEARTBEAT,
        4,
        *(
            HeartbeatRequest(group_id=group, generation_id=r.generation_id, member_id=r.member_id)
            for r in one
        ),
    )  # UNKNOWN_MEMBER_ID
    # CompletingRebalance until the rebalance timeout passes after each side's join (not compared: the sides are
    # asked one after the other, a second apart), then Empty.
    time.sleep(1.5)
    pair.both(DESCRIBE_GROUPS, 5, DescribeGroupsRequest(groups=[group]))
    pair.each(
        SYNC,
        5,
        *(
            SyncGroupRequest(
                group_id=group,
                generation_id=r.generation_id,
                member_id=r.member_id,
                protocol_type="consumer",
                protocol_name="range",
                assignments=[],
            )
            for r in two
        ),
    )  # UNKNOWN_MEMBER_ID


SCENARIOS = (group_offsets, txn_offsets, topic_life, classic_rebalance)
# seconds of waiting each: out of CI's short pass
SLOW = (topic_life, classic_rebalance)

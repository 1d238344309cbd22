"""Stateful request sequences sent to both brokers: produce and fetch, a classic group's life, idempotent sequences,
a transaction, deletes and config changes. Ids a broker generated (member ids, producer ids) are threaded per side."""

from __future__ import annotations

import time
from typing import Any

from kbroker.protocol import records as R
from kbroker.protocol.messages import (
    AddPartitionsToTxnRequest,
    DeleteRecordsRequest,
    DescribeConfigsRequest,
    EndTxnRequest,
    FetchRequest,
    HeartbeatRequest,
    IncrementalAlterConfigsRequest,
    InitProducerIdRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    ProduceRequest,
    SyncGroupRequest,
)

from tests.differential.harness import Pair

PRODUCE, FETCH, LIST_OFFSETS = 0, 1, 2
JOIN, HEARTBEAT, LEAVE, SYNC = 11, 12, 13, 14
INIT_PID, ADD_PARTITIONS, END_TXN, DELETE_RECORDS = 22, 24, 26, 21
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 44
NOW = int(time.time() * 1000)


def produce(
    topic: str, partition: int, batch: bytes | None, acks: int = -1, txn: str | None = None
) -> ProduceRequest:
    P = ProduceRequest.TopicProduceData
    return ProduceRequest(
        transactional_id=txn,
        acks=acks,
        timeout_ms=5000,
        topic_data=[
            P(
                name=topic,
                partition_data=[ProduceRequest.PartitionProduceData(index=partition, records=batch)],
            )
        ],
    )


def fetch(topic: str, partition: int, offset: int, isolation: int = 0) -> FetchRequest:
    T = FetchRequest.FetchTopic
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=isolation,
        session_id=0,
        session_epoch=-1,
        topics=[
            T(
                topic=topic,
                partitions=[
                    FetchRequest.FetchPartition(
                        partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20
                    )
                ],
            )
        ],
    )


def list_offsets(topic: str, partition: int, timestamp: int) -> ListOffsetsRequest:
    T = ListOffsetsRequest.ListOffsetsTopic
    return ListOffsetsRequest(
        replica_id=-1,
        topics=[
            T(
                name=topic,
                partitions=[
                    ListOffsetsRequest.ListOffsetsPartition(partition_index=partition, timestamp=timestamp)
                ],
            )
        ],
    )


def produce_fetch(pair: Pair) -> None:
    records = [(b"k%d" % i, b"v%d" % i, [], NOW) for i in range(3)]
    for version in (3, 7, 9):
        pair.both(PRODUCE, version, produce("diff-b", 1, R.build_batch(records)))
    pair.both(PRODUCE, 9, produce("diff-b", 7, R.build_batch(records)))  # no such partition
    pair.both(
        PRODUCE, 9, produce("diff-b", 1, b"\x00" * 61), label="Produce (batch length 0)"
    )  # a batch that is not one
    for version in (4, 11, 12):
        for offset in (0, 3, 9, 10, -5):
            pair.both(FETCH, version, fetch("diff-b", 1, offset))
    for version in (1, 5, 8):
        for ts in (-1, -2, NOW - 1000, NOW + 10**9):
            pair.both(LIST_OFFSETS, version, list_offsets("diff-b", 1, ts))


def classic_group(pair: Pair) -> None:
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01")]

    def join(member: str) -> JoinGroupRequest:
        return JoinGroupRequest(
            group_id="diff-group",
            session_timeout_ms=10000,
            rebalance_timeout_ms=5000,
            member_id=member,
            protocol_type="consumer",
            protocols=protocols,
        )

    pair.both(JOIN, 5, join(""))  # v4+: MEMBER_ID_REQUIRED with a member id to rejoin with
    first_ours, first_theirs, _ = pair.both(JOIN, 5, join(""))
    ours, theirs, _ = pair.each(JOIN, 5, join(first_ours.member_id), join(first_theirs.member_id))
    members = (ours.member_id, theirs.member_id)
    generation = (ours.generation_id, theirs.generation_id)

    def sync(member: str, gen: int) -> SyncGroupRequest:
        return SyncGroupRequest(
            group_id="diff-group",
            generation_id=gen,
            member_id=member,
            protocol_type="consumer",
            protocol_name="range",
            assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=member, assignment=b"a")],
        )

    def heartbeat(member: str, gen: int) -> HeartbeatRequest:
        return HeartbeatRequest(group_id="diff-group", generation_id=gen, member_id=member)

    pair.each(SYNC, 5, sync(members[0], generation[0]), sync(members[1], generation[1]))
    pair.each(HEARTBEAT, 4, heartbeat(members[0], generation[0]), heartbeat(members[1], generation[1]))
    pair.each(
        HEARTBEAT, 4, heartbeat(members[0], generation[0] + 5), heartbeat(members[1], generation[1] + 5)
    )
    pair.both(HEARTBEAT, 4, heartbeat("unknown-member", 1))
    leave = [
        LeaveGroupRequest(group_id="diff-group", members=[LeaveGroupRequest.MemberIdentity(member_id=m)])
        for m in members
    ]
    pair.each(LEAVE, 4, leave[0], leave[1])
    pair.each(LEAVE, 4, leave[0], leave[1])  # again: UNKNOWN_MEMBER_ID for the member


def _pid(resp: Any) -> tuple[int, int]:
    return (getattr(resp, "producer_id", -1), getattr(resp, "producer_epoch", -1))


def idempotent(pair: Pair) -> None:
    init = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)
    ours, theirs, _ = pair.both(INIT_PID, 4, init)
    sides = (_pid(ours), _pid(theirs))

    def batch(side: int, seq: int, epoch_shift: int = 0) -> ProduceRequest:
        pid, epoch = sides[side]
        return produce(
            "diff-a",
            0,
            R.build_batch(
                [(b"k", b"v", [], NOW)],
                producer_id=pid,
                producer_epoch=epoch + epoch_shift,
                base_sequence=seq,
            ),
        )

    for seq, shift in ((0, 0), (0, 0), (1, 0), (5, 0), (2, 1), (2, -1)):
        pair.each(PRODUCE, 9, batch(0, seq, shift), batch(1, seq, shift))


def transaction(pair: Pair) -> None:
    init = InitProducerIdRequest(transactional_id="diff-txn", transaction_timeout_ms=60000)
    ours, theirs, _ = pair.both(INIT_PID, 4, init)
    sides = (_pid(ours), _pid(theirs))
    T = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic

    def add(side: int) -> AddPartitionsToTxnRequest:
        pid, epoch = sides[side]
        return AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="diff-txn",
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[T(name="diff-a", partitions=[0])],
        )

    def end(side: int, committed: bool, epoch_shift: int = 0) -> EndTxnRequest:
        pid, epoch = sides[side]
        return EndTxnRequest(
            transactional_id="diff-txn",
            producer_id=pid,
            producer_epoch=epoch + epoch_shift,
            committed=committed,
        )

    pair.each(END_TXN, 3, end(0, True), end(1, True))  # nothing to commit yet
    pair.each(ADD_PARTITIONS, 3, add(0), add(1))

    def txn_batch(side: int) -> ProduceRequest:
        pid, epoch = sides[side]
        return produce(
            "diff-a",
            0,
            R.build_batch(
                [(b"t", b"v", [], NOW)],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                is_transactional=True,
            ),
            txn="diff-txn",
        )

    pair.each(PRODUCE, 9, txn_batch(0), txn_batch(1))
    pair.each(END_TXN, 3, end(0, True, 1), end(1, True, 1))  # a newer epoch than the producer's
    pair.each(END_TXN, 3, end(0, False), end(1, False))


def deletes_and_configs(pair: Pair) -> None:
    D = DeleteRecordsRequest.DeleteRecordsTopic
    for offset in (1, 2, 100, -1):
        pair.both(
            DELETE_RECORDS,
            2,
            DeleteRecordsRequest(
                topics=[
                    D(
                        name="diff-b",
                        partitions=[
                            DeleteRecordsRequest.DeleteRecordsPartition(partition_index=1, offset=offset)
                        ],
                    )
                ],
                timeout_ms=5000,
            ),
        )
    A = IncrementalAlterConfigsRequest.AlterConfigsResource
    for name, value, op in (
        ("retention.ms", "3600000", 0),
        ("retention.ms", "-5", 0),
        ("no.such.config", "1", 0),
        ("cleanup.policy", "compact", 2),
        ("retention.ms", None, 1),
    ):
        pair.both(
            INCREMENTAL_ALTER_CONFIGS,
            1,
            IncrementalAlterConfigsRequest(
                resources=[
                    A(
                        resource_type=2,
                        resource_name="diff-b",
                        configs=[
                            IncrementalAlterConfigsRequest.AlterableConfig(
                                name=name, config_operation=op, value=value
                            )
                        ],
                    )
                ]
            ),
        )
    R_ = DescribeConfigsRequest.DescribeConfigsResource
    pair.both(
        DESCRIBE_CONFIGS,
        4,
        DescribeConfigsRequest(
            resources=[
                R_(
                    resource_type=2,
                    resource_name="diff-b",
                    configuration_keys=["retention.ms", "cleanup.policy"],
                )
            ]
        ),
    )


SCENARIOS = (produce_fetch, classic_group, idempotent, transaction, deletes_and_configs)


def run(pair: Pair, slow: bool = True) -> None:
    """Every scenario; without `slow`, not those waiting out Kafka's timeouts and topic deletion (CI's short pass:
    tests/coordinator/test_group_hardening.py covers their kbroker side)."""
    from tests.differential.scenarios_more import SCENARIOS as MORE
    from tests.differential.scenarios_more import SLOW

    for scenario in SCENARIOS + MORE:
        if slow or scenario not in SLOW:
            scenario(pair)

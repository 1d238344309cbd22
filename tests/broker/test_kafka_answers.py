"""Answers Apache Kafka 3.9 gives, field by field, that the differential harness (tests/differential) found kbroker
giving otherwise; each asserted over a real socket against a real broker process."""

from __future__ import annotations

import time
from pathlib import Path

from kbroker.protocol import records as R
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AddPartitionsToTxnRequest,
    AlterReplicaLogDirsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DescribeClientQuotasRequest,
    DescribeClusterRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    DescribeUserScramCredentialsRequest,
    FindCoordinatorRequest,
    HeartbeatRequest,
    InitProducerIdRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    ListTransactionsRequest,
    MetadataRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetForLeaderEpochRequest,
    ProduceRequest,
    ProduceResponse,
    SyncGroupRequest,
    TxnOffsetCommitRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess
from tests.differential.scenarios import fetch

PRODUCE, FETCH, LIST_OFFSETS, FIND_COORDINATOR, INIT_PRODUCER_ID = 0, 1, 2, 10, 22
HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, DESCRIBE_TRANSACTIONS = 12, 13, 14, 65


def _produce(topic: str, batch: bytes) -> ProduceRequest:
    P = ProduceRequest.TopicProduceData
    return ProduceRequest(
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            P(name=topic, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)])
        ],
    )


def test_fetch_partition_in_error_aborted_transactions_null_or_empty_as_kafka(
    broker: BrokerProcess, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        for isolation in (0, 1):
            resp = c.request(FETCH, 12, fetch(topic_name, 0, 50, isolation))
            part = resp.responses[0].partitions[0]
            assert part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
            # Kafka 3.9: null (not an empty array) for a partition in error, whatever the isolation level.
            assert part.aborted_transactions is None
            assert (part.high_watermark, part.last_stable_offset, part.log_start_offset) == (-1, -1, -1)
            # Refused before any read (no such partition): an empty array, as Kafka's KafkaApis answers it.
            missing = fetch(topic_name, 0, 0, isolation)
            missing.topics[0].partitions[0].partition = 7
            part = c.request(FETCH, 12, missing).responses[0].partitions[0]
            assert part.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert part.aborted_transactions == []


def test_refused_sequence_carries_the_log_start_offset(broker: BrokerProcess, topic_name: str) -> None:
    now = int(time.time() * 1000)
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        init = c.request(
            INIT_PRODUCER_ID, 4, InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)
        )
        assert init.error_code == 0

        def send(seq: int, epoch: int) -> ProduceResponse.PartitionProduceResponse:
            batch = R.build_batch(
                [(b"k", b"v", [], now)], producer_id=init.producer_id, producer_epoch=epoch, base_sequence=seq
            )
            return c.request(PRODUCE, 9, _produce(topic_name, batch)).responses[0].partition_responses[0]

        assert send(0, init.producer_epoch).error_code == 0
        gap = send(5, init.producer_epoch)
        assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        # Kafka's ReplicaManager answers a sequence or epoch refusal with the partition's log start offset.
        assert (gap.base_offset, gap.log_start_offset) == (-1, 0)
        fenced = send(1, init.producer_epoch - 1)
        assert fenced.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
        assert fenced.log_start_offset == 0
        missing = c.request(
            PRODUCE,
            9,
            ProduceRequest(
                acks=-1,
                timeout_ms=5000,
                topic_data=[
                    ProduceRequest.TopicProduceData(
                        name=topic_name,
                        partition_data=[
                            ProduceRequest.PartitionProduceData(
                                index=9, records=R.build_batch([(b"k", b"v", [], now)])
                            )
                        ],
                    )
                ],
            ),
        )
        part = missing.responses[0].partition_responses[0]
        assert part.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert part.log_start_offset == -1  # no partition, no offset: Kafka's -1 too


def test_empty_group_id_is_invalid_group_id_for_membership_apis(broker: BrokerProcess) -> None:
    # Kafka's GroupCoordinator.validateGroupStatus: only the offset, describe and delete APIs accept "".
    with WireClient(broker.bootstrap) as c:
        for version in (0, 4):
            hb = c.request(HEARTBEAT, version, HeartbeatRequest(group_id="", generation_id=1, member_id="m"))
            assert hb.error_code == ErrorCode.INVALID_GROUP_ID
        for version in (0, 5):
            sync = c.request(
                SYNC_GROUP,
                version,
                SyncGroupRequest(
                    group_id="",
                    generation_id=1,
                    member_id="m",
                    protocol_type="consumer",
                    protocol_name="range",
                ),
            )
            assert sync.error_code == ErrorCode.INVALID_GROUP_ID
        # v5+: protocol type and name are mandatory, checked before the group (Kafka's KafkaApis).
        sync = c.request(SYNC_GROUP, 5, SyncGroupRequest(group_id="diff-g", generation_id=-1, member_id=""))
        assert sync.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        leave = c.request(LEAVE_GROUP, 0, LeaveGroupRequest(group_id="", member_id="m"))
        assert leave.error_code == ErrorCode.INVALID_GROUP_ID
        M = LeaveGroupRequest.MemberIdentity
        leave = c.request(LEAVE_GROUP, 5, LeaveGroupRequest(group_id="", members=[M(member_id="m")]))
        assert (leave.error_code, leave.members) == (ErrorCode.INVALID_GROUP_ID, [])


def test_describe_transactions_of_an_unknown_id_keeps_the_schema_defaults(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        c.request(FIND_COORDINATOR, 3, FindCoordinatorRequest(key="diff-unknown-txn", key_type=1))
        for _ in range(50):
            [state] = c.request(
                DESCRIBE_TRANSACTIONS, 0, DescribeTransactionsRequest(transactional_ids=["diff-unknown-txn"])
            ).transaction_states
            if state.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                break
            time.sleep(0.2)
        assert state.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        # Kafka 3.9's answer: producer id, epoch and start time 0, the state "" (not kbroker's former -1s).
        assert (state.producer_id, state.producer_epoch, state.transaction_start_time_ms) == (0, 0, 0)
        assert state.transaction_state == ""


def test_list_offsets_checks_timestamps_and_repeats_before_the_partition(
    broker: BrokerProcess, topic_name: str
) -> None:
    T, P = ListOffsetsRequest.ListOffsetsTopic, ListOffsetsRequest.ListOffsetsPartition

    def ask(version: int, topics: list[ListOffsetsRequest.ListOffsetsTopic]) -> dict[tuple[str, int], int]:
        resp = c.request(LIST_OFFSETS, version, ListOffsetsRequest(replica_id=-1, topics=topics))
        return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}

    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        # Kafka's ReplicaManager: a special timestamp the version does not know is UNSUPPORTED_VERSION, checked
        # before the partition exists; -3 needs v7, -4 v8, other negatives never exist.
        got = ask(
            6,
            [
                T(name=topic_name, partitions=[P(partition_index=0, timestamp=-3)]),
                T(name="diff-nowhere", partitions=[P(partition_index=0, timestamp=-9)]),
            ],
        )
        assert got == {
            (topic_name, 0): ErrorCode.UNSUPPORTED_VERSION,
            ("diff-nowhere", 0): ErrorCode.UNSUPPORTED_VERSION,
        }
        assert ask(7, [T(name=topic_name, partitions=[P(partition_index=0, timestamp=-4)])]) == {
            (topic_name, 0): ErrorCode.UNSUPPORTED_VERSION
        }
        assert ask(8, [T(name=topic_name, partitions=[P(partition_index=0, timestamp=-4)])]) == {
            (topic_name, 0): 0
        }
        # A partition named twice is INVALID_REQUEST each time; a topic naming no partition is answered empty.
        resp = c.request(
            LIST_OFFSETS,
            5,
            ListOffsetsRequest(
                replica_id=-1,
                topics=[
                    T(name=topic_name, partitions=[P(partition_index=0, timestamp=-1)] * 2),
                    T(name="diff-e"),
                ],
            ),
        )
        got = [(t.name, [p.error_code for p in t.partitions]) for t in resp.topics]
        assert got == [(topic_name, [ErrorCode.INVALID_REQUEST] * 2), ("diff-e", [])]
        # A consumer's unknown isolation level fails Kafka's IsolationLevel.forId: UNKNOWN_SERVER_ERROR throughout.
        resp = c.request(
            LIST_OFFSETS,
            7,
            ListOffsetsRequest(
                replica_id=-1,
                isolation_level=9,
                topics=[T(name=topic_name, partitions=[P(partition_index=0)])],
            ),
        )
        assert resp.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_SERVER_ERROR
        # An unknown partition is unknown whatever leader epoch the client names (not UNKNOWN_LEADER_EPOCH).
        got = ask(
            5, [T(name=topic_name, partitions=[P(partition_index=9, current_leader_epoch=7, timestamp=-1)])]
        )
        assert got == {(topic_name, 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}


def test_admin_answers_as_kafka(broker: BrokerProcess, topic_name: str) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        # DescribeCluster refusing an endpoint type still names its own (brokers, 1).
        dc = c.request(60, 1, DescribeClusterRequest(endpoint_type=-3))
        assert (dc.error_code, dc.endpoint_type) == (ErrorCode.UNSUPPORTED_ENDPOINT_TYPE, 1)
        # An unknown quota match type fails Kafka's filter construction: UNKNOWN_SERVER_ERROR.
        C = DescribeClientQuotasRequest.ComponentData
        dq = c.request(48, 1, DescribeClientQuotasRequest(components=[C(entity_type="user", match_type=9)]))
        assert dq.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
        # Repeated group ids and state filters are answered once (Kafka's maps and sets).
        dg = c.request(42, 2, DeleteGroupsRequest(groups_names=["diff-none", "diff-none"]))
        assert [(r.group_id, r.error_code) for r in dg.results] == [
            ("diff-none", ErrorCode.GROUP_ID_NOT_FOUND)
        ]
        lt = c.request(66, 0, ListTransactionsRequest(state_filters=["Bogus", "Bogus"]))
        assert lt.unknown_state_filters == ["Bogus"]
        # OffsetDelete: a partition the metadata does not know is UNKNOWN_TOPIC_OR_PARTITION before the group.
        c.request(FIND_COORDINATOR, 3, FindCoordinatorRequest(key="diff-od", key_type=0))
        T, P = OffsetDeleteRequest.OffsetDeleteRequestTopic, OffsetDeleteRequest.OffsetDeleteRequestPartition
        req = OffsetDeleteRequest(
            group_id="diff-od",
            topics=[
                T(name=topic_name, partitions=[P(partition_index=5)]),
                T(name="diff-nowhere", partitions=[P()]),
                T(name="diff-empty"),
            ],
        )
        OT, OP = (
            OffsetCommitRequest.OffsetCommitRequestTopic,
            OffsetCommitRequest.OffsetCommitRequestPartition,
        )
        commit = OffsetCommitRequest(
            group_id="diff-od",
            generation_id_or_member_epoch=-1,
            topics=[OT(name=topic_name, partitions=[OP(partition_index=0, committed_offset=0)])],
        )
        for _ in range(50):  # the group exists once it has an offset
            if c.request(8, 8, commit).topics[0].partitions[0].error_code == 0:
                break
            time.sleep(0.2)
        od = c.request(47, 0, req)
        got = {(t.name, p.partition_index): p.error_code for t in od.topics for p in t.partitions}
        assert sorted(t.name for t in od.topics) == sorted(
            [topic_name, "diff-nowhere"]
        )  # none for diff-empty
        assert (od.error_code, got) == (
            0,
            {
                (topic_name, 5): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                ("diff-nowhere", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            },
        )


def test_find_coordinator_of_an_empty_key_answers_a_coordinator(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        for _ in range(50):
            resp = c.request(FIND_COORDINATOR, 4, FindCoordinatorRequest(key_type=0, coordinator_keys=[""]))
            if resp.coordinators[0].error_code != ErrorCode.COORDINATOR_NOT_AVAILABLE:
                break
            time.sleep(0.2)
        assert (resp.coordinators[0].error_code, resp.coordinators[0].node_id) == (0, 0)
        old = c.request(FIND_COORDINATOR, 0, FindCoordinatorRequest(key=""))
        assert (old.error_code, old.node_id) == (0, 0)


def test_metadata_v10_naming_a_topic_id_is_refused_whole(broker: BrokerProcess, topic_name: str) -> None:
    T = MetadataRequest.MetadataRequestTopic
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        req = MetadataRequest(topics=[T(name=topic_name), T(name="x", topic_id=b"\x01" * 16)])
        resp = c.request(3, 10, req)
        # Kafka's MetadataRequest.getErrorResponse: every topic INVALID_REQUEST, no brokers, cluster id or controller.
        assert [(t.name, t.error_code, t.partitions) for t in resp.topics] == [
            (topic_name, ErrorCode.INVALID_REQUEST, []),
            ("x", ErrorCode.INVALID_REQUEST, []),
        ]
        assert (resp.brokers, resp.cluster_id, resp.controller_id) == ([], None, -1)


def test_produce_and_delete_records_answer_by_topic(broker: BrokerProcess, topic_name: str) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        P = ProduceRequest.TopicProduceData
        req = _produce(topic_name, R.build_batch([(None, b"v", [], int(time.time() * 1000))]))
        req.topic_data = [P(name="diff-empty"), *req.topic_data, P(name=topic_name)]
        resp = c.request(PRODUCE, 9, req)
        # Kafka answers from a map by partition: no entry for a topic naming no partition, one per topic.
        assert [(t.name, [p.error_code for p in t.partition_responses]) for t in resp.responses] == [
            (topic_name, [0])
        ]
        T, DP = DeleteRecordsRequest.DeleteRecordsTopic, DeleteRecordsRequest.DeleteRecordsPartition
        dr = c.request(
            21,
            2,
            DeleteRecordsRequest(
                topics=[
                    T(name="diff-empty"),
                    T(name=topic_name, partitions=[DP(partition_index=0, offset=0)]),
                    T(name=topic_name, partitions=[DP(partition_index=0, offset=1)]),
                ],
                timeout_ms=5000,
            ),
        )
        assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in dr.topics] == [
            (topic_name, [(0, 0)])
        ]


def test_denied_principal_answers_as_kafka(tmp_path: Path) -> None:
    # ANONYMOUS with Kafka's ACL authorizer and no ACLs: denied everything.
    b = BrokerProcess(tmp_path, {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"})
    b.start()
    try:
        with WireClient(b.bootstrap) as c:
            # OffsetForLeaderEpoch: CLUSTER_ACTION or DESCRIBE per topic, whatever replica id is named.
            T, P = (
                OffsetForLeaderEpochRequest.OffsetForLeaderTopic,
                OffsetForLeaderEpochRequest.OffsetForLeaderPartition,
            )
            for replica_id in (-1, 3):
                resp = c.request(
                    23,
                    4,
                    OffsetForLeaderEpochRequest(
                        replica_id=replica_id,
                        topics=[T(topic="diff-a", partitions=[P(partition=0, leader_epoch=0)])],
                    ),
                )
                assert resp.topics[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            # DescribeTransactions refused: the schema's defaults beside the error.
            [st] = c.request(65, 0, DescribeTransactionsRequest(transactional_ids=["tx"])).transaction_states
            assert (st.error_code, st.producer_id, st.producer_epoch, st.transaction_start_time_ms) == (
                ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                0,
                0,
                0,
            )
            # TxnOffsetCommit refused: the request's topics as named, a topic naming no partition included.
            TT = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
            TP = TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition
            resp = c.request(
                28,
                3,
                TxnOffsetCommitRequest(
                    transactional_id="tx",
                    group_id="g",
                    producer_id=1,
                    producer_epoch=0,
                    topics=[
                        TT(name="a"),
                        TT(name="b", partitions=[TP(partition_index=0, committed_offset=1)]),
                    ],
                ),
            )
            assert [(t.name, [p.error_code for p in t.partitions]) for t in resp.topics] == [
                ("a", []),
                ("b", [ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED]),
            ]
            # AddPartitionsToTxn v3 refused for its transactional id: the request's topics as named, repeats kept.
            AT = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
            resp = c.request(
                24,
                3,
                AddPartitionsToTxnRequest(
                    v3_and_below_transactional_id="tx",
                    v3_and_below_producer_id=1,
                    v3_and_below_producer_epoch=0,
                    v3_and_below_topics=[AT(name="a"), AT(name="b", partitions=[2, 2])],
                ),
            )
            denied_txn = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert [
                (t.name, [(p.partition_index, p.partition_error_code) for p in t.results_by_partition])
                for t in resp.results_by_topic_v3_and_below
            ] == [("a", []), ("b", [(2, denied_txn), (2, denied_txn)])]
            # DescribeUserScramCredentials: Kafka's getErrorResponse has one result per user named (name unset).
            U = DescribeUserScramCredentialsRequest.UserName
            resp = c.request(50, 0, DescribeUserScramCredentialsRequest(users=[U(name="a"), U(name="b")]))
            assert resp.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            assert [(r.user, r.error_code) for r in resp.results] == [
                ("", ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
            ] * 2
            # AlterReplicaLogDirs refused: every topic entry of every dir as named, repeats and empty ones kept.
            D = AlterReplicaLogDirsRequest.AlterReplicaLogDir
            DT = AlterReplicaLogDirsRequest.AlterReplicaLogDirTopic
            resp = c.request(
                34,
                2,
                AlterReplicaLogDirsRequest(
                    dirs=[
                        D(path="/a", topics=[DT(name="t", partitions=[1, 1]), DT(name="u", partitions=[])]),
                        D(path="/b", topics=[DT(name="t", partitions=[0])]),
                    ]
                ),
            )
            denied = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            assert [
                (r.topic_name, [(p.partition_index, p.error_code) for p in r.partitions])
                for r in resp.results
            ] == [
                ("t", [(1, denied), (1, denied)]),
                ("u", []),
                ("t", [(0, denied)]),
            ]
    finally:
        b.stop()


def test_init_producer_id_with_half_an_identity_is_invalid_request(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        for pid, epoch in ((-454503, -1), (-1, 3)):
            req = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)
            req.producer_id, req.producer_epoch = pid, epoch
            resp = c.request(INIT_PRODUCER_ID, 5, req)
            # Kafka's KafkaApis: an id without an epoch (or the reverse) is INVALID_REQUEST.
            assert (resp.error_code, resp.producer_id, resp.producer_epoch) == (
                ErrorCode.INVALID_REQUEST,
                -1,
                -1,
            )


def test_describe_producers_of_an_illegal_topic_name(broker: BrokerProcess) -> None:
    T = DescribeProducersRequest.TopicRequest
    with WireClient(broker.bootstrap) as c:
        resp = c.request(
            61,
            0,
            DescribeProducersRequest(
                topics=[
                    T(name="", partition_indexes=[0]),
                    T(name="bad/name", partition_indexes=[1]),
                    T(name="diff-nowhere", partition_indexes=[0]),
                ]
            ),
        )
        got = [(t.name, [p.error_code for p in t.partitions]) for t in resp.topics]
        # Kafka's checkValidTopic first: INVALID_TOPIC_EXCEPTION for illegal names, then the metadata.
        assert got == [
            ("", [ErrorCode.INVALID_TOPIC_EXCEPTION]),
            ("bad/name", [ErrorCode.INVALID_TOPIC_EXCEPTION]),
            ("diff-nowhere", [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]),
        ]


def test_metadata_v12_by_topic_id_ignores_names(broker: BrokerProcess, topic_name: str) -> None:
    T = MetadataRequest.MetadataRequestTopic
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        unknown = b"\x01" * 16
        resp = c.request(
            3, 12, MetadataRequest(topics=[T(name=topic_name), T(name=topic_name, topic_id=unknown)])
        )
        # Kafka: any topic id makes the request one by ids; the names beside them are not looked at.
        assert [(t.name, t.error_code, t.topic_id) for t in resp.topics] == [
            (None, ErrorCode.UNKNOWN_TOPIC_ID, unknown)
        ]


def test_metadata_answers_a_repeated_topic_once(broker: BrokerProcess, topic_name: str) -> None:
    T = MetadataRequest.MetadataRequestTopic
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        for version in (1, 12):
            resp = c.request(3, version, MetadataRequest(topics=[T(name=topic_name), T(name=topic_name)]))
            assert [t.name for t in resp.topics] == [topic_name]  # Kafka's set of names

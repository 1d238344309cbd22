"""Which error Apache Kafka 3.9 answers first when several apply (Produce, OffsetCommit, TxnOffsetCommit, OffsetFetch,
Fetch) and which requests it cannot parse (the ACL APIs), as the differential harness found them; each asserted over a
real socket against a real broker process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kbroker.protocol import records as R
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AddPartitionsToTxnRequest,
    AlterClientQuotasRequest,
    AlterUserScramCredentialsRequest,
    CreateAclsRequest,
    DeleteAclsRequest,
    DescribeAclsRequest,
    DescribeGroupsRequest,
    FetchRequest,
    FindCoordinatorRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
)

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess
from tests.differential.harness import CLOSED, Target
from tests.differential.scenarios import fetch

PRODUCE, FETCH, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, DESCRIBE_GROUPS = 0, 1, 8, 9, 10, 15
ALTER_CLIENT_QUOTAS, ALTER_USER_SCRAM_CREDENTIALS = 49, 51
ADD_PARTITIONS_TO_TXN, TXN_OFFSET_COMMIT, DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 24, 28, 29, 30, 31
UNKNOWN = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.fixture
def target(broker: BrokerProcess) -> Iterator[Target]:
    t = Target("kbroker", broker.bootstrap)
    yield t
    t.close()


def _batch() -> bytes:
    return R.build_batch([(b"k", b"v", [], int(time.time() * 1000))])


def _produce(acks: int, *partitions: tuple[str, int, bytes | None]) -> ProduceRequest:
    topics: dict[str, list[ProduceRequest.PartitionProduceData]] = {}
    for name, index, records in partitions:
        topics.setdefault(name, []).append(ProduceRequest.PartitionProduceData(index=index, records=records))
    return ProduceRequest(
        acks=acks,
        timeout_ms=5000,
        topic_data=[ProduceRequest.TopicProduceData(name=n, partition_data=ps) for n, ps in topics.items()],
    )


def _codes(response: Any, topics: str, partitions: str, index: str = "index") -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for t in getattr(response, topics):
        for p in getattr(t, partitions):
            key = (t.name, getattr(p, index))
            assert key not in out, f"{key} answered twice"
            out[key] = p.error_code
    return out


def test_produce_answers_unknown_partitions_before_acks_and_internal_topics(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
    # Only unknown partitions: answered at once whatever the acks (Kafka's KafkaApis never reaches appendRecords).
    resp = target.send(
        PRODUCE, 9, _produce(2, (topic_name, 5, _batch()), ("__consumer_offsets", 999, _batch()))
    )
    assert _codes(resp, "responses", "partition_responses") == {
        (topic_name, 5): UNKNOWN,
        ("__consumer_offsets", 999): UNKNOWN,
    }
    # With a partition to append, the acks are refused for it alone.
    resp = target.send(PRODUCE, 9, _produce(2, (topic_name, 0, _batch()), (topic_name, 5, _batch())))
    assert _codes(resp, "responses", "partition_responses") == {
        (topic_name, 0): ErrorCode.INVALID_REQUIRED_ACKS,
        (topic_name, 5): UNKNOWN,
    }
    # Produce v0-v2 take any record set: an empty one on an unknown partition is still UNKNOWN_TOPIC_OR_PARTITION.
    resp = target.send(PRODUCE, 2, _produce(1, (topic_name, 3, b"")))
    assert _codes(resp, "responses", "partition_responses") == {(topic_name, 3): UNKNOWN}


def test_produce_corrupt_first_entry_fails_the_whole_request(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
    # A batch length of 0: Kafka's batch iterator throws on the first entry before any partition is looked at.
    corrupt = bytearray(_batch())
    corrupt[8:12] = b"\x00\x00\x00\x00"
    resp = target.send(
        PRODUCE, 9, _produce(1, (topic_name, 0, _batch()), ("missing-topic", 0, bytes(corrupt)))
    )
    assert _codes(resp, "responses", "partition_responses") == {
        (topic_name, 0): ErrorCode.CORRUPT_MESSAGE,
        ("missing-topic", 0): ErrorCode.CORRUPT_MESSAGE,
    }


def test_produce_answers_a_partition_named_twice_once(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
    resp = target.send(PRODUCE, 9, _produce(1, (topic_name, 0, _batch()), (topic_name, 0, _batch())))
    assert _codes(resp, "responses", "partition_responses") == {(topic_name, 0): ErrorCode.NONE}
    resp = target.send(PRODUCE, 9, _produce(1, (topic_name, 7, _batch()), (topic_name, 7, _batch())))
    assert _codes(resp, "responses", "partition_responses") == {(topic_name, 7): UNKNOWN}


def _offset_commit(
    group: str, generation: int, member: str, *topics: tuple[str, list[int]]
) -> OffsetCommitRequest:
    T, P = OffsetCommitRequest.OffsetCommitRequestTopic, OffsetCommitRequest.OffsetCommitRequestPartition
    return OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member,
        topics=[
            T(name=n, partitions=[P(partition_index=p, committed_offset=1) for p in ps]) for n, ps in topics
        ],
    )


def _group_state(target: Target, group: str) -> str:
    resp = target.send(DESCRIBE_GROUPS, 5, DescribeGroupsRequest(groups=[group]))
    return str(resp.groups[0].group_state)


def _coordinator(target: Target, *groups: str, key_type: int = 0) -> None:
    deadline = time.monotonic() + 30
    while True:
        resp = target.send(
            FIND_COORDINATOR, 4, FindCoordinatorRequest(key_type=key_type, coordinator_keys=list(groups))
        )
        if all(c.error_code == 0 for c in resp.coordinators) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def test_offset_commit_answers_topics_before_the_group(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
    _coordinator(target, "oc-old-generation", "oc-nothing-left", "")
    # An unknown group named with a generation: ILLEGAL_GENERATION, but only for what exists.
    req = _offset_commit("oc-old-generation", 5, "m", (topic_name, [0, 9]), ("missing-topic", [0]))
    resp = target.send(OFFSET_COMMIT, 8, req)
    assert _codes(resp, "topics", "partitions", "partition_index") == {
        (topic_name, 0): ErrorCode.ILLEGAL_GENERATION,
        (topic_name, 9): UNKNOWN,
        ("missing-topic", 0): UNKNOWN,
    }
    # Nothing left for the coordinator: no group is created; an existing topic naming no partition is not answered,
    # a missing one is (with no partitions).
    req = _offset_commit(
        "oc-nothing-left", -1, "", (topic_name, []), ("missing-topic", []), (topic_name, [4])
    )
    resp = target.send(OFFSET_COMMIT, 8, req)
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in resp.topics] == [
        ("missing-topic", []),
        (topic_name, [4]),
    ]
    assert _group_state(target, "oc-nothing-left") == "Dead"
    # The empty group id is a group like any other for offsets (Kafka's isValidGroupId): a simple group is created.
    resp = target.send(OFFSET_COMMIT, 8, _offset_commit("", -1, "", (topic_name, [0, 0])))
    assert _codes(resp, "topics", "partitions", "partition_index") == {(topic_name, 0): ErrorCode.NONE}
    assert _group_state(target, "") == "Empty"


def test_txn_offset_commit_creates_the_group_before_its_checks(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
    _coordinator(target, "txn-oc-group")
    T = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    P = TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition
    req = TxnOffsetCommitRequest(
        transactional_id="txn-oc-unknown",
        group_id="txn-oc-group",
        producer_id=12345,
        producer_epoch=0,
        generation_id=-1,
        member_id="",
        topics=[
            T(name=topic_name, partitions=[P(partition_index=0, committed_offset=1)]),
            T(name="missing-topic", partitions=[P(partition_index=0, committed_offset=1)]),
        ],
    )
    resp = target.send(TXN_OFFSET_COMMIT, 3, req)
    codes = _codes(resp, "topics", "partitions", "partition_index")
    assert codes[("missing-topic", 0)] == UNKNOWN
    # No transaction of that producer: refused by the verification, after the group was created.
    assert codes[(topic_name, 0)] not in (ErrorCode.NONE, UNKNOWN)
    assert _group_state(target, "txn-oc-group") == "Empty"


def test_add_partitions_to_txn_refuses_internal_topics_and_names_the_request_topics(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
    _coordinator(target, "aptt-unknown", key_type=1)
    T = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic

    def add(*topics: tuple[str, list[int]]) -> Any:
        req = AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="aptt-unknown",
            v3_and_below_producer_id=4242,
            v3_and_below_producer_epoch=0,
            v3_and_below_topics=[T(name=n, partitions=ps) for n, ps in topics],
        )
        return target.send(ADD_PARTITIONS_TO_TXN, 3, req).results_by_topic_v3_and_below

    # A client may not add an internal topic: TOPIC_AUTHORIZATION_FAILED even without an authorizer.
    results = add(("__consumer_offsets", [0]), (topic_name, [0]))
    assert {
        (t.name, p.partition_index): p.partition_error_code for t in results for p in t.results_by_partition
    } == {
        ("__consumer_offsets", 0): ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        (topic_name, 0): ErrorCode.OPERATION_NOT_ATTEMPTED,
    }
    # The coordinator's answer (no such producer) goes on the request's topics as named, empty ones included.
    results = add((topic_name, [0]), ("other", []))
    assert [
        (t.name, [(p.partition_index, p.partition_error_code) for p in t.results_by_partition])
        for t in results
    ] == [
        (topic_name, [(0, ErrorCode.INVALID_PRODUCER_ID_MAPPING)]),
        ("other", []),
    ]
    # Naming no partition at all still gets the coordinator's one answer, on the topics as named.
    assert [(t.name, t.results_by_partition) for t in add(("other", []), (topic_name, []))] == [
        ("other", []),
        (topic_name, []),
    ]


def test_offset_fetch_answers_a_partition_named_twice_once(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    _coordinator(target, "of-group")
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    req = OffsetFetchRequest(
        group_id="of-group",
        topics=[
            T(name=topic_name, partition_indexes=[0, 0, 1]),
            T(name="missing-topic", partition_indexes=[]),
        ],
    )
    resp = target.send(OFFSET_FETCH, 5, req)
    assert [(t.name, sorted(p.partition_index for p in t.partitions)) for t in resp.topics] == [
        (topic_name, [0, 1])
    ]


def _session_fetch(topic: str, session_id: int, epoch: int, isolation: int = 0) -> FetchRequest:
    req = fetch(topic, 0, 0, isolation)
    req.session_id, req.session_epoch = session_id, epoch
    return req


def test_fetch_session_id_without_a_cache_shard_fails_the_request(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
    for session_id, epoch in ((-(2**31), 5), (2**31 - 1, -1), (-300_000_000, 0)):
        resp = target.send(FETCH, 12, _session_fetch(topic_name, session_id, epoch))
        assert resp.error_code == ErrorCode.UNKNOWN_SERVER_ERROR, (session_id, epoch)
        assert [(p.partition_index, p.error_code) for t in resp.responses for p in t.partitions] == [
            (0, ErrorCode.UNKNOWN_SERVER_ERROR)
        ]
    # A small negative id has a shard (Kafka divides, truncating): the session is just not found.
    resp = target.send(FETCH, 12, _session_fetch(topic_name, -1, 5))
    assert (resp.error_code, resp.responses) == (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, [])


def test_fetch_unknown_isolation_level_fails_only_a_request_with_something_to_read(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
    resp = target.send(FETCH, 12, fetch(topic_name, 0, 0, isolation=5))
    assert resp.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert resp.responses[0].partitions[0].error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    resp = target.send(FETCH, 12, fetch("missing-topic", 0, 0, isolation=5))
    assert resp.error_code == ErrorCode.NONE
    assert resp.responses[0].partitions[0].error_code == UNKNOWN


def test_follower_fetch_of_an_unknown_partition(target: Target) -> None:
    req = fetch("missing-topic", 0, 0)
    req.replica_id = 7
    part = target.send(FETCH, 12, req).responses[0].partitions[0]
    assert (part.error_code, part.aborted_transactions) == (UNKNOWN, [])


def test_fetch_answers_the_partitions_read_before_those_refused(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    """Kafka lists the partitions it read first, then those refused before the read, and consecutive partitions of
    a topic share an entry: a topic with both kinds, another topic read between them, gets two entries."""
    other = topic_name + "-b"
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        c.create_topic(other)
    P = FetchRequest.FetchPartition
    for replica_id, read in ((-1, ErrorCode.NONE), (7, ErrorCode.NOT_LEADER_OR_FOLLOWER)):
        req = fetch(topic_name, 0, 0)
        req.replica_id = replica_id
        req.topics = [
            FetchRequest.FetchTopic(
                topic=name,
                partitions=[P(partition=p, fetch_offset=0, partition_max_bytes=1 << 20) for p in ps],
            )
            for name, ps in ((topic_name, [0, 99]), (other, [0]))
        ]
        resp = target.send(FETCH, 4, req)
        assert [
            (t.topic, [(p.partition_index, p.error_code) for p in t.partitions]) for t in resp.responses
        ] == [
            (topic_name, [(0, read)]),
            (other, [(0, read)]),
            (topic_name, [(99, UNKNOWN)]),
        ], replica_id


def _describe_acls(pattern: int, operation: int = 1) -> DescribeAclsRequest:
    return DescribeAclsRequest(
        resource_type_filter=1,
        resource_name_filter=None,
        pattern_type_filter=pattern,
        principal_filter=None,
        host_filter=None,
        operation=operation,
        permission_type=1,
    )


def test_acl_requests_kafka_cannot_parse_close_the_connection(broker: BrokerProcess) -> None:
    def send(api_key: int, version: int, body: Any) -> Any:
        t = Target("kbroker", broker.bootstrap)
        try:
            return t.send(api_key, version, body)
        finally:
            t.close()

    # No authorizer here: a request Kafka parses is answered SECURITY_DISABLED.
    assert send(DESCRIBE_ACLS, 1, _describe_acls(pattern=1)).error_code == ErrorCode.SECURITY_DISABLED
    assert send(DESCRIBE_ACLS, 0, _describe_acls(pattern=1)).error_code == ErrorCode.SECURITY_DISABLED
    assert send(DESCRIBE_ACLS, 0, _describe_acls(pattern=3, operation=0)) == CLOSED  # UNKNOWN operation
    assert send(DESCRIBE_ACLS, 1, _describe_acls(pattern=1, operation=0)) == CLOSED  # UNKNOWN operation
    creation = CreateAclsRequest.AclCreation(
        resource_type=2,
        resource_name="t",
        resource_pattern_type=3,
        principal="User:a",
        host="*",
        operation=3,
        permission_type=3,
    )
    assert send(CREATE_ACLS, 1, CreateAclsRequest(creations=[creation])).results[0].error_code == (
        ErrorCode.SECURITY_DISABLED
    )
    creation.resource_type = 0
    assert send(CREATE_ACLS, 1, CreateAclsRequest(creations=[creation])) == CLOSED
    F = DeleteAclsRequest.DeleteAclsFilter
    flt = F(
        resource_type_filter=1,
        resource_name_filter=None,
        pattern_type_filter=2,
        principal_filter=None,
        host_filter=None,
        operation=1,
        permission_type=0,
    )
    assert send(DELETE_ACLS, 1, DeleteAclsRequest(filters=[flt])) == CLOSED  # UNKNOWN permission type


def test_alter_user_scram_credentials_an_upsertion_error_comes_first(target: Target) -> None:
    A = AlterUserScramCredentialsRequest
    req = A(
        deletions=[A.ScramCredentialDeletion(name="scram-user", mechanism=99)],
        upsertions=[
            # The user's last illegal upsertion decides (too few iterations), and wins over the deletion's.
            A.ScramCredentialUpsertion(
                name="scram-user", mechanism=77, iterations=8192, salt=b"s", salted_password=b"p"
            ),
            A.ScramCredentialUpsertion(
                name="scram-user", mechanism=1, iterations=10, salt=b"s", salted_password=b"p"
            ),
        ],
    )
    results = target.send(ALTER_USER_SCRAM_CREDENTIALS, 0, req).results
    assert [(r.user, r.error_code) for r in results] == [("scram-user", ErrorCode.UNACCEPTABLE_CREDENTIAL)]


def test_alter_client_quotas_answers_an_entity_as_a_map(target: Target) -> None:
    Q = AlterClientQuotasRequest
    twice = [
        Q.EntityData(entity_type="client-id", entity_name="a"),
        Q.EntityData(entity_type="client-id", entity_name="b"),
    ]
    op = Q.OpData(key="producer_byte_rate", value=1024.0, remove=False)
    req = Q(
        entries=[Q.EntryData(entity=twice, ops=[op]), Q.EntryData(entity=twice[1:], ops=[op])],
        validate_only=True,
    )
    entries = target.send(ALTER_CLIENT_QUOTAS, 1, req).entries
    assert [([(e.entity_type, e.entity_name) for e in x.entity], x.error_code) for x in entries] == [
        ([("client-id", "b")], ErrorCode.NONE)
    ]


def test_offset_for_leader_epoch_older_than_any_epoch(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
    E = OffsetForLeaderEpochRequest
    req = E(
        topics=[
            E.OffsetForLeaderTopic(
                topic=topic_name,
                partitions=[
                    E.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=-5)
                ],
            )
        ]
    )
    part = target.send(23, 2, req).topics[0].partitions[0]
    # Kafka's LeaderEpochFileCache: the requested epoch and the start offset of the first epoch it knows.
    assert (part.error_code, part.leader_epoch, part.end_offset) == (0, -5, 0)


def test_fetch_v13_unknown_topic_id_followed_by_another_partition_fails_the_request(
    broker: BrokerProcess, target: Target, topic_name: str
) -> None:
    unknown = b"\x07" * 16
    req = fetch("", 0, 0)
    req.topics[0].topic_id = unknown
    alone = target.send(FETCH, 13, req)
    assert alone.error_code == ErrorCode.NONE
    assert [p.error_code for t in alone.responses for p in t.partitions] == [ErrorCode.UNKNOWN_TOPIC_ID]
    # A second partition after it: Kafka's FetchResponse.toMessage compares the first one's (null) topic name.
    req.topics[0].partitions.append(
        FetchRequest.FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=1024)
    )
    both = target.send(FETCH, 13, req)
    assert (both.error_code, both.responses) == (ErrorCode.UNKNOWN_SERVER_ERROR, [])

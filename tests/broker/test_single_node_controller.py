"""The embedded single node answers the controller's admin APIs as a one-broker Kafka cluster does (issue 39 item 6):
ElectLeaders ELECTION_NOT_NEEDED per partition, an empty reassignment listing, a reassignment to its own replica
accepted and any other refused; with raw requests, kafka-python and confluent-kafka. Nothing moves."""

from __future__ import annotations

from confluent_kafka import ElectionType
from confluent_kafka import KafkaError as CKError
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, TopicPartition
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterPartitionReassignmentsRequest,
    ElectLeadersRequest,
    ListPartitionReassignmentsRequest,
    MetadataRequest,
)

from tests.broker_process import BrokerProcess
from tests.clients import RawClient

T = 15


def _leaders(bootstrap: str, topic: str) -> tuple[int, list[tuple[int, int, int]]]:
    """(controller id, [(partition, leader, leader epoch)])."""
    req = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False
    )
    with RawClient(bootstrap) as raw:
        resp = raw.request(3, 9, req)
    parts = resp.topics[0].partitions
    return resp.controller_id, sorted((p.partition_index, p.leader_id, p.leader_epoch) for p in parts)


def _create(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(T)


def test_raw_requests_get_a_single_node_clusters_answers(broker: BrokerProcess, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name)
    controller, before = _leaders(broker.bootstrap, topic_name)
    me = before[0][1]
    assert controller == me
    E = ElectLeadersRequest
    with RawClient(broker.bootstrap) as raw:
        for election_type in (0, 1):
            resp = raw.request(
                43,
                2,
                E(
                    election_type=election_type,
                    timeout_ms=5000,
                    topic_partitions=[E.TopicPartitions(topic=topic_name, partitions=[0, 1, 7])],
                ),
            )
            assert resp.error_code == 0
            got = {
                p.partition_id: p.error_code
                for r in resp.replica_election_results
                for p in r.partition_result
            }
            assert got == {
                0: ErrorCode.ELECTION_NOT_NEEDED,
                1: ErrorCode.ELECTION_NOT_NEEDED,
                7: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            }
        # An election over every partition lists only those elected or failed: none.
        resp = raw.request(43, 2, E(election_type=0, timeout_ms=5000, topic_partitions=None))
        assert resp.error_code == 0 and resp.replica_election_results == []

        A = AlterPartitionReassignmentsRequest
        resp = raw.request(
            45,
            0,
            A(
                timeout_ms=5000,
                topics=[
                    A.ReassignableTopic(
                        name=topic_name,
                        partitions=[
                            A.ReassignablePartition(partition_index=0, replicas=[me]),
                            A.ReassignablePartition(partition_index=1, replicas=[me + 1]),
                            A.ReassignablePartition(partition_index=1, replicas=None),
                        ],
                    )
                ],
            ),
        )
        assert resp.error_code == 0
        codes = [p.error_code for t in resp.responses for p in t.partitions]
        assert codes[0] == ErrorCode.NONE
        assert set(codes[1:]) <= {ErrorCode.INVALID_REPLICA_ASSIGNMENT, ErrorCode.NO_REASSIGNMENT_IN_PROGRESS}
        resp = raw.request(
            45,
            0,
            A(
                timeout_ms=5000,
                topics=[
                    A.ReassignableTopic(
                        name=topic_name,
                        partitions=[A.ReassignablePartition(partition_index=1, replicas=None)],
                    )
                ],
            ),
        )
        assert resp.responses[0].partitions[0].error_code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
        resp = raw.request(
            45,
            0,
            A(
                timeout_ms=5000,
                topics=[
                    A.ReassignableTopic(
                        name=topic_name,
                        partitions=[A.ReassignablePartition(partition_index=1, replicas=[me + 1])],
                    )
                ],
            ),
        )
        assert resp.responses[0].partitions[0].error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT

        L = ListPartitionReassignmentsRequest
        resp = raw.request(46, 0, L(timeout_ms=5000, topics=None))
        assert resp.error_code == 0 and resp.topics == []
    assert _leaders(broker.bootstrap, topic_name) == (controller, before)


def test_kafka_python_admin(broker: BrokerProcess, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name)
    _, before = _leaders(broker.bootstrap, topic_name)
    me = before[0][1]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        for election in (0, 1):
            # kafka-python treats ELECTION_NOT_NEEDED as success (it raised "Failed to find active controller id!")
            result = admin.elect_leaders(election, {topic_name: [0, 1]})
            assert {
                p.partition_id: p.error_code
                for r in result.replica_election_results
                for p in r.partition_result
            } == {0: ErrorCode.ELECTION_NOT_NEEDED, 1: ErrorCode.ELECTION_NOT_NEEDED}
        assert admin.alter_partition_reassignments({TopicPartition(topic_name, 0): [me]}) == {
            TopicPartition(topic_name, 0): None
        }
        assert admin.list_partition_reassignments() == {}
    finally:
        admin.close()
    assert _leaders(broker.bootstrap, topic_name)[1] == before


def test_confluent_kafka_elect_leaders(broker: BrokerProcess, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name)
    _, before = _leaders(broker.bootstrap, topic_name)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for election in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
        errors = admin.elect_leaders(
            election, [CKTopicPartition(topic_name, 0), CKTopicPartition(topic_name, 1)]
        ).result(T)
        assert {tp.partition: e.code() for tp, e in errors.items()} == {
            0: CKError.ELECTION_NOT_NEEDED,
            1: CKError.ELECTION_NOT_NEEDED,
        }
    assert _leaders(broker.bootstrap, topic_name)[1] == before

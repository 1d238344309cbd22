"""Answers Apache Kafka 3.9 gives that the replayed client sessions (tests/differential/replay.py: the Java client,
kafka-python) found kbroker giving otherwise; each asserted over a real socket against a real broker process."""

from __future__ import annotations

from typing import Any

from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import CreateTopicsRequest, ListOffsetsRequest

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess

LIST_OFFSETS, CREATE_TOPICS, API_VERSIONS = 2, 19, 18
LATEST_TIERED = -5


def test_list_offsets_v9_answers_the_latest_tiered_offset_as_kafka(
    broker: BrokerProcess, topic_name: str
) -> None:
    """The Java client and kafka-python ask ListOffsets v9 of Kafka 3.9; without remote storage Kafka answers the
    last tiered offset (-5) with offset, timestamp and leader epoch -1 and no error."""
    T, P = ListOffsetsRequest.ListOffsetsTopic, ListOffsetsRequest.ListOffsetsPartition
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        versions = {k.api_key: k.max_version for k in c.api_versions().api_keys}
        assert versions[LIST_OFFSETS] == 9

        def ask(version: int, timestamp: int, partition: int = 0) -> Any:
            req = ListOffsetsRequest(
                replica_id=-1,
                topics=[T(name=topic_name, partitions=[P(partition_index=partition, timestamp=timestamp)])],
            )
            return c.request(LIST_OFFSETS, version, req).topics[0].partitions[0]

        tiered = ask(9, LATEST_TIERED)
        assert (tiered.error_code, tiered.offset, tiered.timestamp, tiered.leader_epoch) == (0, -1, -1, -1)
        assert ask(8, LATEST_TIERED).error_code == ErrorCode.UNSUPPORTED_VERSION
        assert ask(9, LATEST_TIERED, partition=7).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        latest = ask(9, -1)
        assert (latest.error_code, latest.offset, latest.leader_epoch) == (0, 0, 0)


def test_create_topics_failure_answers_empty_configs(broker: BrokerProcess, topic_name: str) -> None:
    """Kafka's KafkaApis resets a failed topic's configs to an empty list (v5+), never null: an existing topic and an
    invalid config value alike."""
    Topic, Config = CreateTopicsRequest.CreatableTopic, CreateTopicsRequest.CreatableTopicConfig
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic_name)
        req = CreateTopicsRequest(
            topics=[
                Topic(name=topic_name, num_partitions=1, replication_factor=1),
                Topic(
                    name=f"{topic_name}-bad",
                    num_partitions=1,
                    replication_factor=1,
                    configs=[Config(name="cleanup.policy", value="bogus")],
                ),
            ],
            timeout_ms=10000,
        )
        got = {
            t.name: (t.error_code, t.configs, t.num_partitions)
            for t in c.request(CREATE_TOPICS, 7, req).topics
        }
        assert got == {
            topic_name: (ErrorCode.TOPIC_ALREADY_EXISTS, [], -1),
            f"{topic_name}-bad": (ErrorCode.INVALID_CONFIG, [], -1),
        }

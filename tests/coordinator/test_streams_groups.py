"""KIP-1071 streams groups over raw requests: StreamsGroupHeartbeat's answers and error codes (unknown member,
fenced epoch, invalid topology, invalid requests), internal topic creation, StreamsGroupDescribe and ListGroups,
compared with Apache Kafka 4.4.0's answers to the same requests (tests/coordinator/streams_heartbeat_scenario.py;
`python -m tests.coordinator.streams_heartbeat_scenario` runs it on both brokers side by side)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol.messages import ApiVersionsRequest

from tests.broker_process import BrokerProcess
from tests.clients import RawClient
from tests.coordinator.streams_heartbeat_scenario import kafka_answers, run


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("streams-groups"), {"offsets.topic.num.partitions": "3"}
    ).start()
    yield b
    b.stop()


def test_heartbeat_answers_as_kafka_4_4(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("streams-src", 2, 1)])["streams-src"].result(30)
    assert run(broker.bootstrap, "streams-src", "streams-app") == kafka_answers("streams-app")
    # The changelog topic was created by the broker with the source's partition count.
    md = admin.list_topics("streams-app-store-changelog", timeout=10)
    assert len(md.topics["streams-app-store-changelog"].partitions) == 2


def advertised(bootstrap: str) -> dict[int, tuple[int, int]]:
    with RawClient(bootstrap) as raw:
        return {
            k.api_key: (k.min_version, k.max_version)
            for k in raw.request(18, 3, ApiVersionsRequest()).api_keys
        }


def test_streams_apis_advertised_only_when_the_protocol_is_on(broker: BrokerProcess, tmp_path: Path) -> None:
    on = advertised(broker.bootstrap)
    assert (on[88], on[89]) == ((0, 1), (0, 0))
    off = BrokerProcess(
        tmp_path / "off", {"group.coordinator.rebalance.protocols": "classic,consumer"}
    ).start()
    try:
        assert not {88, 89} & set(advertised(off.bootstrap))
    finally:
        off.stop()

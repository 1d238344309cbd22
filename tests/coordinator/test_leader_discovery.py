"""KIP-951 leader discovery: a broker that is not a partition's leader answers Produce v10+ and Fetch v16+ with
NOT_LEADER_OR_FOLLOWER plus the leader and epoch it knows and that leader's endpoint, so a client retries at the
right broker without a Metadata round trip; older versions carry neither. Two real brokers on a real ZooKeeper:
raw requests decoded with the codec, then librdkafka (2.4+ reads these fields) through a leader move."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import FetchRequest, MetadataRequest, ProduceRequest
from kbroker.protocol.records import build_batch

from tests.broker_process import BrokerProcess, wait_all_registered
from tests.clients import RawClient, wait_until
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

T = 15
TOPIC = "hinted"


@pytest.fixture(scope="module")
def brokers(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, BrokerProcess]]:
    base: Path = tmp_path_factory.mktemp("hints")
    bs = {b: BrokerProcess(base / f"b{b}", {"zookeeper.connect": zookeeper.connect, "broker.id": str(b),
                                             "auto.leader.rebalance.enable": "false",
                                             # the last broker's controlled shutdown has nowhere to move its
                                             # leaderships: 3 retries of 200 ms, not Kafka's default 5 s
                                             "controlled.shutdown.retry.backoff.ms": "200"}) for b in (1, 2)}
    for b in bs.values():
        b.start()
    wait_all_registered(list(bs.values()), timeout=T)
    admin = AdminClient({"bootstrap.servers": bs[1].bootstrap})
    # Broker 2 holds the partition alone: broker 1 is no replica of it (a follower would serve a consumer's Fetch
    # v11+ itself, KIP-392, as Kafka does).
    admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[2]])])[TOPIC].result(T)
    yield bs
    for b in bs.values():
        b.stop()


def _produce(b: BrokerProcess, version: int) -> tuple[object, list[object]]:
    req = ProduceRequest(transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
        ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[
            ProduceRequest.PartitionProduceData(index=0, records=build_batch([(None, b"v", (), 0)]))])])
    with RawClient(b.bootstrap) as raw:
        resp = raw.request(0, version, req)
    [pr] = resp.responses[0].partition_responses
    return pr, resp.node_endpoints


def _fetch(b: BrokerProcess, version: int) -> tuple[object, list[object]]:
    with RawClient(b.bootstrap) as raw:
        md = raw.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)],
                                                allow_auto_topic_creation=False))
        topic_id = md.topics[0].topic_id
        req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                           session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(
                               topic=TOPIC, topic_id=topic_id, partitions=[FetchRequest.FetchPartition(
                                   partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
        resp = raw.request(1, version, req)
    [pd] = resp.responses[0].partitions
    return pd, resp.node_endpoints


@pytest.mark.parametrize("call, version", [(_produce, 10), (_produce, 11), (_fetch, 16), (_fetch, 17)])
def test_a_follower_names_the_leader_and_its_endpoint(brokers: dict[int, BrokerProcess], call: object,
                                                     version: int) -> None:
    part, endpoints = call(brokers[1], version)  # type: ignore[operator]
    assert part.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER  # type: ignore[attr-defined]
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (2, 0)  # type: ignore[attr-defined]
    assert [(e.node_id, e.host, e.port) for e in endpoints] == [  # type: ignore[attr-defined]
        (2, "127.0.0.1", brokers[2].port)]


@pytest.mark.parametrize("call, version", [(_produce, 9), (_fetch, 15)])
def test_older_versions_carry_no_leader(brokers: dict[int, BrokerProcess], call: object, version: int) -> None:
    part, endpoints = call(brokers[1], version)  # type: ignore[operator]
    assert part.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER  # type: ignore[attr-defined]
    assert part.current_leader.leader_id == -1 and endpoints == []  # type: ignore[attr-defined]


def test_librdkafka_follows_a_moved_leader(brokers: dict[int, BrokerProcess]) -> None:
    """Broker 1 leads `moving`; its SIGTERM (controlled shutdown) moves the leadership to broker 2 while an
    idempotent acks=all librdkafka producer writes without pause: its requests that reach broker 1 after the move
    get NOT_LEADER_OR_FOLLOWER naming broker 2, and every record is acknowledged, none refused."""
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic("moving", 1, replica_assignment=[[1, 2]])])["moving"].result(T)
    errors: list[object] = []
    acked: list[float] = []
    done = threading.Event()
    sent = 0

    def produce() -> None:
        nonlocal sent
        p = Producer({"bootstrap.servers": brokers[2].bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 0})
        while not done.is_set():
            p.produce("moving", str(sent).encode(), on_delivery=lambda e, _m: errors.append(e) if e else
                      acked.append(time.monotonic()))
            sent += 1
            p.poll(0.005)
        assert p.flush(T) == 0

    producer = threading.Thread(target=produce)
    producer.start()
    wait_until(lambda: len(acked) >= 50, timeout=T, what="the producer running")
    brokers[1].stop()
    time.sleep(1.5)
    done.set()
    producer.join(T + 5)
    brokers[1].start()
    assert not errors and len(acked) == sent
    pause = max(b - a for a, b in zip(acked, acked[1:], strict=False))
    print(f"longest wait between acknowledgements: {pause * 1000:.0f} ms")


def test_a_follower_serves_consumer_fetch_v11_and_the_debugging_replica(brokers: dict[int, BrokerProcess]) -> None:
    """KIP-392 as Kafka 3.9 has it without a replica selector: from Fetch v11 a consumer may read a follower, up to
    the follower's high watermark; before v11 it gets NOT_LEADER_OR_FOLLOWER. ListOffsets from the debugging replica
    (-2) answers a follower's log end offset."""
    from kbroker.protocol.messages import ListOffsetsRequest

    topic = "follower-read"
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[2, 1]])])[topic].result(T)
    p = Producer({"bootstrap.servers": brokers[2].bootstrap, "acks": "all"})
    for i in range(5):
        p.produce(topic, f"v{i}".encode())
    assert p.flush(T) == 0

    def fetch(version: int) -> object:
        with RawClient(brokers[1].bootstrap) as raw:
            req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                               session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                   topic=topic, partitions=[FetchRequest.FetchPartition(
                                       partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
            return raw.request(1, version, req).responses[0].partitions[0]

    # The follower's high watermark reaches 5 with its next fetch after the acks=all answer.
    part = wait_until(lambda: (pd := fetch(12)).high_watermark == 5 and pd, timeout=T, what="follower at 5")
    assert part.error_code == 0 and part.records
    assert fetch(10).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER  # type: ignore[attr-defined]
    with RawClient(brokers[1].bootstrap) as raw:
        resp = raw.request(2, 7, ListOffsetsRequest(replica_id=-2, isolation_level=0, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)])]))
        consumer = raw.request(2, 7, ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)])]))
    lo = resp.topics[0].partitions[0]
    assert (lo.error_code, lo.offset) == (0, 5)
    assert consumer.topics[0].partitions[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER

"""Leadership changes seen from a follower's long poll (replica.fetch.wait.max.ms 10 s here, so the follower's
fetch waits at its leader for that long whenever there is nothing new):

- A follower given a new partition of that leader (a topic created, a leadership moved) must start copying it at
  once, not when the parked fetch returns; else the first acks=all produce to the partition waits up to those 10 s
  for the ISR, and after a controlled shutdown or a failover every moved partition would too.
- A follower learns the high watermark from its next fetch answer. Made leader before that, its high watermark is
  below what the old leader acknowledged: its "latest offset" would go backwards, so ListOffsets answers
  OFFSET_NOT_AVAILABLE (retriable) until it catches up, as Kafka's maybeOffsetsError does.

Two real brokers on a real ZooKeeper (broker 2 starts first: the controller); confluent-kafka and kafka-python."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ElectionType, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ListOffsetsRequest

from tests.broker_process import BrokerProcess, wait_all_registered
from tests.clients import RawClient
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

WAIT_MS = 10_000  # the followers' long polls
T = 15


@pytest.fixture(scope="module")
def brokers(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, BrokerProcess]]:
    base: Path = tmp_path_factory.mktemp("newparts")
    bs = {b: BrokerProcess(base / f"b{b}", {"zookeeper.connect": zookeeper.connect, "broker.id": str(b),
                                             "replica.fetch.wait.max.ms": str(WAIT_MS), "num.partitions": "1",
                                             # the last broker's controlled shutdown has nowhere to move its
                                             # leaderships: 3 retries of 200 ms, not Kafka's default 5 s
                                             "controlled.shutdown.retry.backoff.ms": "200"})
          for b in (1, 2)}
    for b in (2, 1):  # broker 2 is the controller: the last test freezes broker 1
        bs[b].start()
    wait_all_registered(list(bs.values()), timeout=T)
    yield bs
    for b in bs.values():
        b.stop()


def _create(b: BrokerProcess, topic: str, leader: int) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    follower = 2 if leader == 1 else 1
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[leader, follower]],
                                  config={"min.insync.replicas": "2"})])[topic].result(T)


def test_a_new_partition_is_copied_while_the_followers_fetch_is_parked(brokers: dict[int, BrokerProcess]) -> None:
    bootstrap = brokers[1].bootstrap
    # Broker 2 follows broker 1 for `idle`; with nothing to copy its fetch then waits at broker 1 for up to 10 s.
    _create(brokers[1], "idle", leader=1)
    time.sleep(1.0)

    # A new partition of broker 1 with min.insync.replicas 2: each first acks=all answer needs broker 2 to copy it.
    _create(brokers[1], "fresh-ck", leader=1)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    delivered: list[float] = []
    t0 = time.monotonic()
    p.produce("fresh-ck", b"first", on_delivery=lambda err, _m: delivered.append(time.monotonic() - t0)
              if err is None else pytest.fail(str(err)))
    assert p.flush(T) == 0
    assert delivered and delivered[0] < 3.0, f"first acks=all produce took {delivered[0]:.2f} s"

    _create(brokers[1], "fresh-kp", leader=1)
    kp = KafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=30000)
    try:
        t0 = time.monotonic()
        md = kp.send("fresh-kp", b"first").get(timeout=T)
        took = time.monotonic() - t0
    finally:
        kp.close()
    assert md.offset == 0
    assert took < 3.0, f"first acks=all produce took {took:.2f} s"
    log = brokers[2].read_log()
    # Given up with its connection and fetched again at once, without a warning.
    assert "fetch from broker 1 failed" not in log, log[-3000:]


def test_a_new_leader_behind_on_the_high_watermark_answers_offset_not_available(
        brokers: dict[int, BrokerProcess]) -> None:
    topic = "lagging"
    _create(brokers[2], topic, leader=1)
    p = Producer({"bootstrap.servers": brokers[1].bootstrap, "acks": "all"})
    p.produce(topic, b"acked", partition=0)
    assert p.flush(T) == 0  # broker 2 has it; it hears the high watermark 1 only in its next fetch answer, 10 s away
    kp = KafkaAdminClient(bootstrap_servers=brokers[2].bootstrap, request_timeout_ms=10000)
    try:
        kp.alter_partition_reassignments({TopicPartition(topic, 0): [2, 1]})  # broker 2 preferred, 1 still leads
    finally:
        kp.close()
    frozen = brokers[1].proc
    assert frozen is not None
    os.kill(frozen.pid, signal.SIGSTOP)  # the old leader answers nothing more: the new one stays behind
    try:
        admin = AdminClient({"bootstrap.servers": brokers[2].bootstrap})  # kept referenced: it must outlive the future
        errors = admin.elect_leaders(ElectionType.PREFERRED, [CKTopicPartition(topic, 0)]).result(T)
        assert errors[CKTopicPartition(topic, 0)] is None
        req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
            name=topic, partitions=[ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)])])
        deadline = time.monotonic() + T
        while True:
            with RawClient(brokers[2].bootstrap) as raw:
                part = raw.request(2, 7, req).topics[0].partitions[0]
            if part.error_code != ErrorCode.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # the LeaderAndIsr is on its way
        # Not 0: the record at offset 0 was acknowledged.
        assert (part.error_code, part.offset) == (ErrorCode.OFFSET_NOT_AVAILABLE, -1), part
        consumer = Consumer({"bootstrap.servers": brokers[2].bootstrap, "group.id": "lagging"})
        try:
            with pytest.raises(KafkaException) as refused:
                consumer.get_watermark_offsets(CKTopicPartition(topic, 0), timeout=5)
            assert refused.value.args[0].code() == KafkaError.OFFSET_NOT_AVAILABLE
        finally:
            consumer.close()
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    # Broker 1 follows now; its first fetch moves broker 2's high watermark to 1, and the answer with it.
    consumer = Consumer({"bootstrap.servers": brokers[2].bootstrap, "group.id": "lagging"})
    try:
        deadline = time.monotonic() + T
        while True:
            try:
                assert consumer.get_watermark_offsets(CKTopicPartition(topic, 0), timeout=5) == (0, 1)
                break
            except KafkaException as e:  # retriable: asked again, as a client does
                assert e.args[0].code() == KafkaError.OFFSET_NOT_AVAILABLE and time.monotonic() < deadline, e
                time.sleep(0.1)
    finally:
        consumer.close()

"""A follower whose fetch is parked at its leader is given a new partition of that leader (a topic created, a
leadership moved): it must start copying it at once, not when the parked fetch returns. With long follower long
polls (replica.fetch.wait.max.ms 10 s here) the first acks=all produce to the new partition would otherwise wait
up to those 10 s for the ISR, and after a controlled shutdown or a failover every moved partition would too.

Two real brokers on a real ZooKeeper; confluent-kafka and kafka-python producers with acks=all."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from tests.broker_process import BrokerProcess
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
    for b in bs.values():
        b.start()
    admin = AdminClient({"bootstrap.servers": bs[1].bootstrap})
    deadline = time.monotonic() + T
    while len(admin.list_topics(timeout=10).brokers) < 2:
        assert time.monotonic() < deadline, "two brokers registered"
        time.sleep(0.1)
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

"""Replication's direct paths against their references on one real cluster: brokers 1 and 3 run the leader's direct
answer to a follower's incremental Fetch (broker/follower_fetch.py) and the follower's direct request and apply
(broker/replica_fetch_codec.py), broker 2 runs the generated codec for both (KBROKER_FOLLOWER_FETCH_DIRECT=0,
KBROKER_REPLICA_FETCH_DIRECT=0). Each partition has a direct and a reference leader in turn, and followers of both
kinds; acks=all data from a real producer must end up byte for byte the same in every replica's log, and a
follower killed and restarted must catch up from a leader of the other kind. The whole cluster on the reference
paths is tests/coordinator/test_replication_data.py run with both variables at 0."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess, wait_all_registered
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

REFERENCE = {"KBROKER_FOLLOWER_FETCH_DIRECT": "0", "KBROKER_REPLICA_FETCH_DIRECT": "0"}
DIRECT = {"KBROKER_FOLLOWER_FETCH_DIRECT": "1", "KBROKER_REPLICA_FETCH_DIRECT": "1"}
TOPIC = "mixed-paths"


@pytest.fixture(scope="module")
def brokers(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, BrokerProcess]]:
    base = tmp_path_factory.mktemp("mixed")
    out = {
        i: BrokerProcess(
            base / f"b{i}",
            {
                "zookeeper.connect": zookeeper.connect,
                "broker.id": str(i),
                "zookeeper.session.timeout.ms": "4000",
                "replica.lag.time.max.ms": "2000",
                "replica.fetch.backoff.ms": "200",
                "auto.leader.rebalance.enable": "false",
            },
            env=REFERENCE if i == 2 else DIRECT,
        )
        for i in (1, 2, 3)
    }
    try:
        for b in out.values():
            b.start()
        wait_all_registered(list(out.values()), timeout=30)
        yield out
    finally:
        for b in out.values():
            if b.proc is not None:
                os.kill(b.proc.pid, signal.SIGCONT)
            b.kill()


def wait_for(cond: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except Exception:  # noqa: BLE001 - a broker starting or gone: ask again
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what}")


def bootstrap(brokers: dict[int, BrokerProcess]) -> str:
    return ",".join(b.bootstrap for b in brokers.values() if b.alive())


def isrs(brokers: dict[int, BrokerProcess]) -> dict[int, tuple[int, set[int]]]:
    md = AdminClient({"bootstrap.servers": bootstrap(brokers)}).list_topics(topic=TOPIC, timeout=10)
    return {i: (p.leader, set(p.isrs)) for i, p in md.topics[TOPIC].partitions.items()}


def log_bytes(b: BrokerProcess, partition: int) -> bytes:
    d = b.data_dir / "logs" / f"{TOPIC}-{partition}"
    return b"".join(Path(f).read_bytes() for f in sorted(d.glob("*.log")))


def produce(brokers: dict[int, BrokerProcess], start: int, end: int) -> None:
    errors: list[Any] = []
    p = Producer(
        {"bootstrap.servers": bootstrap(brokers), "acks": "all", "enable.idempotence": True, "linger.ms": 0}
    )
    for i in range(start, end):
        p.produce(
            TOPIC,
            key=b"%d" % i,
            value=b"v%d" % i * 7,
            partition=i % 2,
            on_delivery=lambda err, _m: errors.append(err) if err is not None else None,
        )
        p.poll(0)
    assert p.flush(60) == 0 and errors == []


def consumed(brokers: dict[int, BrokerProcess], partition: int, count: int) -> list[bytes]:
    c = Consumer(
        {"bootstrap.servers": bootstrap(brokers), "group.id": "mixed-paths", "enable.auto.commit": False}
    )
    try:
        c.assign([TopicPartition(TOPIC, partition, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(out) < count and time.monotonic() < deadline:
            out += [m.key() for m in c.consume(1000, 0.5) if m.error() is None]
        return out
    finally:
        c.close()


def same_logs(brokers: dict[int, BrokerProcess]) -> bool:
    return all(len({log_bytes(b, p) for b in brokers.values()}) == 1 for p in (0, 1))


def test_direct_and_reference_replication_write_the_same_logs(brokers: dict[int, BrokerProcess]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    # Partition 0 led by a direct broker (followers: one reference, one direct), partition 1 by the reference one.
    topic = NewTopic(
        TOPIC,
        num_partitions=2,
        replica_assignment=[[1, 2, 3], [2, 1, 3]],
        config={"min.insync.replicas": "2"},
    )
    for f in admin.create_topics([topic]).values():
        f.result(20)
    wait_for(
        lambda: isrs(brokers) == {0: (1, {1, 2, 3}), 1: (2, {1, 2, 3})}, "both partitions with full ISRs"
    )

    produce(brokers, 0, 3000)
    wait_for(lambda: same_logs(brokers), "every replica's log the same bytes")
    for p in (0, 1):
        assert consumed(brokers, p, 1500) == [b"%d" % i for i in range(p, 3000, 2)]

    # Broker 1 dies: partition 0 moves to the reference leader; broker 1 comes back as a direct follower of it,
    # and broker 3 (direct) follows it meanwhile.
    brokers[1].kill()
    wait_for(
        lambda: isrs(brokers)[0][0] in (2, 3) and 1 not in isrs(brokers)[0][1], "partition 0 without broker 1"
    )
    produce(brokers, 3000, 5000)
    brokers[1].start()
    wait_for(
        lambda: all(isr == {1, 2, 3} for _, isr in isrs(brokers).values()), "broker 1 back in both ISRs", 90
    )
    produce(brokers, 5000, 6000)
    wait_for(lambda: same_logs(brokers), "every replica's log the same bytes after the failover")
    for p in (0, 1):
        assert consumed(brokers, p, 3000) == [b"%d" % i for i in range(p, 6000, 2)]

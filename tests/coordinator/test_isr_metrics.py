"""IsrShrinksPerSec / IsrExpandsPerSec on two real brokers sharing a real ZooKeeper: a follower frozen with SIGSTOP
leaves the ISR of the partitions broker 1 leads, thawed it rejoins, and broker 1's Prometheus counters
(`kafka_server_replicamanager_isrshrinks_total`, `_isrexpands_total`, as configs/grafana-dashboard.json reads them)
move by one per partition each time, as Metadata shows and while confluent-kafka produces with acks=all."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol.messages import MetadataRequest

from tests.broker_process import BrokerProcess, free_port, wait_all_registered
from tests.clients import RawClient, wait_until
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

LAG_MS = 1000  # replica.lag.time.max.ms: a frozen follower leaves the ISR after about this long
SESSION_MS = (
    10000  # longer than the freeze, so the ISR shrinks because of lag and not a lost ZooKeeper session
)
PARTITIONS = 2


@pytest.fixture(scope="module")
def brokers(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BrokerProcess, BrokerProcess, int]]:
    base = tmp_path_factory.mktemp("isr-metrics")
    metrics_port = free_port()
    common = {
        "zookeeper.connect": zookeeper.connect,
        "zookeeper.session.timeout.ms": str(SESSION_MS),
        "zookeeper.connection.timeout.ms": "5000",
        "replica.lag.time.max.ms": str(LAG_MS),
        "replica.fetch.backoff.ms": "200",
        "auto.leader.rebalance.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
    }
    leader = BrokerProcess(
        base / "b1",
        {**common, "broker.id": "1", "metrics.host": "127.0.0.1", "metrics.port": str(metrics_port)},
    )
    follower = BrokerProcess(base / "b2", {**common, "broker.id": "2"})
    try:
        leader.start()
        follower.start()
        wait_all_registered([leader, follower], timeout=30)
        yield leader, follower, metrics_port
    finally:
        for b in (follower, leader):
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.proc.pid, signal.SIGCONT)
            b.kill()


def isr_counters(metrics_port: int) -> tuple[float, float]:
    """(isrshrinks_total, isrexpands_total) from a broker's Prometheus endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()

    def counter(kind: str) -> float:
        m = re.search(rf"^kafka_server_replicamanager_isr{kind}_total (\S+)$", text, re.M)
        assert m is not None, f"kafka_server_replicamanager_isr{kind}_total missing from /metrics"
        return float(m.group(1))

    return counter("shrinks"), counter("expands")


def isrs(bootstrap: str, topic: str) -> dict[int, set[int]]:
    """Each partition's ISR in a Metadata answer of the broker at `bootstrap` itself (the clients' admin tools
    ask whichever broker they like, and the frozen one answers nothing)."""
    with RawClient(bootstrap, timeout=10) as raw:
        md = raw.request(
            3,
            12,
            MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False
            ),
        )
    (t,) = md.topics
    return {p.partition_index: set(p.isr_nodes) for p in t.partitions}


def test_a_frozen_follower_shrinks_then_expands_the_isr_and_the_counters_follow(
    brokers: tuple[BrokerProcess, BrokerProcess, int],
) -> None:
    leader, follower, metrics_port = brokers
    topic = "isr-moves"
    admin = AdminClient(
        {"bootstrap.servers": leader.bootstrap}
    )  # held: a collected client cancels its requests
    admin.create_topics([NewTopic(topic, PARTITIONS, replica_assignment=[[1, 2]] * PARTITIONS)])[
        topic
    ].result(30)
    p = Producer({"bootstrap.servers": leader.bootstrap, "acks": "all"})
    wait_until(
        lambda: isrs(leader.bootstrap, topic) == {i: {1, 2} for i in range(PARTITIONS)},
        timeout=30,
        interval=0.2,
        what="both replicas in sync",
    )
    for i in range(20):
        p.produce(topic, f"before-{i}".encode(), partition=i % PARTITIONS)
    assert p.flush(30) == 0
    shrinks0, expands0 = isr_counters(metrics_port)

    assert follower.proc is not None
    os.kill(follower.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        wait_until(
            lambda: isrs(leader.bootstrap, topic) == {i: {1} for i in range(PARTITIONS)},
            timeout=20,
            interval=0.2,
            what="the frozen follower out of every ISR",
        )
        assert time.monotonic() - t0 < SESSION_MS / 1000, (
            "the ISR shrank only when the ZooKeeper session ended"
        )
        wait_until(
            lambda: isr_counters(metrics_port)[0] >= shrinks0 + PARTITIONS,
            timeout=10,
            interval=0.2,
            what="one ISR shrink counted per partition",
        )
        shrinks1, expands1 = isr_counters(metrics_port)
        assert shrinks1 - shrinks0 == PARTITIONS and expands1 == expands0
        for i in range(20):  # acks=all with the ISR down to the leader: accepted, and left for the follower
            p.produce(topic, f"while-frozen-{i}".encode(), partition=i % PARTITIONS)
        assert p.flush(30) == 0
    finally:
        os.kill(follower.proc.pid, signal.SIGCONT)

    wait_until(
        lambda: isrs(leader.bootstrap, topic) == {i: {1, 2} for i in range(PARTITIONS)},
        timeout=30,
        interval=0.2,
        what="the thawed follower back in every ISR",
    )
    wait_until(
        lambda: isr_counters(metrics_port)[1] >= expands1 + PARTITIONS,
        timeout=10,
        interval=0.2,
        what="one ISR expansion counted per partition",
    )
    shrinks2, expands2 = isr_counters(metrics_port)
    assert expands2 - expands1 == PARTITIONS and shrinks2 == shrinks1

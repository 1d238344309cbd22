"""The Java client (kafka-clients 3.9.1) in a group migrating online between the classic protocol and
group.protocol=consumer (KIP-848) against a real kbroker: MixedGroupCompat.java runs two classic members
(cooperative-sticky, then range), adds a consumer-protocol member (the broker upgrades the group) and removes it
(the broker downgrades it) while records are produced here; every record is consumed and the committed offsets
(read back with confluent-kafka) are the partitions' ends."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess
from tests.java.test_java_client import _missing, compile_java

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "MixedGroupCompat.java", HERE / "org" / "slf4j" / "impl" / "StaticLoggerBinder.java"]
PARTITIONS, RECORDS = 6, 1200

_why = _missing()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_java(tmp_path_factory, SOURCES, "java-classes")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), {"group.consumer.heartbeat.interval.ms": "300",
                                                          "group.consumer.min.heartbeat.interval.ms": "100",
                                                          "group.initial.rebalance.delay.ms": "200",
                                                          "offsets.topic.num.partitions": "4"})
    b.start()
    yield b
    b.stop()


def produce_steadily(bootstrap: str, topic: str) -> threading.Thread:
    def run() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(RECORDS):
            p.produce(topic, str(i).encode(), partition=i % PARTITIONS)
            if i % 20 == 19:
                p.poll(0)
                time.sleep(20 / 300)
        p.flush(30)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_java_group_upgrades_and_downgrades(classpath: str, broker: BrokerProcess, topic_name: str,
                                            assignor: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])[topic_name].result(30)
    group = "javamig-" + topic_name
    producer = produce_steadily(broker.bootstrap, topic_name)
    r = subprocess.run(["java", "-Dkcompat.log=WARN", "-cp", classpath, "MixedGroupCompat", broker.bootstrap,
                        topic_name, group, str(PARTITIONS), str(RECORDS), assignor],
                       capture_output=True, text=True, timeout=150)
    producer.join(30)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[-1:] == ["DONE"], (
        f"{[x for x in lines if not x.startswith('R ')]}\n{r.stderr[-6000:]}\n--- broker log:\n"
        f"{broker.read_log()[-4000:]}")
    mixed = next(x for x in lines if x.startswith("OK mixed")).split()
    assert all(int(n) > 0 for n in mixed[2:]) and sum(int(n) for n in mixed[2:]) == PARTITIONS
    consumed: dict[int, set[int]] = {}
    for x in lines:
        if x.startswith("R "):
            _, p, o = x.split()
            consumed.setdefault(int(p), set()).add(int(o))
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic_name, q) for q in range(PARTITIONS)], timeout=10)
        commits = {tp.partition: tp.offset for tp in got}
    finally:
        c.close()
    # Nothing lost: every offset below the committed one was consumed; the commits are the partitions' ends.
    assert commits == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}, [
        x for x in lines if not x.startswith("R ")]
    for p, end in commits.items():
        assert set(range(end)) <= consumed.get(p, set()), f"partition {p} has gaps"
    log = broker.read_log()
    assert f"Classic group {group} upgraded to a consumer group" in log
    assert f"consumer group {group}; the group is downgraded to a classic group" in log

"""The Java client (kafka-clients 3.9.1) with group.protocol=consumer (KIP-848, ConsumerGroupHeartbeat v0)
against a real kbroker: ConsumerGroupCompat.java shares a topic between two members, closes one, and checks
that the other takes every partition and reads every record; commits go through OffsetCommit v9 with the
member epoch, and are read back here with confluent-kafka."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess
from tests.java.test_java_client import _missing, compile_java

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "ConsumerGroupCompat.java", HERE / "GroupDescribeCompat.java",
           HERE / "org" / "slf4j" / "impl" / "StaticLoggerBinder.java"]

_why = _missing()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_java(tmp_path_factory, SOURCES, "java-classes")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), {"group.consumer.heartbeat.interval.ms": "300",
                                                          "group.consumer.min.heartbeat.interval.ms": "100",
                                                          "offsets.topic.num.partitions": "4"})
    b.start()
    yield b
    b.stop()


def test_java_members_share_then_one_takes_over(classpath: str, broker: BrokerProcess, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 4, 1)])[topic_name].result(30)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(400):
        p.produce(topic_name, str(i).encode(), partition=i % 4)
    p.flush(30)
    group = "java-" + topic_name
    r = subprocess.run(["java", "-Dkcompat.log=WARN", "-cp", classpath, "ConsumerGroupCompat", broker.bootstrap,
                        topic_name, group, "4", "400"], capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[-1:] == ["DONE"], (
        f"{r.stdout}\n{r.stderr[-6000:]}\n--- broker log:\n{broker.read_log()[-4000:]}")
    shared = next(line for line in lines if line.startswith("OK shared")).split()
    assert int(shared[2]) > 0 and int(shared[3]) > 0 and int(shared[2]) + int(shared[3]) == 4
    assert "OK takeover 4 400" in lines
    assert "OK committed 400" in lines
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic_name, q) for q in range(4)], timeout=10)
        assert {tp.partition: tp.offset for tp in got} == {0: 100, 1: 100, 2: 100, 3: 100}
    finally:
        c.close()
    log = broker.read_log()
    assert "joins consumer group " + group in log and "left consumer group " + group in log


def test_java_admin_describes_a_consumer_group(classpath: str, broker: BrokerProcess, topic_name: str) -> None:
    """describeConsumerGroups of the Java Admin 3.9 (ConsumerGroupDescribe) sees the members and their partitions;
    the classic DescribeGroups answers Dead for a consumer group, as Kafka 3.9's GroupMetadataManager does."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 4, 1)])[topic_name].result(30)
    group = "java-describe-" + topic_name
    r = subprocess.run(["java", "-Dkcompat.log=WARN", "-cp", classpath, "GroupDescribeCompat", broker.bootstrap,
                        topic_name, group, "4"], capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[-1:] == ["DONE"], (
        f"{r.stdout}\n{r.stderr[-6000:]}\n--- broker log:\n{broker.read_log()[-4000:]}")
    assert "OK described Stable Consumer 2 4 uniform" in lines
    assert "OK empty Empty Consumer 0" in lines

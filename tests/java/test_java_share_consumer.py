"""Kafka 4.2's KafkaShareConsumer (KIP-932) against a real kbroker: three share consumers on a two-partition topic
(more consumers than partitions) with explicit acknowledgement; released records come back with a higher delivery
count, rejected ones are archived, every other record's acceptance is confirmed
exactly once (a refused acknowledgement brings the record back: delivery is at least once)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from bench.peers.maven import ArtifactUnavailable, classpath
from bench.share_groups import assigned_members
from tests.broker_process import BrokerProcess

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "share" / "ShareConsumerCompat.java"]
CLIENTS = ["org.apache.kafka:kafka-clients:4.2.0"]


@pytest.fixture(scope="module")
def share_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("javac/java not on PATH (install a JDK, e.g. openjdk-17-jdk-headless)")
    try:
        jars = classpath("kafka-clients-4.2", CLIENTS)
    except ArtifactUnavailable as e:
        pytest.skip(f"kafka-clients 4.2 unavailable: {e}")
    return compile_compat(tmp_path_factory.mktemp("share-java"), jars)


def compile_compat(out: Path, jars: str) -> str:
    """ShareConsumerCompat compiled into out: the classpath to run it."""
    r = subprocess.run(
        ["javac", "-d", str(out), "-cp", jars, *map(str, SOURCES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"javac failed:\n{r.stdout}\n{r.stderr}"
    return os.pathsep.join([str(out), jars])


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        {
            "group.share.heartbeat.interval.ms": "500",
            "group.share.min.heartbeat.interval.ms": "100",
            "offsets.topic.num.partitions": "2",
        },
    )
    b.start()
    yield b
    b.stop()


def set_group_config(bootstrap: str, group: str, name: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([res])[res].result(30)


def test_three_share_consumers_on_two_partitions(
    share_classpath: str, broker: BrokerProcess, topic_name: str
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(30)
    group = "share-" + topic_name
    set_group_config(broker.bootstrap, group, "share.auto.offset.reset", "earliest")
    cmd = [
        "java",
        "-cp",
        share_classpath,
        "ShareConsumerCompat",
        broker.bootstrap,
        topic_name,
        group,
        "600",
        "6000",
        "20",
        "50",
        # the records are produced once all three have joined: a member that has none 45 s after it subscribed is one
        # whose partitions the others took whole (it would otherwise wait the default 90 s)
        "45000",
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)
    ]
    # The records come once all three have joined and heard their assignment (heartbeats every 500 ms): a JVM
    # that starts seconds after the others on a busy machine would otherwise find them all taken (a ShareFetch
    # acquires whole batches), and a member told of a new assignment while it holds records gives them back.
    deadline = time.monotonic() + 120
    while assigned_members(broker.bootstrap, group) < 3:
        assert time.monotonic() < deadline and all(q.poll() is None for q in procs), [
            q.communicate()[1][-2000:] for q in procs if q.poll() is not None
        ]
        time.sleep(0.2)
    time.sleep(1.5)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    values = []
    for i in range(600):
        v = f"v{i}" + ("-release" if i % 10 == 3 else "-reject" if i % 50 == 7 else "")
        values.append(v)
        p.produce(topic_name, v.encode(), partition=i % 2)
    p.flush(30)
    outs = [proc.communicate(timeout=180) for proc in procs]
    lines = [line.split() for out, _ in outs for line in out.splitlines()]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0 and "DONE" in out, (
            f"{out[-2000:]}\n{err[-4000:]}\n{broker.read_log()[-3000:]}"
        )
    accepted = [w[3] for w in lines if w[0] == "ACCEPT"]
    rejected = {w[3] for w in lines if w[0] == "REJECT"}
    want_rejected = {v for v in values if v.endswith("-reject")}
    assert rejected == want_rejected, (
        len(accepted),
        len(rejected),
        [o[:300] for o, _ in outs],
        [e[-1500:] for _, e in outs],
    )
    # A refused acknowledgement (the record's lock was lost) means the record comes back: at least once. What
    # the broker confirmed must be each record exactly once.
    ackfail = [" ".join(w) for w in lines if w[0] == "ACKFAIL"]
    assert sorted(accepted) == sorted(v for v in values if not v.endswith("-reject")), (
        ackfail[:20],
        broker.read_log()[-3000:],
    )
    released = [w for w in lines if w[0] == "ACCEPT" and w[3].endswith("-release")]
    assert released and all(int(w[4]) == 2 for w in released), [w for w in released if int(w[4]) != 2]
    busy = sum(1 for out, _ in outs if "ACCEPT" in out)
    assert busy >= 2, "the records went to one consumer only"


def test_partitions_added_to_the_topic_reach_the_share_consumer(
    share_classpath: str, broker: BrokerProcess, topic_name: str
) -> None:
    """CreatePartitions on a subscribed topic changes the group metadata hash (KIP-1101): the group epoch is bumped,
    the new share-partitions initialized and assigned, and the KafkaShareConsumer reads their records."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
    group = "share-" + topic_name
    set_group_config(broker.bootstrap, group, "share.auto.offset.reset", "earliest")
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(topic_name, b"a0", partition=0)
    p.flush(30)
    cmd = [
        "java",
        "-cp",
        share_classpath,
        "ShareConsumerCompat",
        broker.bootstrap,
        topic_name,
        group,
        "3",
        "30000",
    ]
    proc = subprocess.Popen([*cmd, "20", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while assigned_members(broker.bootstrap, group) < 1:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        admin.create_partitions([NewPartitions(topic_name, 3)])[topic_name].result(30)
        p = Producer({"bootstrap.servers": broker.bootstrap})  # one that knows the new partitions
        for i in (1, 2):
            p.produce(topic_name, f"b{i}".encode(), partition=i)
        p.flush(30)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    accepted = sorted(
        (int(w[1]), w[3]) for w in (line.split() for line in out.splitlines()) if w[0] == "ACCEPT"
    )
    assert accepted == [(0, "a0"), (1, "b1"), (2, "b2")], (out[-2000:], err[-3000:])
    assert "DONE 3" in out

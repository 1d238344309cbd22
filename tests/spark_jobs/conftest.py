"""Spark test fixtures: one local SparkSession for the whole test session (with Spark's Kafka connector when it can be
resolved), and small confluent-kafka helpers."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

# Spark must bind to loopback here (no other interface is usable on the test machines).
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"


_connector: dict[str, str] = {}


def connector_coordinates() -> str | None:
    """The connector's coordinates (resolved once into the cache), or None with the reason kept for the skip."""
    from kbroker.spark_jobs import connector

    if not _connector:
        try:
            _connector["coord"] = connector.fetch(timeout=120)
        except connector.ConnectorUnavailable as e:
            _connector["why"] = str(e)
    return _connector.get("coord")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One JVM per test process: Spark's Kafka connector is loaded when it can be had, so every module shares it."""
    from kbroker.spark_jobs import connector
    from kbroker.spark_jobs.kbroker_source import register
    from pyspark.sql import SparkSession

    b = SparkSession.builder
    if coord := connector_coordinates():
        for key, value in connector.spark_conf(coord).items():
            b = b.config(key, value)
    s = (
        b.master("local[2]")
        .appName("kbroker-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def kafka_spark(spark: Any) -> Any:
    """The session, with format('kafka') loadable; skips (saying why) where the connector cannot be resolved."""
    if connector_coordinates() is None:
        pytest.skip(f"Spark's Kafka connector is unavailable: {_connector.get('why')}")
    return spark


@pytest.fixture(scope="module")
def admin(broker: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(admin: AdminClient, name: str, partitions: int = 1) -> str:
    fs = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)
    fs[name].result(timeout=30)
    # Wait until metadata shows every partition.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=10)
        tm = md.topics.get(name)
        if tm is not None and tm.error is None and len(tm.partitions) == partitions:
            return name
        time.sleep(0.05)
    raise AssertionError(f"topic {name} not visible with {partitions} partitions")


def produce(
    bootstrap: str,
    topic: str,
    values: Sequence[bytes | str],
    partition: int | None = None,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Any] | None = None,
) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "acks": "all"})
    errors: list[Any] = []
    for i, v in enumerate(values):
        kw: dict[str, Any] = {"value": v}
        if partition is not None:
            kw["partition"] = partition
        if keys is not None:
            kw["key"] = keys[i]
        if headers is not None:
            kw["headers"] = headers[i]
        p.produce(topic, on_delivery=lambda err, _m: errors.append(err) if err else None, **kw)
    assert p.flush(30) == 0
    assert not errors, errors


def consume_all(bootstrap: str, topic: str, timeout: float = 20.0) -> list[Any]:
    """Every record now in the topic (all partitions, up to the high watermarks), as confluent Message objects."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-tests", "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=10)
        tm = md.topics.get(topic)
        if tm is None or tm.error is not None:
            return []
        ends = {}
        for p in tm.partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if hi > lo:
                ends[p] = hi
        if not ends:
            return []
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[Any] = []
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(ends):
            assert time.monotonic() < deadline, f"timed out reading {topic}: {len(out)} records"
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out.append(m)
            if m.offset() >= ends[m.partition()] - 1:
                done.add(m.partition())
        return out
    finally:
        c.close()


def window_records(bootstrap: str, topic: str) -> list[tuple[str, dict[str, Any]]]:
    return [(m.key().decode(), json.loads(m.value())) for m in consume_all(bootstrap, topic)]

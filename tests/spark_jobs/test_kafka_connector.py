"""Spark's own Kafka connector (spark-sql-kafka-0-10, the Java client inside it) against a real kbroker: its source
options, batch and streaming, and its sink read back by confluent-kafka and kafka-python."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")

from confluent_kafka import Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from pyspark.errors import StreamingQueryException  # noqa: E402

from tests.clients import ck_consume, kp_consume  # noqa: E402
from tests.spark_jobs.conftest import consume_all, create_topic, produce  # noqa: E402


def read(spark: Any, broker: Any, **opts: str) -> Any:
    r = spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def values(df: Any) -> list[str]:
    return [
        r.value.decode()
        for r in df.orderBy("partition", "offset").select("value", "partition", "offset").collect()
    ]


def stream(
    spark: Any, broker: Any, ckpt: Path, may_fail: bool = False, fmt: str = "kafka", **opts: str
) -> tuple[list[Any], Any]:
    """One Trigger.AvailableNow run of a streaming query from `ckpt`: (rows it read, the finished query).

    startingOffsets is earliest unless given (the connector's streaming default is latest)."""
    got: list[Any] = []
    r = spark.readStream.format(fmt).option("kafka.bootstrap.servers", broker.bootstrap)
    opts = {"startingOffsets": "earliest", **opts}
    for k, v in opts.items():
        r = r.option(k, v)
    # foreachBatch, not the memory sink: the memory sink cannot restart from a checkpoint in append mode.
    q = (
        r.load()
        .writeStream.foreachBatch(lambda df, _batch_id: got.extend(df.collect()))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.awaitTermination(120)
    except StreamingQueryException:
        pass  # kept by q.exception()
    finally:
        if q.isActive:
            q.stop()
    if q.exception() is not None:
        assert may_fail, str(q.exception())[:3000]
    return sorted(got, key=lambda row: (row.topic, row.partition, row.offset)), q


@pytest.fixture
def topic(admin: AdminClient, topic_name: str) -> str:
    return create_topic(admin, topic_name)


def test_subscribe_subscribe_pattern_and_assign(kafka_spark, broker, admin, topic_name) -> None:
    a = create_topic(admin, f"{topic_name}-a", partitions=2)
    b = create_topic(admin, f"{topic_name}-b")
    produce(broker.bootstrap, a, [f"a0-{i}" for i in range(5)], partition=0)
    produce(broker.bootstrap, a, [f"a1-{i}" for i in range(3)], partition=1)
    produce(broker.bootstrap, b, [f"b-{i}" for i in range(4)])
    got = read(kafka_spark, broker, subscribe=a)
    assert got.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    rows = got.orderBy("partition", "offset").collect()
    # The same records, offsets and timestamps confluent-kafka reads.
    want = sorted(
        (m.partition(), m.offset(), m.value(), m.timestamp()[1]) for m in consume_all(broker.bootstrap, a)
    )
    assert [
        (r.partition, r.offset, bytes(r.value), int(r.timestamp.timestamp() * 1000)) for r in rows
    ] == want
    assert {r.topic for r in rows} == {a}
    pattern = read(kafka_spark, broker, subscribePattern=f"{topic_name}-.*")
    assert sorted(values(pattern)) == sorted(
        [f"a0-{i}" for i in range(5)] + [f"a1-{i}" for i in range(3)] + [f"b-{i}" for i in range(4)]
    )
    assigned = read(kafka_spark, broker, assign=json.dumps({a: [1], b: [0]}))
    assert sorted(values(assigned)) == sorted([f"a1-{i}" for i in range(3)] + [f"b-{i}" for i in range(4)])


def test_starting_and_ending_offsets_in_batch_reads(kafka_spark, broker, topic) -> None:
    base = int(time.time() * 1000) - 100_000
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        p.produce(topic, value=f"v{i}", timestamp=base + i * 1000)
    assert p.flush(30) == 0
    everything = [f"v{i}" for i in range(10)]
    assert values(read(kafka_spark, broker, subscribe=topic)) == everything
    explicit = read(kafka_spark, broker, subscribe=topic, startingOffsets="earliest", endingOffsets="latest")
    assert values(explicit) == everything
    by_offset = read(
        kafka_spark,
        broker,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 3}}),
        endingOffsets=json.dumps({topic: {"0": 7}}),
    )
    assert values(by_offset) == ["v3", "v4", "v5", "v6"]
    # -2 = earliest, -1 = latest in the JSON form.
    assert values(
        read(kafka_spark, broker, subscribe=topic, startingOffsets=json.dumps({topic: {"0": -2}}))
    ) == (everything)
    by_time = read(
        kafka_spark,
        broker,
        subscribe=topic,
        startingOffsetsByTimestamp=json.dumps({topic: {"0": base + 5000}}),
        endingOffsetsByTimestamp=json.dumps({topic: {"0": base + 8500}}),
    )
    assert values(by_time) == ["v5", "v6", "v7", "v8"]
    # startingOffsetsByTimestamp between records: the first record at or after the time (ListOffsets).
    later = read(
        kafka_spark,
        broker,
        subscribe=topic,
        startingOffsetsByTimestamp=json.dumps({topic: {"0": base + 8500}}),
    )
    assert values(later) == ["v9"]


def test_streaming_latest_then_restart_reads_only_new_records(kafka_spark, broker, topic, tmp_path) -> None:
    produce(broker.bootstrap, topic, ["old-1", "old-2"])
    rows, _ = stream(kafka_spark, broker, tmp_path / "ckpt", subscribe=topic, startingOffsets="latest")
    assert rows == []
    produce(broker.bootstrap, topic, ["new-1", "new-2", "new-3"])
    rows, _ = stream(kafka_spark, broker, tmp_path / "ckpt", subscribe=topic, startingOffsets="latest")
    assert [(r.offset, bytes(r.value)) for r in rows] == [(2, b"new-1"), (3, b"new-2"), (4, b"new-3")]
    rows, _ = stream(kafka_spark, broker, tmp_path / "ckpt", subscribe=topic)
    assert rows == []


def test_max_offsets_per_trigger_and_min_partitions(kafka_spark, broker, admin, topic_name, tmp_path) -> None:
    topic = create_topic(admin, topic_name, partitions=2)
    produce(broker.bootstrap, topic, [f"p0-{i}" for i in range(7)], partition=0)
    produce(broker.bootstrap, topic, [f"p1-{i}" for i in range(3)], partition=1)
    rows, q = stream(kafka_spark, broker, tmp_path / "ckpt", subscribe=topic, maxOffsetsPerTrigger="4")
    assert len(rows) == 10 and len({(r.partition, r.offset) for r in rows}) == 10
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    # Spark prorates the limit by each partition's backlog (7 and 3 here), rounding down: 2+1, 2+1, then 3+1.
    assert sizes == [3, 3, 4], sizes
    # The Python data source splits the same way.
    py_rows, py_q = stream(
        kafka_spark, broker, tmp_path / "py", fmt="kbroker", subscribe=topic, maxOffsetsPerTrigger="4"
    )
    assert [p["numInputRows"] for p in py_q.recentProgress if p["numInputRows"]] == sizes
    assert [(r.partition, r.offset, r.value) for r in py_rows] == [
        (r.partition, r.offset, r.value) for r in rows
    ]
    df = read(kafka_spark, broker, subscribe=topic, minPartitions="6")
    assert df.rdd.getNumPartitions() >= 6
    assert sorted(values(df)) == sorted([f"p0-{i}" for i in range(7)] + [f"p1-{i}" for i in range(3)])
    rows, q = stream(kafka_spark, broker, tmp_path / "ckpt2", subscribe=topic, minPartitions="5")
    assert len(rows) == 10
    assert q.lastProgress["sources"][0]["numInputRows"] == 10


def test_read_committed_over_transactional_input(kafka_spark, broker, topic, tmp_path) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions(30)
    for batch, commit in ((["c1", "c2"], True), (["a1", "a2", "a3"], False), (["c3"], True), (["a4"], False)):
        p.begin_transaction()
        for v in batch:
            p.produce(topic, value=v)
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    # A record after the last abort, so the read_committed end is past every control marker.
    p.begin_transaction()
    p.produce(topic, value="c4")
    p.commit_transaction(30)
    committed = read(kafka_spark, broker, subscribe=topic, **{"kafka.isolation.level": "read_committed"})
    assert values(committed) == ["c1", "c2", "c3", "c4"]
    uncommitted = read(kafka_spark, broker, subscribe=topic)
    assert values(uncommitted) == ["c1", "c2", "a1", "a2", "a3", "c3", "a4", "c4"]
    rows, _ = stream(
        kafka_spark, broker, tmp_path / "ckpt", subscribe=topic, **{"kafka.isolation.level": "read_committed"}
    )
    assert [bytes(r.value) for r in rows] == [b"c1", b"c2", b"c3", b"c4"]


def test_include_headers(kafka_spark, broker, topic) -> None:
    headers = [[("h", b"1"), ("h", b"2"), ("other", b"x")], [], [("empty", b"")]]
    produce(broker.bootstrap, topic, ["a", "b", "c"], keys=[b"k1", None, b"k3"], headers=headers)
    rows = read(kafka_spark, broker, subscribe=topic, includeHeaders="true").orderBy("offset").collect()
    got = [[(h.key, bytes(h.value)) for h in (r.headers or [])] for r in rows]
    assert got == headers
    assert [r.key for r in rows] == [b"k1", None, b"k3"]
    assert "headers" not in read(kafka_spark, broker, subscribe=topic).columns


def test_fail_on_data_loss_after_delete_records(kafka_spark, broker, admin, topic, tmp_path) -> None:
    """The checkpoint points at offset 5; DeleteRecords moves the log start to 8. Against Kafka the connector's task
    asks for 5, gets OFFSET_OUT_OF_RANGE, finds the earliest offset is 8 and (KafkaDataConsumer) then fails the
    query when failOnDataLoss is true, or reads on from 8 when it is false."""
    produce(broker.bootstrap, topic, [f"v{i}" for i in range(5)])
    rows, _ = stream(kafka_spark, broker, tmp_path / "ckpt", subscribe=topic)
    assert len(rows) == 5
    produce(broker.bootstrap, topic, [f"v{i}" for i in range(5, 10)])
    deleted = admin.delete_records([TopicPartition(topic, 0, 8)])
    assert deleted[TopicPartition(topic, 0, 8)].result(30).low_watermark == 8
    rows, q = stream(
        kafka_spark, broker, tmp_path / "ckpt", subscribe=topic, may_fail=True, failOnDataLoss="true"
    )
    err = str(q.exception())
    # KafkaDataConsumer.get -> throwOnDataLoss -> KafkaExceptions.couldNotReadOffsetRange (KAFKA_DATA_LOSS).
    assert "Could not read records in offset [5, 10)" in err and "failOnDataLoss to false" in err, err[:3000]
    rows, q = stream(kafka_spark, broker, tmp_path / "ckpt", subscribe=topic, failOnDataLoss="false")
    assert q.exception() is None
    assert [(r.offset, bytes(r.value)) for r in rows] == [(8, b"v8"), (9, b"v9")]


def test_group_id_and_group_id_prefix(kafka_spark, broker, admin, topic, tmp_path) -> None:
    """The connector's executors assign() and seek, so they join no group; the driver joins one when it fetches
    offsets with a consumer (spark.sql.streaming.kafka.useDeprecatedOffsetFetching): kafka.group.id names that
    group, groupIdPrefix prefixes the generated one, and kbroker lists it while the query runs."""
    produce(broker.bootstrap, topic, ["x", "y"])
    group = f"spark-fixed-{topic}"
    rows, _ = stream(kafka_spark, broker, tmp_path / "ckpt", subscribe=topic, **{"kafka.group.id": group})
    assert [bytes(r.value) for r in rows] == [b"x", b"y"]
    prefix = f"pfx-{topic}"
    kafka_spark.conf.set("spark.sql.streaming.kafka.useDeprecatedOffsetFetching", "true")
    queries = []
    try:
        for i, opt in enumerate(({"kafka.group.id": group}, {"groupIdPrefix": prefix})):
            r = kafka_spark.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
            r = r.option("subscribe", topic).option("startingOffsets", "earliest")
            for k, v in opt.items():
                r = r.option(k, v)
            w = r.load().writeStream.foreachBatch(lambda df, _b: df.count())
            w = w.option("checkpointLocation", str(tmp_path / f"running-{i}"))
            queries.append(w.trigger(processingTime="1 second").start())
        deadline = time.monotonic() + 90
        listed: set[str] = set()
        while time.monotonic() < deadline:
            listed = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
            if group in listed and any(g.startswith(prefix + "-") for g in listed):
                break
            time.sleep(0.5)
        assert group in listed, listed
        assert any(g.startswith(prefix + "-") for g in listed), listed
        for q in queries:
            assert q.exception() is None and q.isActive
    finally:
        for q in queries:
            q.stop()
        kafka_spark.conf.unset("spark.sql.streaming.kafka.useDeprecatedOffsetFetching")


def test_sink_key_value_headers_and_topic_column(kafka_spark, broker, admin, topic_name, tmp_path) -> None:
    from pyspark.sql import Row
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

    t1 = create_topic(admin, f"{topic_name}-1")
    t2 = create_topic(admin, f"{topic_name}-2")
    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField(
                "headers",
                ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
            ),
        ]
    )
    rows = [
        Row(t1, b"k1", b"v1", [Row("h", b"a"), Row("h", b"b")]),
        Row(t2, b"k2", b"v2", []),
        Row(t1, None, b"v3", [Row("only", b"")]),
    ]
    df = kafka_spark.createDataFrame(rows, schema).coalesce(1)
    df.write.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap).save()
    ck = ck_consume(broker.bootstrap, t1, [0], 2) + ck_consume(broker.bootstrap, t2, [0], 1)
    kp = kp_consume(broker.bootstrap, t1, [0], 2) + kp_consume(broker.bootstrap, t2, [0], 1)
    want = [
        (b"k1", b"v1", (("h", b"a"), ("h", b"b"))),
        (None, b"v3", (("only", b""),)),
        (b"k2", b"v2", ()),
    ]
    assert [(r.key, r.value, r.headers) for r in ck] == want
    assert [(r.key, r.value, r.headers) for r in kp] == want
    # A streaming write with the `topic` option instead of the column.
    t3 = create_topic(admin, f"{topic_name}-3")
    produce(broker.bootstrap, t2, ["v4"], keys=[b"k4"])
    q = (
        kafka_spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", t2)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("key", "upper(cast(value as string)) as value")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", t3)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    assert [(r.key, r.value) for r in ck_consume(broker.bootstrap, t3, [0], 2)] == [
        (b"k2", b"V2"),
        (b"k4", b"V4"),
    ]

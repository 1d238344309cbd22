"""The kbroker Python data source against a real broker: the Kafka connector's options and offsets contract.

Most option tests drive the stream reader the way Spark's driver does (initialOffset / latestOffset / partitions)
and the task side (read) directly, without a JVM; the rest run small Spark batch and streaming queries.
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")

from confluent_kafka import Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import NewPartitions  # noqa: E402
from kbroker.spark_jobs.kbroker_source import (  # noqa: E402
    DataLossError,
    KafkaOptions,
    KafkaRange,
    KBrokerStreamReader,
    _rate_limit,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from tests.spark_jobs.conftest import consume_all, create_topic, produce  # noqa: E402


def reader(broker, **opts) -> KBrokerStreamReader:
    return KBrokerStreamReader({"kafka.bootstrap.servers": broker.bootstrap, **opts})


def read_all(r: KBrokerStreamReader, start: dict, end: dict) -> list[tuple]:
    rows = []
    for part in r.partitions(start, end):
        rows += list(r.read(part))
    return rows


def fill(broker, topic: str, counts: dict[int, int]) -> None:
    for p, n in counts.items():
        produce(broker.bootstrap, topic, [f"{topic}-{p}-{i}" for i in range(n)], partition=p)


def delete_records(admin, topic: str, partition: int, before: int) -> None:
    fs = admin.delete_records([TopicPartition(topic, partition, before)], operation_timeout=10)
    for f in fs.values():
        f.result(timeout=30)


# ---------------------------------------------------------------- option parsing


def test_option_validation() -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:1"}
    with pytest.raises(ValueError, match="bootstrap"):
        KafkaOptions.parse({"subscribe": "t"}, streaming=True)
    with pytest.raises(ValueError, match="exactly one"):
        KafkaOptions.parse(base, streaming=True)
    with pytest.raises(ValueError, match="exactly one"):
        KafkaOptions.parse({**base, "subscribe": "t", "subscribePattern": "t.*"}, streaming=True)
    with pytest.raises(ValueError, match="batch queries only"):
        KafkaOptions.parse({**base, "subscribe": "t", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(ValueError, match="not valid for batch"):
        KafkaOptions.parse({**base, "subscribe": "t", "startingOffsets": "latest"}, streaming=False)
    with pytest.raises(ValueError, match="-2"):
        KafkaOptions.parse({**base, "subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, streaming=False)
    with pytest.raises(ValueError, match="positive"):
        KafkaOptions.parse({**base, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, streaming=True)
    o = KafkaOptions.parse(
        {**base, "ASSIGN": '{"b": [1, 0], "a": [2]}', "FailOnDataLoss": "false", "kafka.client.id": "x"},
        streaming=True,
    )
    assert o.assign == (("a", 2), ("b", 0), ("b", 1))
    assert (o.fail_on_data_loss, o.include_headers, o.starting) == (False, False, "latest")
    assert o.consumer_conf()["client.id"] == "x" and o.consumer_conf()["bootstrap.servers"] == "127.0.0.1:1"
    assert KafkaOptions.parse({**base, "subscribe": "a, b"}, streaming=False).starting == "earliest"


def test_rate_limit_is_the_connectors_proration() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 5}
    latest = {("t", 0): 10, ("t", 1): 30, ("t", 2): 6}
    # 41 records behind, limit 8: 8*10/41 -> 1, 8*30/41 -> 5, 8*1/41 < 1 -> ceil 1 (never starved).
    assert _rate_limit(start, latest, 8) == {("t", 0): 1, ("t", 1): 5, ("t", 2): 6}
    assert _rate_limit(start, latest, 100) == latest


# ---------------------------------------------------------------- offsets and partitions


def test_starting_offsets_json_earliest_latest(broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name, partitions=3)
    fill(broker, t, {0: 5, 1: 5, 2: 5})
    r = reader(broker, subscribe=t, startingOffsets=json.dumps({t: {"0": 2, "1": -2, "2": -1}}))
    start = r.initialOffset()
    assert start == {t: {"0": 2, "1": 0, "2": 5}}
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {t: {"0": 5, "1": 5, "2": 5}}
    parts = r.partitions(start, end)
    assert [(p.topic, p.partition, p.start, p.end) for p in parts] == [(t, 0, 2, 5), (t, 1, 0, 5)]
    rows = read_all(r, start, end)
    assert [(row[3], row[4]) for row in rows] == [(0, 2), (0, 3), (0, 4)] + [(1, i) for i in range(5)]
    assert rows[0][1] == f"{t}-0-2".encode() and rows[0][2] == t
    # No new data: latestOffset returns the start, so Spark plans no batch.
    assert r.latestOffset(end, ReadAllAvailable()) == end
    assert reader(broker, subscribe=t, startingOffsets="earliest").initialOffset() == {
        t: {"0": 0, "1": 0, "2": 0}
    }
    assert reader(broker, subscribe=t).initialOffset() == {t: {"0": 5, "1": 5, "2": 5}}  # default latest
    with pytest.raises(ValueError, match="must specify all TopicPartitions"):
        reader(broker, subscribe=t, startingOffsets=json.dumps({t: {"0": 1}})).initialOffset()
    r.stop()


def test_assign_reads_only_the_assigned_partitions(broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name, partitions=3)
    fill(broker, t, {0: 3, 1: 4, 2: 5})
    r = reader(broker, assign=json.dumps({t: [0, 2]}), startingOffsets="earliest")
    start = r.initialOffset()
    assert start == {t: {"0": 0, "2": 0}}
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {t: {"0": 3, "2": 5}}
    assert sorted({row[3] for row in read_all(r, start, end)}) == [0, 2]
    assert len(read_all(r, start, end)) == 8


def test_subscribe_pattern_and_new_topics_and_partitions(broker, admin, topic_name) -> None:
    a = create_topic(admin, topic_name + "-pat-a")
    create_topic(admin, topic_name + "-other")
    fill(broker, a, {0: 2})
    r = reader(broker, subscribePattern=f"{topic_name}-pat-.*", startingOffsets="earliest")
    start = r.initialOffset()
    assert start == {a: {"0": 0}}
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {a: {"0": 2}}
    # A new matching topic and a new partition of a subscribed topic are picked up, read from offset 0.
    b = create_topic(admin, topic_name + "-pat-b")
    admin.create_partitions([NewPartitions(a, 2)])[a].result(timeout=30)
    fill(broker, b, {0: 3})
    fill(broker, a, {1: 4})
    deadline = time.monotonic() + 15
    while True:
        end2 = r.latestOffset(end, ReadAllAvailable())
        if end2 == {a: {"0": 2, "1": 4}, b: {"0": 3}} or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert end2 == {a: {"0": 2, "1": 4}, b: {"0": 3}}
    parts = r.partitions(end, end2)
    assert sorted((p.topic, p.partition, p.start, p.end) for p in parts) == [(a, 1, 0, 4), (b, 0, 0, 3)]
    assert len(read_all(r, end, end2)) == 7


def test_max_offsets_per_trigger_batches(broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name, partitions=2)
    fill(broker, t, {0: 10, 1: 30})
    r = reader(broker, subscribe=t, startingOffsets="earliest", maxOffsetsPerTrigger="8")
    limit = r.getDefaultReadLimit()
    assert limit == ReadMaxRows(8)
    offset = r.initialOffset()
    batches = []
    while True:
        end = r.latestOffset(offset, limit)
        if end == offset:
            break
        batches.append(read_all(r, offset, end))
        offset = end
    assert [len(b) for b in batches] == [8, 8, 8, 8, 8]
    seen = [(row[3], row[4]) for b in batches for row in b]
    assert sorted(seen) == [(0, i) for i in range(10)] + [(1, i) for i in range(30)]
    assert len(set(seen)) == 40
    # ReadAllAvailable (what Spark passes when a trigger wants everything) ignores the option.
    assert r.latestOffset(r.initialOffset(), ReadAllAvailable()) == {t: {"0": 10, "1": 30}}


def test_available_now_stops_at_the_target(broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name)
    fill(broker, t, {0: 5})
    r = reader(broker, subscribe=t, startingOffsets="earliest")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    fill(broker, t, {0: 5})
    assert r.latestOffset(start, ReadAllAvailable()) == {t: {"0": 5}}
    assert r.reportLatestOffset() == {t: {"0": 10}}


def test_fail_on_data_loss_after_delete_records(broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name)
    fill(broker, t, {0: 10})
    delete_records(admin, t, 0, 6)
    for fail, expect in (("true", None), ("false", [6, 7, 8, 9])):
        r = reader(broker, subscribe=t, startingOffsets=json.dumps({t: {"0": 0}}), failOnDataLoss=fail)
        start = r.initialOffset()
        assert start == {t: {"0": 0}}
        end = r.latestOffset(start, ReadAllAvailable())
        if expect is None:
            with pytest.raises(DataLossError, match=r"offsets \[0, 6\) .* no longer available"):
                read_all(r, start, end)
        else:
            assert [row[4] for row in read_all(r, start, end)] == expect


def test_deleted_topic_is_data_loss(broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name)
    fill(broker, t, {0: 3})
    for fail in ("true", "false"):
        r = reader(broker, subscribe=t, startingOffsets="earliest", failOnDataLoss=fail)
        r._start = r.initialOffset()  # type: ignore[attr-defined]
        if fail == "true":
            strict = r
        else:
            lenient = r
    admin.delete_topics([t], operation_timeout=10)[t].result(timeout=30)
    time.sleep(0.5)
    with pytest.raises(DataLossError, match="deleted"):
        strict.latestOffset(strict._start, ReadAllAvailable())  # type: ignore[attr-defined]
    assert lenient.latestOffset(lenient._start, ReadAllAvailable()) == {t: {"0": 0}}  # type: ignore[attr-defined]


def test_partition_pickles_and_range_reads_exactly(broker, admin, topic_name) -> None:
    import pickle

    t = create_topic(admin, topic_name)
    fill(broker, t, {0: 20})
    r = reader(broker, subscribe=t)
    r.initialOffset()  # creates the driver-side metadata client, which must not travel to tasks
    r2 = pickle.loads(pickle.dumps(r))
    part = pickle.loads(pickle.dumps(KafkaRange(t, 0, 7, 12)))
    assert [row[4] for row in r2.read(part)] == [7, 8, 9, 10, 11]


# ---------------------------------------------------------------- through Spark


def test_spark_batch_read_offsets_headers_timestamps(spark, broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name, partitions=2)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    ts0 = 1_704_067_200_000
    for i in range(6):
        p.produce(
            t,
            key=f"k{i}",
            value=f"v{i}",
            partition=i % 2,
            timestamp=ts0 + i,
            headers=[("h", b"x"), ("n", None)],
        )
    assert p.flush(30) == 0
    df = (
        spark.read.format("kbroker")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", t)
        .option("startingOffsets", json.dumps({t: {"0": 1, "1": -2}}))
        .option("endingOffsets", json.dumps({t: {"0": -1, "1": 2}}))
        .option("includeHeaders", "true")
        .load()
    )
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"),
        ("value", "binary"),
        ("topic", "string"),
        ("partition", "int"),
        ("offset", "bigint"),
        ("timestamp", "timestamp"),
        ("timestampType", "int"),
        ("headers", "array<struct<key:string,value:binary>>"),
    ]
    rows = sorted(df.collect(), key=lambda r: (r.partition, r.offset))
    assert [(r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in rows] == [
        (0, 1, b"k2", b"v2"),
        (0, 2, b"k4", b"v4"),
        (1, 0, b"k1", b"v1"),
        (1, 1, b"k3", b"v3"),
    ]
    r0 = rows[0]
    assert r0.timestampType == 0 and r0.topic == t
    assert [(h.key, None if h.value is None else bytes(h.value)) for h in r0.headers] == [
        ("h", b"x"),
        ("n", None),
    ]
    # Without includeHeaders the schema is the connector's 7 columns.
    df2 = (
        spark.read.format("kbroker")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", t)
    )
    assert len(df2.load().columns) == 7 and df2.load().count() == 6
    # The timestamp is the record's (UTC instant), whatever the session time zone.
    got = df.where("partition = 0 and offset = 1").selectExpr("unix_millis(timestamp) AS ms").first()
    assert got is not None and got.ms == ts0 + 2


def test_spark_batch_read_fail_on_data_loss(spark, broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name)
    fill(broker, t, {0: 10})
    delete_records(admin, t, 0, 4)

    def load(fail: str):
        return (
            spark.read.format("kbroker")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", t)
            .option("startingOffsets", json.dumps({t: {"0": 0}}))
            .option("failOnDataLoss", fail)
            .load()
        )

    with pytest.raises(Exception, match="no longer available"):
        load("true").collect()
    assert sorted(r.offset for r in load("false").collect()) == [4, 5, 6, 7, 8, 9]


def test_spark_stream_max_offsets_per_trigger_and_checkpoint(
    spark, broker, admin, topic_name, tmp_path
) -> None:
    """AvailableNow honours maxOffsetsPerTrigger (25 records -> 10, 10, 5), the checkpoint holds the connector's
    offsets format, and a restart after DeleteRecords fails or skips by failOnDataLoss."""
    t = create_topic(admin, topic_name)
    out = topic_name + "-copy"
    fill(broker, t, {0: 25})
    ckpt = tmp_path / "ckpt"

    def run(fail: str = "true"):
        src = (
            spark.readStream.format("kbroker")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", t)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "10")
            .option("failOnDataLoss", fail)
            .load()
        )
        q = (
            src.selectExpr("key", "value", "CAST(offset AS STRING) AS k2")
            .selectExpr("k2 AS key", "value")
            .writeStream.format("kbroker")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("topic", out)
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        return q

    q = run()
    assert [p["numInputRows"] for p in q.recentProgress] == [10, 10, 5]
    assert json.loads((ckpt / "offsets" / "2").read_text().splitlines()[-1]) == {t: {"0": 25}}
    assert sorted(int(m.key()) for m in consume_all(broker.bootstrap, out)) == list(range(25))

    fill(broker, t, {0: 10})  # offsets 25..34
    delete_records(admin, t, 0, 30)
    with pytest.raises(Exception, match="no longer available"):
        run("true")
    q = run("false")
    assert sorted(int(m.key()) for m in consume_all(broker.bootstrap, out)) == list(range(25)) + list(
        range(30, 35)
    )


def test_spark_sink_columns(spark, broker, admin, topic_name) -> None:
    t1 = create_topic(admin, topic_name + "-1", partitions=2)
    t2 = create_topic(admin, topic_name + "-2")
    rows = [
        (t1, "a", bytearray(b"va"), 1, [("h1", bytearray(b"x"))]),
        (t1, None, bytearray(b"vb"), 0, []),
        (t2, "c", bytearray(b"vc"), None, None),
    ]
    df = spark.createDataFrame(
        rows,
        "topic string, key string, value binary, partition int, headers array<struct<key:string,value:binary>>",
    )
    df.write.format("kbroker").option("kafka.bootstrap.servers", broker.bootstrap).mode("append").save()
    got1 = sorted(
        ((m.partition(), m.key(), m.value(), m.headers()) for m in consume_all(broker.bootstrap, t1)),
        key=lambda x: x[0],
    )
    assert got1 == [(0, None, b"vb", None), (1, b"a", b"va", [("h1", b"x")])]
    assert [(m.key(), m.value()) for m in consume_all(broker.bootstrap, t2)] == [(b"c", b"vc")]
    # The topic option wins over the column.
    df.select("key", "value").write.format("kbroker").option(
        "kafka.bootstrap.servers", broker.bootstrap
    ).option("topic", t2).mode("append").save()
    assert len(consume_all(broker.bootstrap, t2)) == 4
    with pytest.raises(Exception, match="'value' column"):
        df.select("key", "topic").write.format("kbroker").option(
            "kafka.bootstrap.servers", broker.bootstrap
        ).mode("append").save()

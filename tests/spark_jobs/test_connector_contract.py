"""Contract: the kbroker Python source/sink against the documented contract of Spark's Kafka connector.

The tables below are the "Structured Streaming + Kafka Integration Guide" (Spark 4.x,
https://spark.apache.org/docs/latest/structured-streaming-kafka-integration.html): the source schema, the source
options (required and optional), the Kafka client settings the connector refuses, and the sink's columns and
options. They are written down from the guide (and the connector's KafkaSourceProvider / KafkaRecordToRowConverter
/ KafkaWriter, which implement it), not fetched. Every documented source option must be either supported, i.e.
parsed and acted on (it changes the parsed options, and the behaviour tests below check the semantics), or
rejected with an error that names it. Silently ignoring one is a contract violation.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")

from confluent_kafka import Producer  # noqa: E402
from kbroker.spark_jobs.kbroker_source import (  # noqa: E402
    KafkaOptions,
    KafkaRange,
    KBrokerBatchReader,
    KBrokerBatchWriter,
    KBrokerStreamReader,
    split_ranges,
)
from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tests.spark_jobs.conftest import consume_all, create_topic  # noqa: E402

# ---------------------------------------------------------------- the guide, as data

# "Each row in the source has the following schema" (all columns nullable: the connector's StructFields use the
# default nullable=true), plus "headers" when includeHeaders is true.
DOCUMENTED_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
)
DOCUMENTED_HEADERS = StructField(
    "headers",
    ArrayType(
        StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)]), True
    ),
    True,
)

# Source options: name -> (query types the guide lists, a valid example value, what the kbroker source does).
# "supported": parsed and honoured (behaviour checked below); "rejected": refused with an error naming the option.
# The required ones (kafka.bootstrap.servers and exactly one of assign/subscribe/subscribePattern) are separate.
STREAM, BATCH, BOTH = "streaming", "batch", "streaming and batch"
DOCUMENTED_SOURCE_OPTIONS: dict[str, tuple[str, str, str]] = {
    "startingTimestamp": (BOTH, "1000", "supported"),
    "startingOffsetsByTimestamp": (BOTH, '{"t": {"0": 1000}}', "supported"),
    "startingOffsets": (BOTH, "earliest", "supported"),
    "endingTimestamp": (BATCH, "1000", "supported"),
    "endingOffsetsByTimestamp": (BATCH, '{"t": {"0": 1000}}', "supported"),
    "endingOffsets": (BATCH, '{"t": {"0": 5}}', "supported"),
    "failOnDataLoss": (BOTH, "false", "supported"),
    "kafkaConsumer.pollTimeoutMs": (BOTH, "5000", "supported"),
    "fetchOffset.numRetries": (BOTH, "7", "supported"),
    "fetchOffset.retryIntervalMs": (BOTH, "50", "supported"),
    "maxOffsetsPerTrigger": (STREAM, "100", "supported"),
    "minOffsetsPerTrigger": (STREAM, "100", "rejected"),
    "maxTriggerDelay": (STREAM, "5m", "rejected"),
    "minPartitions": (BOTH, "4", "supported"),
    "maxRecordsPerPartition": (BOTH, "100", "supported"),
    "groupIdPrefix": (BOTH, "my-prefix", "supported"),
    "kafka.group.id": (BOTH, "my-group", "supported"),
    "includeHeaders": (BOTH, "true", "supported"),
    "startingOffsetsByTimestampStrategy": (BOTH, "latest", "supported"),
}
REQUIRED_SUBSCRIPTION = ("assign", "subscribe", "subscribePattern")

# "Kafka Specific Configurations": client settings the connector throws on ("kafka." prefix).
SOURCE_REFUSED_KAFKA_PARAMS = [
    "auto.offset.reset",
    "key.deserializer",
    "value.deserializer",
    "enable.auto.commit",
    "interceptor.classes",
]
SINK_REFUSED_KAFKA_PARAMS = ["key.serializer", "value.serializer"]

# "Writing Data to Kafka": the columns of the DataFrame being written, and the sink's options.
SINK_COLUMNS = {
    "key": ("optional", {"string", "binary"}),
    "value": ("required", {"string", "binary"}),
    "headers": ("optional", {"array<struct<key:string,value:binary>>"}),
    "topic": ("optional (unless the topic option is set)", {"string"}),
    "partition": ("optional", {"int"}),
}
SINK_OPTIONS = {"kafka.bootstrap.servers": "required", "topic": "optional: overrides the topic column"}

BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}


def parse(streaming: bool = True, **opts: str) -> KafkaOptions:
    return KafkaOptions.parse({**BASE, **opts}, streaming=streaming)


# ---------------------------------------------------------------- schema


def load(spark: Any, broker: Any, topic: str, streaming: bool, **opts: str) -> Any:
    r = spark.readStream if streaming else spark.read
    r = r.format("kbroker").option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", topic)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "batch"])
def test_schema_is_the_connectors(spark, broker, admin, topic_name, streaming) -> None:
    t = create_topic(admin, topic_name)
    assert load(spark, broker, t, streaming).schema == DOCUMENTED_SCHEMA
    with_headers = load(spark, broker, t, streaming, includeHeaders="true").schema
    assert with_headers == StructType(DOCUMENTED_SCHEMA.fields + [DOCUMENTED_HEADERS])
    assert load(spark, broker, t, streaming, includeHeaders="false").schema == DOCUMENTED_SCHEMA
    # Same names, types, order and nullability, field by field (StructType equality covers these; spelled out).
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in with_headers.fields] == [
        ("key", "binary", True),
        ("value", "binary", True),
        ("topic", "string", True),
        ("partition", "int", True),
        ("offset", "bigint", True),
        ("timestamp", "timestamp", True),
        ("timestampType", "int", True),
        ("headers", "array<struct<key:string,value:binary>>", True),
    ]


# ---------------------------------------------------------------- options, generically


def test_every_documented_source_option_is_supported_or_rejected() -> None:
    """Supported options change what the source parses; rejected ones fail naming the option; none is ignored."""
    default = parse()
    for name, (kinds, value, status) in DOCUMENTED_SOURCE_OPTIONS.items():
        streaming = kinds != BATCH
        if status == "rejected":
            with pytest.raises(ValueError, match=f"'{name}' is not supported"):
                parse(streaming, **{name: value})
            continue
        assert status == "supported", name
        base = parse(streaming)
        got = parse(streaming, **{name: value})
        assert got != base, f"documented option {name!r} is silently ignored"
        # Option names are case-insensitive, as Spark's data source options are.
        assert parse(streaming, **{name.upper(): value}) == got, name
        if kinds == BATCH:
            with pytest.raises(ValueError, match=f"'{name}' is for batch queries only"):
                parse(True, **{name: value})
    assert default.starting == "latest" and parse(False).starting == "earliest"


def test_exactly_one_subscription_option_is_required() -> None:
    specs = {"assign": '{"t": [0]}', "subscribe": "t", "subscribePattern": "t.*"}
    boot = {"kafka.bootstrap.servers": "127.0.0.1:1"}
    with pytest.raises(
        ValueError, match="exactly one of the options 'subscribe', 'subscribePattern', 'assign'"
    ):
        KafkaOptions.parse(boot, streaming=True)
    for name in REQUIRED_SUBSCRIPTION:
        o = KafkaOptions.parse({**boot, name: specs[name]}, streaming=True)
        assert (o.assign, o.subscribe, o.pattern) == {
            "assign": ((("t", 0),), None, None),
            "subscribe": (None, ("t",), None),
            "subscribePattern": (None, None, "t.*"),
        }[name]
        for other in REQUIRED_SUBSCRIPTION:
            if other != name:
                with pytest.raises(ValueError, match="exactly one"):
                    KafkaOptions.parse({**boot, name: specs[name], other: specs[other]}, streaming=True)
    with pytest.raises(ValueError, match="'kafka.bootstrap.servers' must be specified"):
        KafkaOptions.parse({"subscribe": "t"}, streaming=True)


@pytest.mark.parametrize("param", SOURCE_REFUSED_KAFKA_PARAMS)
def test_source_refuses_the_kafka_params_the_connector_refuses(param) -> None:
    with pytest.raises(ValueError, match=f"'kafka.{param}' is not supported"):
        parse(**{f"kafka.{param}": "x"})


def test_other_kafka_params_reach_the_client() -> None:
    o = parse(**{"kafka.client.id": "c1", "kafka.group.id": "g1", "groupIdPrefix": "pre"})
    conf = o.consumer_conf()
    assert conf["client.id"] == "c1" and conf["group.id"] == "g1"
    assert parse(groupIdPrefix="pre").consumer_conf()["group.id"].startswith("pre-")
    assert (
        parse().consumer_conf()["group.id"].startswith("spark-kafka-source-")
    )  # the connector's default prefix
    assert parse(**{"fetchOffset.numRetries": "7", "fetchOffset.retryIntervalMs": "50"}).fetch_retries == 7
    assert parse(**{"kafkaConsumer.pollTimeoutMs": "5000"}).poll_timeout_s == 5.0
    with pytest.raises(ValueError, match="startingOffsetsByTimestampStrategy"):
        parse(startingOffsetsByTimestampStrategy="earliest")
    with pytest.raises(ValueError, match="'startingTimestamp' must be an integer"):
        parse(startingTimestamp="yesterday")
    for name in ("minPartitions", "maxRecordsPerPartition", "maxOffsetsPerTrigger"):
        with pytest.raises(ValueError, match=f"{name} must be positive"):
            parse(**{name: "0"})


# ---------------------------------------------------------------- option semantics against a broker


def produce_stamped(broker: Any, topic: str, stamps: list[int]) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i, ts in enumerate(stamps):
        p.produce(topic, value=f"v{i}", partition=0, timestamp=ts)
    assert p.flush(30) == 0


def test_starting_and_ending_timestamps(broker, admin, topic_name) -> None:
    """startingTimestamp > startingOffsetsByTimestamp > startingOffsets; the first offset at or after the time."""
    t = create_topic(admin, topic_name)
    ts0 = 1_704_067_200_000
    produce_stamped(broker, t, [ts0 + 1000 * i for i in range(10)])
    bs = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": t}

    def start(**o: str) -> dict:
        r = KBrokerStreamReader({**bs, **o})
        try:
            return r.initialOffset()
        finally:
            r.stop()

    assert start(startingTimestamp=str(ts0 + 2500)) == {t: {"0": 3}}
    assert start(startingTimestamp=str(ts0 + 3000)) == {t: {"0": 3}}  # at or after
    by_ts = json.dumps({t: {"0": ts0 + 6500}})
    assert start(startingOffsetsByTimestamp=by_ts) == {t: {"0": 7}}
    # Precedence: startingTimestamp over startingOffsetsByTimestamp over startingOffsets.
    both = {
        "startingTimestamp": str(ts0 + 2500),
        "startingOffsetsByTimestamp": by_ts,
        "startingOffsets": "latest",
    }
    assert start(**both) == {t: {"0": 3}}
    assert start(startingOffsetsByTimestamp=by_ts, startingOffsets="latest") == {t: {"0": 7}}
    # No record that recent: startingOffsetsByTimestampStrategy (default error; latest -> the latest offset).
    with pytest.raises(ValueError, match="startingOffsetsByTimestampStrategy"):
        start(startingTimestamp=str(ts0 + 60_000))
    assert start(startingTimestamp=str(ts0 + 60_000), startingOffsetsByTimestampStrategy="latest") == {
        t: {"0": 10}
    }
    # JSON by timestamp must name every partition (subscribe/assign).
    t2 = create_topic(admin, topic_name + "-two", partitions=2)
    with pytest.raises(ValueError, match="must specify all TopicPartitions"):
        KBrokerStreamReader(
            {**bs, "subscribe": t2, "startingOffsetsByTimestamp": json.dumps({t2: {"0": ts0}})}
        ).initialOffset()

    # Batch: endingTimestamp / endingOffsetsByTimestamp; no record that recent means latest.
    def ranges(**o: str) -> list[tuple[int, int]]:
        return [(p.start, p.end) for p in KBrokerBatchReader({**bs, **o}).partitions() if p.end > p.start]

    assert ranges(startingTimestamp=str(ts0 + 2000), endingTimestamp=str(ts0 + 5000)) == [(2, 5)]
    assert ranges(endingOffsetsByTimestamp=json.dumps({t: {"0": ts0 + 4500}})) == [(0, 5)]
    assert ranges(endingTimestamp=str(ts0 + 60_000)) == [(0, 10)]


def test_split_ranges_is_the_connectors_calculator() -> None:
    r = [KafkaRange("t", 0, 0, 100), KafkaRange("t", 1, 0, 10), KafkaRange("t", 2, 5, 5)]
    spans = lambda rs: [(x.partition, x.start, x.end) for x in rs]  # noqa: E731
    assert spans(split_ranges(r, None, None)) == [(0, 0, 100), (1, 0, 10)]
    # maxRecordsPerPartition: ceil(size / max) equal parts.
    assert spans(split_ranges(r, None, 40)) == [(0, 0, 33), (0, 33, 66), (0, 66, 100), (1, 0, 10)]
    # minPartitions: parts in proportion to size (rounded, at least one), only when there are too few ranges.
    assert spans(split_ranges(r, 4, None)) == [(0, 0, 25), (0, 25, 50), (0, 50, 75), (0, 75, 100), (1, 0, 10)]
    assert spans(split_ranges(r, 2, None)) == [(0, 0, 100), (1, 0, 10)]


def test_min_partitions_and_max_records_per_partition_in_spark(spark, broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name)
    produce_stamped(broker, t, [1_704_067_200_000 + i for i in range(30)])
    for opts, parts in (({"minPartitions": "3"}, 3), ({"maxRecordsPerPartition": "7"}, 5)):
        rows = (
            load(spark, broker, t, False, **opts)
            .selectExpr("spark_partition_id() AS task", "offset")
            .collect()
        )
        assert len({r.task for r in rows}) == parts, opts
        assert sorted(r.offset for r in rows) == list(range(30)), opts


# ---------------------------------------------------------------- sink


def writer(broker: Any, ddl: str, **opts: str) -> KBrokerBatchWriter:
    return KBrokerBatchWriter({"kafka.bootstrap.servers": broker.bootstrap, **opts}, StructType.fromDDL(ddl))


def test_sink_columns_and_topic_option(spark, broker, admin, topic_name) -> None:
    t = create_topic(admin, topic_name, partitions=2)
    other = create_topic(admin, topic_name + "-other")
    # Every documented column, with each documented type; extra columns are ignored.
    for key_t in sorted(SINK_COLUMNS["key"][1]):
        for value_t in sorted(SINK_COLUMNS["value"][1]):
            writer(broker, f"key {key_t}, value {value_t}, topic string, partition int, extra double")
    writer(broker, f"value binary, headers {next(iter(SINK_COLUMNS['headers'][1]))}", topic=t)
    for col, bad in (("value", "int"), ("key", "bigint"), ("topic", "binary"), ("partition", "bigint")):
        ddl = ", ".join(
            f"{c} {bad if c == col else 'string' if c != 'partition' else 'int'}"
            for c in ("key", "value", "topic", "partition")
        )
        with pytest.raises(ValueError, match=f"'{col}' column must be"):
            writer(broker, ddl)
    with pytest.raises(ValueError, match="'headers' column must be"):
        writer(broker, "value string, headers array<string>", topic=t)
    with pytest.raises(ValueError, match="'value' column"):
        writer(broker, "key string", topic=t)
    with pytest.raises(ValueError, match="'topic' column or the 'topic' option"):
        writer(broker, "value string")
    for param in SINK_REFUSED_KAFKA_PARAMS:
        with pytest.raises(ValueError, match=f"'kafka.{param}' is not supported"):
            writer(broker, "value string", topic=t, **{f"kafka.{param}": "x"})
    # Through Spark: the topic option overrides the column; partition and headers are honoured.
    df = spark.createDataFrame(
        [(other, "k", "v", 1, [("h", bytearray(b"x"))])],
        "topic string, key string, value string, partition int, headers array<struct<key:string,value:binary>>",
    )
    df.write.format("kbroker").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", t).mode(
        "append"
    ).save()
    got = [(m.partition(), m.key(), m.value(), m.headers()) for m in consume_all(broker.bootstrap, t)]
    assert got == [(1, b"k", b"v", [("h", b"x")])]
    assert consume_all(broker.bootstrap, other) == []
    with pytest.raises(Exception, match="'value' column must be"):
        spark.range(1).selectExpr("id AS value").write.format("kbroker").option(
            "kafka.bootstrap.servers", broker.bootstrap
        ).option("topic", t).mode("append").save()
    assert set(SINK_OPTIONS) == {"kafka.bootstrap.servers", "topic"}


def test_rejected_option_fails_the_spark_query(spark, broker, admin, topic_name, tmp_path) -> None:
    """A rejected option surfaces as a query failure naming it, not as a silently different query."""
    t = create_topic(admin, topic_name)
    q = (
        load(spark, broker, t, True, minOffsetsPerTrigger="10")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
    )
    with pytest.raises(Exception, match="minOffsetsPerTrigger"):
        query = q.start()
        query.awaitTermination(60)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))

"""A PySpark data source ("kbroker") with the contract of Spark's Kafka connector, for machines without its jars.

Spark's own connector (``format("kafka")``, spark-sql-kafka-0-10) needs Maven artifacts. This module gives the same
source and sink contract through the Python data source API (pyspark >= 4.0; admission control and
Trigger.AvailableNow need >= 4.2), using confluent-kafka (librdkafka) inside the Spark tasks:

Source options (as the connector's): ``kafka.bootstrap.servers``; exactly one of ``subscribe`` (comma list),
``subscribePattern`` (regex, whole-name match) or ``assign`` (JSON ``{"topic": [0, 1]}``); ``startingOffsets`` and,
for batch queries, ``endingOffsets`` (``earliest``, ``latest`` or JSON ``{"topic": {"0": 23, "1": -2}}`` with -2 =
earliest and -1 = latest); ``startingTimestamp`` / ``startingOffsetsByTimestamp`` (ListOffsets by timestamp, taking
precedence over ``startingOffsets``) with ``startingOffsetsByTimestampStrategy`` (``error`` or ``latest``), and for
batch queries ``endingTimestamp`` / ``endingOffsetsByTimestamp``; ``maxOffsetsPerTrigger``; ``minPartitions`` and
``maxRecordsPerPartition`` (split ranges as the connector does); ``failOnDataLoss`` (default true);
``includeHeaders``; ``kafkaConsumer.pollTimeoutMs``; ``fetchOffset.numRetries`` / ``fetchOffset.retryIntervalMs``;
``groupIdPrefix``; any other ``kafka.*`` option is handed to librdkafka without the prefix (``kafka.group.id``
included). ``minOffsetsPerTrigger`` and ``maxTriggerDelay`` are rejected, as are the Kafka settings the connector
refuses (``kafka.auto.offset.reset``, ``kafka.enable.auto.commit``, deserializers, interceptors).

Rows: key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int
and, with includeHeaders, headers array<struct<key string, value binary>>.

Offsets (in the checkpoint's offset log) are ``{"topic": {"partition": next offset}}``, the connector's format. One
input partition (Spark task) reads one topic-partition range [start, end) by assigning exact offsets, so with the
checkpoint a record is read by exactly one committed micro-batch.

Sink (batch and streaming): columns ``value`` (required, string or binary), ``key``, ``topic`` (unless the
``topic`` option is set, which wins), ``partition`` and ``headers``, type-checked as the connector does;
``kafka.key.serializer`` / ``kafka.value.serializer`` are refused; at-least-once like the connector's sink.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

try:  # pyspark >= 4.2
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except (
    ImportError
):  # pragma: no cover - older pyspark: no admission control, AvailableNow via Spark's wrapper
    ReadLimit = object  # type: ignore[misc,assignment]

    class ReadAllAvailable:  # type: ignore[no-redef]
        pass

    class ReadMaxRows:  # type: ignore[no-redef]
        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


log = logging.getLogger("spark_jobs.kbroker")

NAME = "kbroker"
EARLIEST = -2
LATEST = -1

BASE_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
HEADERS_FIELD = "headers array<struct<key: string, value: binary>>"

TPOffsets = dict[tuple[str, int], int]


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (deleted records, deleted partitions) and failOnDataLoss is true."""


# ---------------------------------------------------------------- options

# Options Spark's Kafka connector documents that this source does not implement: rejected, never ignored.
UNSUPPORTED_SOURCE_OPTIONS = {
    "minOffsetsPerTrigger": "a minimum batch size (with maxTriggerDelay) needs a composite read limit",
    "maxTriggerDelay": "it only applies with minOffsetsPerTrigger, which is not supported either",
}
# Kafka client settings the connector rejects (KafkaSourceProvider), with its reasons.
SOURCE_REJECTED_KAFKA_PARAMS = {
    "auto.offset.reset": "set the source option 'startingOffsets' to 'earliest' or 'latest' instead",
    "key.deserializer": "keys are read as byte arrays; deserialize them with DataFrame operations",
    "value.deserializer": "values are read as byte arrays; deserialize them with DataFrame operations",
    "enable.auto.commit": "offsets are kept in the checkpoint, never committed to Kafka",
    "interceptor.classes": "interceptors that change records are not supported",
}
SINK_REJECTED_KAFKA_PARAMS = {
    "key.serializer": "keys are written as bytes (a string column is UTF-8 encoded)",
    "value.serializer": "values are written as bytes (a string column is UTF-8 encoded)",
}


def _reject(opts: dict[str, str], unsupported: dict[str, str]) -> None:
    for name, why in unsupported.items():
        if name.lower() in opts:
            raise ValueError(f"option '{name}' is not supported by the kbroker source: {why}")


def _reject_kafka_params(client_conf: dict[str, str], rejected: dict[str, str]) -> None:
    for name, why in rejected.items():
        if name in client_conf:
            raise ValueError(f"Kafka option 'kafka.{name}' is not supported: {why}")


def _int_or_none(opts: dict[str, str], name: str) -> int | None:
    v = opts.get(name.lower())
    if v is None or not v.strip():
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"option '{name}' must be an integer, not {v!r}") from None


def _positive(opts: dict[str, str], name: str) -> int | None:
    n = _int_or_none(opts, name)
    if n is not None and n <= 0:
        raise ValueError(f"{name} must be positive")
    return n


def _bool(v: Any, default: bool) -> bool:
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


@dataclass(frozen=True)
class KafkaOptions:
    bootstrap: str
    client_conf: dict[str, str]
    subscribe: tuple[str, ...] | None
    pattern: str | None
    assign: tuple[tuple[str, int], ...] | None
    starting: str  # "earliest" | "latest" | JSON
    ending: str  # "latest" | JSON (batch queries)
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    include_headers: bool
    poll_timeout_s: float
    # startingTimestamp (one timestamp for every partition) or startingOffsetsByTimestamp (JSON), in that order of
    # precedence over startingOffsets; endingTimestamp / endingOffsetsByTimestamp likewise for batch queries.
    starting_timestamp: int | None = None
    starting_by_timestamp: str | None = None
    by_timestamp_strategy: str = "error"  # startingOffsetsByTimestampStrategy: error | latest
    ending_timestamp: int | None = None
    ending_by_timestamp: str | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    group_id_prefix: str = "spark-kafka-source"
    fetch_retries: int = 3  # fetchOffset.numRetries
    fetch_retry_interval_s: float = 0.01  # fetchOffset.retryIntervalMs

    @classmethod
    def parse(cls, options: Any, *, streaming: bool) -> KafkaOptions:
        opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
        bootstrap = opts.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise ValueError("option 'kafka.bootstrap.servers' must be specified")
        client_conf = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
        _reject(opts, UNSUPPORTED_SOURCE_OPTIONS)
        _reject_kafka_params(client_conf, SOURCE_REJECTED_KAFKA_PARAMS)
        given = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
        if len(given) != 1:
            raise ValueError(
                "exactly one of the options 'subscribe', 'subscribePattern', 'assign' must be specified, "
                f"got {given or 'none'}"
            )
        subscribe = pattern = assign = None
        if "subscribe" in given:
            subscribe = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
            if not subscribe:
                raise ValueError("option 'subscribe' names no topic")
        elif "subscribepattern" in given:
            pattern = opts["subscribepattern"]
            re.compile(pattern)
        else:
            spec = json.loads(opts["assign"])
            if not isinstance(spec, dict):
                raise ValueError("option 'assign' must be JSON like {\"topicA\": [0, 1]}")
            assign = tuple(sorted((str(t), int(p)) for t, ps in spec.items() for p in ps))
        starting = opts.get("startingoffsets", "latest" if streaming else "earliest").strip()
        ending = opts.get("endingoffsets", "latest").strip()
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if streaming and name.lower() in opts:
                raise ValueError(f"option '{name}' is for batch queries only")
        if not streaming and starting.lower() == "latest":
            raise ValueError("startingOffsets 'latest' is not valid for batch queries")
        if ending.lower() == "earliest":
            raise ValueError("endingOffsets 'earliest' is not valid")
        for label, spec_s in (("startingOffsets", starting), ("endingOffsets", ending)):
            if spec_s.lower() not in ("earliest", "latest"):
                parsed = json.loads(spec_s)
                if label == "endingOffsets" and any(
                    int(o) == EARLIEST for ps in parsed.values() for o in ps.values()
                ):
                    raise ValueError("endingOffsets may not use -2 (earliest)")
        max_offsets = _positive(opts, "maxOffsetsPerTrigger")
        strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise ValueError(
                f"startingOffsetsByTimestampStrategy must be 'error' or 'latest', not {strategy!r}"
            )
        for name in ("startingOffsetsByTimestamp", "endingOffsetsByTimestamp"):
            if name.lower() in opts:
                parse_offsets_json(opts[name.lower()])  # fail early on malformed JSON
        retries = int(opts.get("fetchoffset.numretries", "3"))
        if retries < 0:
            raise ValueError("fetchOffset.numRetries must not be negative")
        return cls(
            bootstrap=bootstrap,
            client_conf=client_conf,
            subscribe=subscribe,
            pattern=pattern,
            assign=assign,
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=max_offsets,
            fail_on_data_loss=_bool(opts.get("failondataloss"), True),
            include_headers=_bool(opts.get("includeheaders"), False),
            poll_timeout_s=int(opts.get("kafkaconsumer.polltimeoutms", "120000")) / 1000.0,
            starting_timestamp=_int_or_none(opts, "startingTimestamp"),
            starting_by_timestamp=opts.get("startingoffsetsbytimestamp"),
            by_timestamp_strategy=strategy,
            ending_timestamp=_int_or_none(opts, "endingTimestamp"),
            ending_by_timestamp=opts.get("endingoffsetsbytimestamp"),
            min_partitions=_positive(opts, "minPartitions"),
            max_records_per_partition=_positive(opts, "maxRecordsPerPartition"),
            group_id_prefix=opts.get("groupidprefix", "spark-kafka-source"),
            fetch_retries=retries,
            fetch_retry_interval_s=int(opts.get("fetchoffset.retryintervalms", "10")) / 1000.0,
        )

    def consumer_conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            # No group membership or commits: the offsets live in Spark's checkpoint. librdkafka wants a group.id
            # for a Consumer; it is never joined because only assign() is used.
            "group.id": f"{self.group_id_prefix}-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
            "socket.timeout.ms": 10000,
        }
        conf.update(self.client_conf)
        return conf


def parse_offsets_json(spec: str) -> TPOffsets:
    obj = json.loads(spec)
    return {(str(t), int(p)): int(o) for t, ps in obj.items() for p, o in ps.items()}


def to_json_offsets(offsets: TPOffsets) -> dict[str, dict[str, int]]:
    """{(topic, p): o} -> the connector's checkpoint format {"topic": {"p": o}} (sorted, stable)."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def from_json_offsets(obj: dict[str, Any] | None) -> TPOffsets:
    return {(str(t), int(p)): int(o) for t, ps in (obj or {}).items() for p, o in ps.items()}


# ---------------------------------------------------------------- metadata (driver side)


class Metadata:
    """Partition discovery and watermark (earliest/latest) look-ups with one librdkafka consumer."""

    def __init__(self, opts: KafkaOptions) -> None:
        from confluent_kafka import Consumer

        self.opts = opts
        self.consumer = Consumer(opts.consumer_conf())
        self.timeout = max(10.0, opts.poll_timeout_s / 4)

    def close(self) -> None:
        self.consumer.close()

    def partitions(self) -> list[tuple[str, int]]:
        o = self.opts
        if o.assign is not None:
            return list(o.assign)
        md = self.consumer.list_topics(timeout=self.timeout)
        if o.subscribe is not None:
            names = [t for t in o.subscribe if t in md.topics and md.topics[t].error is None]
        else:
            rx = re.compile(o.pattern or "")
            names = sorted(t for t in md.topics if rx.fullmatch(t) and not t.startswith("__"))
        out = []
        for t in names:
            tm = md.topics[t]
            if tm.error is not None:
                continue
            out.extend((t, p) for p in tm.partitions)
        return sorted(out)

    def watermarks(self, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        from confluent_kafka import TopicPartition

        out = {}
        for t, p in tps:
            out[(t, p)] = self._retrying(
                lambda t=t, p=p: self.consumer.get_watermark_offsets(
                    TopicPartition(t, p), timeout=self.timeout, cached=False
                )
            )
        return out

    def _retrying(self, call: Any) -> Any:
        """fetchOffset.numRetries / fetchOffset.retryIntervalMs, as the connector's offset look-ups."""
        from confluent_kafka import KafkaException

        for attempt in range(self.opts.fetch_retries + 1):
            try:
                return call()
            except KafkaException:
                if attempt >= self.opts.fetch_retries:
                    raise
                time.sleep(self.opts.fetch_retry_interval_s)
        raise AssertionError("unreachable")

    def offsets_for_times(self, stamps: dict[tuple[str, int], int], *, label: str, if_none: str) -> TPOffsets:
        """ListOffsets by timestamp: the earliest offset whose timestamp is >= the given one, per partition.

        Where no record is that recent, ``if_none`` decides: "latest" takes the latest offset, "error" fails (the
        connector's startingOffsetsByTimestampStrategy).
        """
        from confluent_kafka import TopicPartition

        if not stamps:
            return {}
        res = self._retrying(
            lambda: self.consumer.offsets_for_times(
                [TopicPartition(t, p, ts) for (t, p), ts in sorted(stamps.items())], timeout=self.timeout
            )
        )
        out: TPOffsets = {}
        none: list[tuple[str, int]] = []
        for tp in res:
            if tp.error is not None:
                raise RuntimeError(f"{label}: ListOffsets for {tp.topic}-{tp.partition} failed: {tp.error}")
            if tp.offset < 0:
                none.append((tp.topic, tp.partition))
            else:
                out[(tp.topic, tp.partition)] = tp.offset
        if none:
            if if_none == "error":
                raise ValueError(
                    f"{label}: no record at or after the given timestamp in {sorted(none)}. Set "
                    "startingOffsetsByTimestampStrategy=latest to start those partitions at the latest offset."
                )
            out.update(self.latest(none))
        return out

    def _by_timestamp(
        self, spec: str, tps: Sequence[tuple[str, int]], *, label: str, if_none: str
    ) -> TPOffsets:
        given = parse_offsets_json(spec)
        if self.opts.pattern is None:
            missing = sorted(set(tps) - set(given))
            if missing:
                raise ValueError(
                    f"{label} contains specific timestamps, so it must specify all TopicPartitions; "
                    f"missing {missing}"
                )
        out = self.offsets_for_times(
            {tp: ts for tp, ts in given.items() if tp in set(tps)}, label=label, if_none=if_none
        )
        # With subscribePattern, matching partitions the JSON does not name start at earliest.
        out.update(self.earliest([tp for tp in tps if tp not in out]))
        return out

    def resolve_start(self, tps: Sequence[tuple[str, int]]) -> TPOffsets:
        """startingTimestamp, else startingOffsetsByTimestamp, else startingOffsets (the connector's precedence)."""
        o = self.opts
        if o.starting_timestamp is not None:
            return self.offsets_for_times(
                {tp: o.starting_timestamp for tp in tps},
                label="startingTimestamp",
                if_none=o.by_timestamp_strategy,
            )
        if o.starting_by_timestamp is not None:
            return self._by_timestamp(
                o.starting_by_timestamp,
                tps,
                label="startingOffsetsByTimestamp",
                if_none=o.by_timestamp_strategy,
            )
        return self.resolve(o.starting, tps, label="startingOffsets")

    def resolve_end(self, tps: Sequence[tuple[str, int]]) -> TPOffsets:
        """endingTimestamp, else endingOffsetsByTimestamp, else endingOffsets; no match means latest."""
        o = self.opts
        if o.ending_timestamp is not None:
            return self.offsets_for_times(
                {tp: o.ending_timestamp for tp in tps}, label="endingTimestamp", if_none="latest"
            )
        if o.ending_by_timestamp is not None:
            return self._by_timestamp(
                o.ending_by_timestamp, tps, label="endingOffsetsByTimestamp", if_none="latest"
            )
        return self.resolve(o.ending, tps, label="endingOffsets")

    def earliest(self, tps: Sequence[tuple[str, int]]) -> TPOffsets:
        return {tp: lo for tp, (lo, _) in self.watermarks(tps).items()}

    def latest(self, tps: Sequence[tuple[str, int]]) -> TPOffsets:
        return {tp: hi for tp, (_, hi) in self.watermarks(tps).items()}

    def resolve(self, spec: str, tps: Sequence[tuple[str, int]], *, label: str) -> TPOffsets:
        """startingOffsets / endingOffsets -> concrete offsets for every partition in tps."""
        s = spec.lower()
        if s == "earliest":
            return self.earliest(tps)
        if s == "latest":
            return self.latest(tps)
        given = parse_offsets_json(spec)
        if self.opts.pattern is None:
            missing = sorted(set(tps) - set(given))
            if missing:
                raise ValueError(
                    f"{label} contains specific offsets, so it must specify all TopicPartitions; "
                    f"missing {missing}"
                )
        # With subscribePattern, matching partitions the JSON does not name start at earliest.
        marks = self.watermarks(tps)
        out = {}
        for tp in tps:
            o = given.get(tp, EARLIEST)
            lo, hi = marks[tp]
            out[tp] = lo if o == EARLIEST else hi if o == LATEST else o
        return out


# ---------------------------------------------------------------- reading a range (executor side)


class KafkaRange(InputPartition):
    """One Spark task: records [start, end) of one topic-partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"KafkaRange({self.topic}-{self.partition} [{self.start}, {self.end}))"


def _ts_type(kind: int) -> int:
    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME

    return 0 if kind == TIMESTAMP_CREATE_TIME else 1 if kind == TIMESTAMP_LOG_APPEND_TIME else -1


def read_range(opts: KafkaOptions, rng: KafkaRange) -> Iterator[tuple]:
    """Yield the connector's row tuples for offsets [rng.start, rng.end), exactly, with a fresh client."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    if rng.end <= rng.start:
        return
    consumer = Consumer(opts.consumer_conf())
    try:
        tp = TopicPartition(rng.topic, rng.partition)
        lo, hi = consumer.get_watermark_offsets(tp, timeout=max(10.0, opts.poll_timeout_s / 4), cached=False)
        start, end = rng.start, rng.end
        if start < lo:
            msg = (
                f"offsets [{start}, {min(lo, end)}) of {rng.topic}-{rng.partition} are no longer available "
                f"(log start offset {lo}): records were deleted or aged out"
            )
            if opts.fail_on_data_loss:
                raise DataLossError(msg + ". Set failOnDataLoss=false to skip them.")
            log.warning("%s; skipping them (failOnDataLoss=false)", msg)
            start = lo
        if end > hi:
            msg = f"{rng.topic}-{rng.partition} ends at {hi} but the batch needs offsets up to {end}"
            if opts.fail_on_data_loss:
                raise DataLossError(msg + ". Set failOnDataLoss=false to skip them.")
            log.warning("%s; reading up to %d (failOnDataLoss=false)", msg, hi)
            end = hi
        if start >= end:
            return
        consumer.assign([TopicPartition(rng.topic, rng.partition, start)])
        deadline = time.monotonic() + opts.poll_timeout_s
        next_offset = start
        done = False
        while not done:
            # Ask for exactly what is left of the range, so the call returns as soon as it has arrived.
            msgs = consumer.consume(num_messages=max(1, min(500, end - next_offset)), timeout=0.5)
            if not msgs:
                # Gaps (compaction, transaction markers, aborted records) can end the range without a record at
                # end - 1: the fetch position tells whether the range is exhausted.
                pos = consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset
                if pos >= end:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"timed out reading {rng.topic}-{rng.partition} [{start}, {end}) at position {pos}"
                    )
                continue
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= end:
                            done = True
                        continue
                    if (
                        err.code() == KafkaError._AUTO_OFFSET_RESET
                        or err.code() == KafkaError.OFFSET_OUT_OF_RANGE
                    ):
                        text = (
                            f"offset out of range reading {rng.topic}-{rng.partition} [{start}, {end}): {err}"
                        )
                        if opts.fail_on_data_loss:
                            raise DataLossError(text)
                        log.warning("%s; stopping this range (failOnDataLoss=false)", text)
                        done = True
                        break
                    raise RuntimeError(f"error reading {rng.topic}-{rng.partition}: {err}")
                off = m.offset()
                if off >= end:
                    done = True
                    break
                if off < start:
                    continue
                kind, ts = m.timestamp()
                row: tuple = (
                    m.key(),
                    m.value(),
                    m.topic(),
                    m.partition(),
                    off,
                    datetime.fromtimestamp(ts / 1000.0, tz=UTC) if ts is not None and ts >= 0 else None,
                    _ts_type(kind),
                )
                if opts.include_headers:
                    row += ([(k, v) for k, v in (m.headers() or [])],)
                yield row
                next_offset = off + 1
                deadline = time.monotonic() + opts.poll_timeout_s
                if off >= end - 1:
                    done = True
                    break
    finally:
        consumer.close()


# ---------------------------------------------------------------- readers


def _rate_limit(start: TPOffsets, latest: TPOffsets, limit: int) -> TPOffsets:
    """The connector's maxOffsetsPerTrigger split: prorated by each partition's backlog, never starving one."""
    sizes = {tp: hi - start.get(tp, 0) for tp, hi in latest.items() if hi - start.get(tp, 0) > 0}
    total = float(sum(sizes.values()))
    if total <= limit:
        return dict(latest)
    out = dict(latest)
    for tp, size in sizes.items():
        begin = start.get(tp, 0)
        prorate = limit * (size / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(latest[tp], begin + step)
    return out


def split_ranges(
    ranges: list[KafkaRange], min_partitions: int | None, max_records: int | None
) -> list[KafkaRange]:
    """The connector's KafkaOffsetRangeCalculator: maxRecordsPerPartition splits each range into parts of at most
    that many offsets; then, when there are fewer than minPartitions ranges, each range is split into
    max(1, round(size / total * minPartitions)) parts of (nearly) equal size."""

    def divide(r: KafkaRange, parts: int) -> list[KafkaRange]:
        size = r.end - r.start
        return [
            KafkaRange(
                r.topic, r.partition, r.start + int(size * i / parts), r.start + int(size * (i + 1) / parts)
            )
            for i in range(parts)
        ]

    out = [r for r in ranges if r.end > r.start]
    if max_records is not None:
        out = [
            part
            for r in out
            for part in (
                divide(r, math.ceil((r.end - r.start) / max_records))
                if r.end - r.start > max_records
                else [r]
            )
        ]
    if min_partitions is not None and len(out) < min_partitions:
        total = sum(r.end - r.start for r in out)
        out = [
            part
            for r in out
            for part in divide(r, max(1, math.floor((r.end - r.start) / total * min_partitions + 0.5)))
        ]
    return [r for r in out if r.end > r.start]


class _MetadataMixin:
    """A lazily created driver-side Metadata client that is never pickled to the tasks."""

    opts: KafkaOptions
    _md: Metadata | None = None

    def _metadata(self) -> Metadata:
        if self._md is None:
            self._md = Metadata(self.opts)
        return self._md

    def _close_metadata(self) -> None:
        if self._md is not None:
            self._md.close()
            self._md = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_md"] = None
        return state


class KBrokerStreamReader(_MetadataMixin, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Any) -> None:
        self.opts = KafkaOptions.parse(options, streaming=True)
        self._md = None
        self._target: TPOffsets | None = None

    # -- offsets, on the driver

    def initialOffset(self) -> dict:
        md = self._metadata()
        tps = md.partitions()
        offsets = md.resolve_start(tps)
        log.info("kbroker source: initial offsets %s", to_json_offsets(offsets))
        return to_json_offsets(offsets)

    def _current_latest(self) -> TPOffsets:
        md = self._metadata()
        return md.latest(md.partitions())

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._current_latest()
        log.info("kbroker source: Trigger.AvailableNow target %s", to_json_offsets(self._target))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return to_json_offsets(self._current_latest())

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        begin = from_json_offsets(start)
        latest = dict(self._target) if self._target is not None else self._current_latest()
        gone = sorted(set(begin) - set(latest))
        if gone and self._target is None:
            msg = f"partitions {gone} were deleted"
            if self.opts.fail_on_data_loss:
                raise DataLossError(msg + ". Set failOnDataLoss=false to ignore them.")
            log.warning("%s; ignoring them (failOnDataLoss=false)", msg)
        # A partition missing from the start offsets is new: it is read from offset 0 (the task checks that
        # against the log start offset). A deleted partition keeps its last offset, so its range is empty.
        end: TPOffsets = dict(latest)
        for tp in gone:
            end[tp] = begin[tp]
        if isinstance(limit, ReadMaxRows):
            end = _rate_limit({tp: begin.get(tp, 0) for tp in end}, end, limit.max_rows)
        return to_json_offsets(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        s, e = from_json_offsets(start), from_json_offsets(end)
        out = []
        for tp, hi in sorted(e.items()):
            lo = s.get(tp, 0)
            if tp not in s:
                log.info("kbroker source: new partition %s-%d, reading from offset 0", *tp)
            if hi < lo:
                msg = f"{tp[0]}-{tp[1]} offset went back from {lo} to {hi} (topic recreated?)"
                if self.opts.fail_on_data_loss:
                    raise DataLossError(msg + ". Set failOnDataLoss=false to skip.")
                log.warning("%s; skipping (failOnDataLoss=false)", msg)
                continue
            if hi > lo:
                out.append(KafkaRange(tp[0], tp[1], lo, hi))
        return split_ranges(out, self.opts.min_partitions, self.opts.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.opts, partition)

    def commit(self, end: dict) -> None:
        # Offsets are in Spark's checkpoint; nothing is committed to the broker (as the connector does).
        pass

    def stop(self) -> None:
        self._close_metadata()


class KBrokerBatchReader(_MetadataMixin, DataSourceReader):
    def __init__(self, options: Any) -> None:
        self.opts = KafkaOptions.parse(options, streaming=False)
        self._md = None

    def partitions(self) -> Sequence[InputPartition]:
        md = self._metadata()
        try:
            tps = md.partitions()
            start = md.resolve_start(tps)
            end = md.resolve_end(tps)
        finally:
            self._close_metadata()
        out = []
        for tp in sorted(start):
            lo, hi = start[tp], end.get(tp, start[tp])
            if hi < lo:
                raise ValueError(f"endingOffsets {hi} is before startingOffsets {lo} for {tp[0]}-{tp[1]}")
            if hi > lo:
                out.append(KafkaRange(tp[0], tp[1], lo, hi))
        out = split_ranges(out, self.opts.min_partitions, self.opts.max_records_per_partition)
        # Spark wants at least one partition; an empty range reads nothing.
        return out or [KafkaRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.opts, partition)


# ---------------------------------------------------------------- writers


@dataclass
class WriteResult(WriterCommitMessage):
    records: int


def _bytes(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode("utf-8")
    return bytes(v)


def _check_sink_types(types: dict[str, Any]) -> None:
    """The connector's sink column types (KafkaWriter.validateQuery); other columns are ignored."""
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType

    def is_headers(t: Any) -> bool:
        if not isinstance(t, ArrayType) or not isinstance(t.elementType, StructType):
            return False
        fields = {f.name: f.dataType for f in t.elementType.fields}
        return (
            set(fields) == {"key", "value"}
            and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], BinaryType)
        )

    rules = {
        "value": (lambda t: isinstance(t, StringType | BinaryType), "a string or binary"),
        "key": (lambda t: isinstance(t, StringType | BinaryType), "a string or binary"),
        "topic": (lambda t: isinstance(t, StringType), "a string"),
        "partition": (lambda t: isinstance(t, IntegerType), "an int"),
        "headers": (is_headers, "an array<struct<key: string, value: binary>>"),
    }
    for name, (ok, what) in rules.items():
        if name in types and not ok(types[name]):
            raise ValueError(
                f"the kbroker sink's '{name}' column must be {what}, not {types[name].simpleString()}"
            )


class _ProducerWriter:
    def __init__(self, options: Any, schema: StructType) -> None:
        opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
        self.bootstrap = opts.get("kafka.bootstrap.servers")
        if not self.bootstrap:
            raise ValueError("option 'kafka.bootstrap.servers' must be specified")
        self.client_conf = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
        _reject_kafka_params(self.client_conf, SINK_REJECTED_KAFKA_PARAMS)
        self.topic = opts.get("topic")
        types = {f.name.lower(): f.dataType for f in schema.fields}
        if "value" not in types:
            raise ValueError("the kbroker sink needs a 'value' column (string or binary)")
        if self.topic is None and "topic" not in types:
            raise ValueError("the kbroker sink needs a 'topic' column or the 'topic' option")
        _check_sink_types(types)

    def write(self, iterator: Iterator[Any]) -> WriteResult:
        from confluent_kafka import Producer

        conf: dict[str, Any] = {"acks": "all", "linger.ms": 5}
        conf.update(self.client_conf)
        producer = Producer(conf)
        errors: list[Any] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        n = 0
        for row in iterator:
            d = row.asDict() if hasattr(row, "asDict") else dict(row)
            topic = self.topic or d.get("topic")
            if not topic:
                raise ValueError("null topic: set the 'topic' option or a non-null 'topic' column")
            kwargs: dict[str, Any] = {"value": _bytes(d.get("value")), "key": _bytes(d.get("key"))}
            if d.get("partition") is not None:
                kwargs["partition"] = int(d["partition"])
            hdrs = d.get("headers")
            if hdrs:
                kwargs["headers"] = [(h["key"], _bytes(h["value"])) for h in hdrs]
            while True:
                try:
                    producer.produce(topic, on_delivery=on_delivery, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
            n += 1
        remaining = producer.flush(60)
        if remaining:
            raise RuntimeError(f"{remaining} records not delivered within 60 s")
        if errors:
            raise RuntimeError(f"{len(errors)} records failed, first: {errors[0]}")
        return WriteResult(n)


class KBrokerBatchWriter(_ProducerWriter, DataSourceWriter):
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info(
            "kbroker sink: wrote %d records", sum(m.records for m in messages if isinstance(m, WriteResult))
        )


class KBrokerStreamWriter(_ProducerWriter, DataSourceStreamWriter):
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        n = sum(m.records for m in messages if isinstance(m, WriteResult))
        log.info("kbroker sink: batch %d wrote %d records", batchId, n)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("kbroker sink: batch %d aborted (records already sent stay: at-least-once)", batchId)


# ---------------------------------------------------------------- the data source


class KBrokerDataSource(DataSource):
    """``spark.dataSource.register(KBrokerDataSource)`` then ``format("kbroker")`` with the connector's options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        inc = _bool({str(k).lower(): v for k, v in dict(self.options).items()}.get("includeheaders"), False)
        return BASE_SCHEMA + (", " + HEADERS_FIELD if inc else "")

    def reader(self, schema: StructType) -> DataSourceReader:
        return KBrokerBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KBrokerStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return KBrokerBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return KBrokerStreamWriter(self.options, schema)


def register(spark: Any) -> None:
    """Register the data source on a SparkSession (idempotent).

    The module is pickled by value, so Spark's Python workers need confluent-kafka but not this package: the job
    runs from a source checkout, a zip or an installed wheel alike.
    """
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(KBrokerDataSource)

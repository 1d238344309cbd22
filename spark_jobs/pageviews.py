"""Activity-stream analytics: page views per page in 1-minute event-time windows, Kafka topic in, Kafka topic out.

Input records: JSON ``{"ts": <epoch ms>, "user": "<id>", "page": "<path>"}``. Output: one record per closed window
(append mode behind a watermark), key = page, value = JSON
``{"page", "window_start", "window_end" (ISO-8601 UTC), "views"}``.

    python -m kbroker.spark_jobs.pageviews --bootstrap-servers HOST:PORT --input-topic T --output-topic O \\
        --checkpoint DIR [--trigger available-now|<seconds>] [--source kafka|python|auto] [--shuffle-partitions N]

``--source kafka`` uses Spark's own connector: given with ``--packages`` or ``--jars``, or else resolved by Spark's
Ivy into the project's cache (``kbroker.spark_jobs.connector``); ``--source python`` the project's Python data
source (``format("kbroker")``), and ``auto`` (the default) the connector when it can be had and the Python source
otherwise. The job ends with one summary line on stdout.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kbroker.spark_jobs import connector

log = logging.getLogger("spark_jobs.pageviews")

EVENT_SCHEMA = "ts long, user string, page string"
KAFKA_NOT_FOUND_CONDITIONS = ("KAFKA_DATA_SOURCE_NOT_ENABLED", "DATA_SOURCE_NOT_FOUND")


class KafkaConnectorMissing(RuntimeError):
    """--source kafka, but Spark cannot load format('kafka'): the message is the one line a user needs."""


CONNECTOR_MISSING = (
    "--source kafka: Spark's Kafka connector (spark-sql-kafka-0-10) is not on the classpath{why}; either use "
    "--source python (this project's data source, no jars), or give the connector and its dependencies "
    "(kafka-clients, commons-pool2, spark-token-provider-kafka-0-10) with --jars a.jar,b.jar or "
    "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
)


def python_worker_env(environ: dict[str, str] | os._Environ[str], executable: str) -> dict[str, str]:
    """PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON to set so that Spark's Python workers run this interpreter.

    Spark starts its workers with `python3` from PATH; from a virtualenv that is not activated that is another
    interpreter without pyspark/pyarrow, and the job fails a minute later with "Python worker failed to connect
    back". A value the user set is kept."""
    return {k: executable for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON") if not environ.get(k)}


@dataclass
class JobConfig:
    bootstrap_servers: str
    input_topic: str
    output_topic: str
    checkpoint: str
    trigger: str = "available-now"  # or a number of seconds (processing-time trigger)
    source: str = "auto"  # kafka | python | auto
    window: str = "1 minute"
    watermark: str = "1 minute"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    query_name: str | None = None


def kafka_connector_available(spark: Any) -> bool:
    """True when Spark's own Kafka connector (spark-sql-kafka-0-10) is on the classpath."""
    from pyspark.errors import AnalysisException

    try:
        # Creating the streaming relation resolves the provider class; it does not connect.
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:1").option(
            "subscribe", "probe"
        ).load()
        return True
    except AnalysisException as e:
        cond = e.getCondition() if hasattr(e, "getCondition") else e.getErrorClass()
        if cond in KAFKA_NOT_FOUND_CONDITIONS:
            return False
        raise


def choose_format(spark: Any, source: str) -> str:
    """Resolve --source to the format name to use for both source and sink: 'kafka' or 'kbroker'."""
    from kbroker.spark_jobs.kbroker_source import NAME, register

    if source not in ("kafka", "python", "auto"):
        raise ValueError(f"--source must be kafka, python or auto, not {source!r}")
    if source == "kafka":
        if not kafka_connector_available(spark):
            import pyspark

            raise KafkaConnectorMissing(CONNECTOR_MISSING.format(version=pyspark.__version__, why=""))
        fmt = "kafka"
        log.info("source/sink: Spark's Kafka connector (format 'kafka'), as requested")
    elif source == "python":
        fmt = NAME
        log.info("source/sink: Python data source (format '%s'), as requested", NAME)
    elif kafka_connector_available(spark):
        fmt = "kafka"
        log.info("source/sink: auto chose Spark's Kafka connector (format 'kafka'): found on the classpath")
    else:
        fmt = NAME
        log.info(
            "source/sink: auto chose the Python data source (format '%s'): format('kafka') is unavailable "
            "(KAFKA_DATA_SOURCE_NOT_ENABLED)",
            NAME,
        )
    if fmt == NAME:
        register(spark)
    return fmt


def build_counts(raw: Any, window: str = "1 minute", watermark: str = "1 minute") -> Any:
    """Kafka rows (key, value, ...) -> output rows (key, value) with one row per closed (window, page)."""
    from pyspark.sql import functions as F

    iso = "yyyy-MM-dd'T'HH:mm:ss'Z'"
    events = (
        raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("e.*")
        .where(F.col("ts").isNotNull() & F.col("page").isNotNull())
        .withColumn("event_time", F.timestamp_millis(F.col("ts")))
    )
    counts = (
        events.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window).alias("w"), F.col("page"))
        .agg(F.count(F.lit(1)).alias("views"))
    )
    return counts.select(
        F.col("page").alias("key"),
        F.to_json(
            F.struct(
                F.col("page"),
                F.date_format(F.col("w.start"), iso).alias("window_start"),
                F.date_format(F.col("w.end"), iso).alias("window_end"),
                F.col("views"),
            )
        ).alias("value"),
    )


def start_query(spark: Any, cfg: JobConfig) -> Any:
    """Build and start the streaming query; returns the StreamingQuery (the caller awaits it)."""
    # Window bounds are rendered as UTC wall-clock time.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    fmt = choose_format(spark, cfg.source)
    reader = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", cfg.bootstrap_servers)
        .option("subscribe", cfg.input_topic)
        .option("startingOffsets", cfg.starting_offsets)
        .option("failOnDataLoss", str(cfg.fail_on_data_loss).lower())
    )
    if cfg.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(cfg.max_offsets_per_trigger))
    out = build_counts(reader.load(), cfg.window, cfg.watermark)
    writer = (
        out.writeStream.format(fmt)
        .outputMode("append")
        .option("kafka.bootstrap.servers", cfg.bootstrap_servers)
        .option("topic", cfg.output_topic)
        .option("checkpointLocation", cfg.checkpoint)
    )
    if cfg.query_name:
        writer = writer.queryName(cfg.query_name)
    if cfg.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        secs = float(cfg.trigger)
        writer = writer.trigger(processingTime=f"{secs} seconds")
    query = writer.start()
    log.info(
        "started query %s (format %s, trigger %s, checkpoint %s)", query.id, fmt, cfg.trigger, cfg.checkpoint
    )
    return query


def run(spark: Any, cfg: JobConfig, timeout: float | None = None) -> Any:
    """Start the query and wait: until Trigger.AvailableNow has processed what was there, or forever/timeout."""
    query = start_query(spark, cfg)
    query.awaitTermination(timeout)
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")
    return query


def connector_conf() -> dict[str, str]:
    """Session settings that load Spark's Kafka connector, resolving it into the cache on first use."""
    t0 = time.monotonic()
    coord = connector.fetch()
    log.info("connector: %s from %s (%.1f s)", coord, connector.ivy_dir(), time.monotonic() - t0)
    return connector.spark_conf(coord)


def collect_progress(query: Any, into: dict[int, dict[str, Any]]) -> None:
    """Keep each micro-batch's progress by batch id (Spark keeps only the most recent ones)."""
    for p in query.recentProgress:
        into[p.batchId] = {
            "rows": p.numInputRows,
            "out": p.sink.numOutputRows if p.sink is not None else -1,
            "source": p.sources[0].description if p.sources else "",
        }


def summary(progress: dict[int, dict[str, Any]], seconds: float, outcome: str) -> str:
    """The job's last line: what it read and wrote and how long it took."""
    rows = sum(p["rows"] for p in progress.values())
    outs = [p["out"] for p in progress.values()]
    written = str(sum(outs)) if outs and min(outs) >= 0 else "?"
    source = next((p["source"] for p in progress.values() if p["source"]), "")
    kind = "connector" if source.startswith("Kafka") else "python source"
    return (
        f"pageviews: {outcome}: {rows} events in {len(progress)} micro-batches, {written} windows written "
        f"({kind}), {seconds:.1f} s"
    )


def parse_args(argv: Sequence[str] | None = None) -> tuple[JobConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(
        prog="python -m kbroker.spark_jobs.pageviews", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--bootstrap-servers", required=True, help="HOST:PORT[,HOST:PORT...]")
    p.add_argument("--input-topic", required=True)
    p.add_argument("--output-topic", required=True)
    p.add_argument("--checkpoint", required=True, help="checkpoint directory: restart with the same one")
    p.add_argument("--trigger", default="available-now", help="available-now (default) or <seconds>")
    p.add_argument("--source", default="auto", choices=("kafka", "python", "auto"))
    p.add_argument("--window", default="1 minute", help="window duration (default: 1 minute)")
    p.add_argument("--watermark", default="1 minute", help="allowed lateness (default: 1 minute)")
    p.add_argument("--starting-offsets", default="earliest", help="for a new checkpoint (default: earliest)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument(
        "--no-fail-on-data-loss", action="store_true", help="skip deleted offsets instead of failing"
    )
    p.add_argument(
        "--master", default=None, help="Spark master when not run by spark-submit (default local[*])"
    )
    p.add_argument(
        "--packages", default=None, help="spark.jars.packages, e.g. the Kafka connector's coordinates"
    )
    p.add_argument(
        "--jars",
        default=None,
        help="spark.jars: comma-separated jar files on disk, e.g. the Kafka connector and its dependencies",
    )
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        help="spark.sql.shuffle.partitions for a new checkpoint (state partitions; Spark's default is 200)",
    )
    a = p.parse_args(argv)
    if a.trigger != "available-now":
        try:
            if float(a.trigger) <= 0:
                raise ValueError
        except ValueError:
            p.error("--trigger must be 'available-now' or a positive number of seconds")
    cfg = JobConfig(
        bootstrap_servers=a.bootstrap_servers,
        input_topic=a.input_topic,
        output_topic=a.output_topic,
        checkpoint=a.checkpoint,
        trigger=a.trigger,
        source=a.source,
        window=a.window,
        watermark=a.watermark,
        starting_offsets=a.starting_offsets,
        max_offsets_per_trigger=a.max_offsets_per_trigger,
        fail_on_data_loss=not a.no_fail_on_data_loss,
    )
    return cfg, a


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg, a = parse_args(argv)
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    os.environ.update(python_worker_env(os.environ, sys.executable))
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName("kbroker-pageviews")
    if a.master:
        b = b.master(a.master)
    elif "spark.master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", "") and not os.environ.get("SPARK_HOME"):
        b = b.master("local[*]")
    if a.packages:
        b = b.config("spark.jars.packages", a.packages)
    if a.jars:
        b = b.config("spark.jars", a.jars)
    if not (a.packages or a.jars) and cfg.source in ("kafka", "auto"):
        try:
            for key, value in connector_conf().items():
                b = b.config(key, value)
        except connector.ConnectorUnavailable as e:
            if cfg.source == "kafka":
                import pyspark

                why = f" and could not be resolved ({e})"
                print(
                    f"pageviews: {CONNECTOR_MISSING.format(version=pyspark.__version__, why=why)}",
                    file=sys.stderr,
                )
                return 2
            log.info("source/sink: the connector cannot be had (%s)", e)
    if a.shuffle_partitions:
        b = b.config("spark.sql.shuffle.partitions", str(a.shuffle_partitions))
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    stop_requested: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping the query when no micro-batch is running", signum)
        stop_requested.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    t0 = time.monotonic()
    progress: dict[int, dict[str, Any]] = {}
    try:
        try:
            query = start_query(spark, cfg)
        except KafkaConnectorMissing as e:
            print(f"pageviews: {e}", file=sys.stderr)
            return 2
        while not query.awaitTermination(0.5):
            collect_progress(query, progress)
            if stop_requested:
                # Let a running micro-batch finish (up to 60 s) so it is committed, not redone after a restart.
                deadline = time.monotonic() + 60
                while query.status.get("isTriggerActive") and time.monotonic() < deadline:
                    time.sleep(0.2)
                query.stop()
                break
        collect_progress(query, progress)
        failed = query.exception()
        print(
            summary(progress, time.monotonic() - t0, "failed" if failed is not None else "done"), flush=True
        )
        if failed is not None:
            log.error("streaming query failed: %s", failed)
            return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

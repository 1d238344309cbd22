"""Workload spark: the page-view job reading 1M events from kbroker and writing its windows back, through Spark's
own Kafka connector and through the project's Python data source, in the same run on the same input.

Run it by name, `python -m bench spark` (not in the default set: it needs pyspark and Java).

One local Spark session (local[2], 4 shuffle partitions) loads the connector (kbroker.spark_jobs.connector) and
runs the job once per path and repetition with Trigger.AvailableNow, a fresh checkpoint and output topic each time,
after one uncounted warm-up job per path and broker (not with --quick), alternating the order between repetitions.
records/s = input records / the micro-batches' own time (triggerExecution), so the JVM start is not in it; the
session's start (with the connector from the cache) is given in the note. --quick reads 100k records. The connector
path also reads the same events from Apache Kafka 3.9 (bench.peers.kafka) in the same run, the yardstick issue 31
sets; librdkafka's mock cluster cannot be read by Spark's connector in a comparable way, so its column is empty.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

from bench.harness import Ctx, KafkaTarget, KBroker, Row, Target, workdir

PARTITIONS = 4
PAGES = [f"/page/{i}" for i in range(50)]


def produce_events(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    rnd = random.Random(31)
    p = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000, "acks": "all"}
    )
    t0 = 1_704_067_200_000
    for i in range(count):
        # Event time advances 1 ms per event: 1M events span ~17 minutes, 15 closed one-minute windows x 50 pages.
        ev = {
            "ts": t0 + i + rnd.randrange(500),
            "user": f"u{rnd.randrange(10_000)}",
            "page": rnd.choice(PAGES),
        }
        while True:
            try:
                p.produce(topic, json.dumps(ev).encode())
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def written(bootstrap: str, topic: str) -> int:
    """Records in the output topic (its high watermark): the windows the run wrote."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-spark"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        c.close()


def session(ctx: Ctx) -> tuple[Any, float]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from kbroker.spark_jobs import connector
    from kbroker.spark_jobs.kbroker_source import register
    from pyspark.sql import SparkSession

    t0 = time.monotonic()
    b = SparkSession.builder.master("local[2]").appName("kbroker-bench-spark")
    for k, v in connector.spark_conf(connector.fetch()).items():
        b = b.config(k, v)
    b = (
        b.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
    )
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    return s, time.monotonic() - t0


def run(ctx: Ctx) -> list[Row]:
    from kbroker.spark_jobs import pageviews

    count = int((100_000 if ctx.quick else 1_000_000) * ctx.scale)
    label = f"{count / 1e6:g}M" if count >= 1_000_000 else f"{count // 1000}k"
    rows = {
        src: Row(f"spark pageviews job, {label} events in, 1-min windows out: {name}", "records/s")
        for src, name in (
            ("kafka", "Spark's Kafka connector"),
            ("python", "Python data source (format kbroker)"),
        )
    }
    kb = KBroker(ctx.base)
    spark = None
    kafka: KafkaTarget | None = None
    kafka_note = ""
    try:
        kb.start()
        prepare(kb.bootstrap, count, ctx)
        spark, start_s = session(ctx)
        ckpts = workdir(ctx.base, "spark-ckpt")
        try:
            kafka = KafkaTarget(ctx.base, "3.9")
            kafka.start()
            prepare(kafka.bootstrap, count, ctx)
        except Exception as e:  # noqa: BLE001  (no Java, no jars: the kbroker rows stand alone, saying why)
            kafka_note = f"; Apache Kafka column empty: {e}"
            if kafka is not None and kafka.proc is not None:
                kafka.stop()
            kafka = None
        windows: dict[str, int] = {}
        runs: list[tuple[str, Target | KBroker]] = [(src, kb) for src in rows]
        if kafka is not None:
            runs.append(("kafka", kafka))
        if not ctx.quick:
            # One uncounted job per source and broker first: the session's first job pays for the JIT, the
            # Python workers and the connector's classes (51k against 82-86k records/s in the first full run).
            for src, target in runs:
                if not ctx.out_of_time(f"spark warm-up {src} on {target.name}"):
                    warm = f"{target.name.replace(' ', '').lower()}-{src}-warm"
                    run_job(spark, pageviews, target.bootstrap, src, warm, ckpts, count)
        for rep in range(ctx.reps):
            runs.reverse()  # A/B/A/B across repetitions: nobody always runs first or last
            for src, target in runs:
                if ctx.out_of_time(f"spark {src} on {target.name} rep {rep + 1}"):
                    continue
                name = f"{target.name.replace(' ', '').lower()}-{src}-{rep}"  # a topic name: no spaces
                n, busy, phases = run_job(spark, pageviews, target.bootstrap, src, name, ckpts, count)
                rows[src].add(target, n / busy)
                if target is kb:
                    windows[src] = written(kb.bootstrap, f"pv-out-{name}")
                ctx.log(
                    f"  spark {src} on {target.name} rep {rep + 1}: {n} records in {busy:.1f} s of "
                    f"micro-batches ({n / busy:,.0f} records/s); {phases}"
                )
        note = (
            f"local[2]; Spark session start with the connector from the cache {start_s:.1f} s (not counted); "
            f"windows written per run: {windows.get('kafka', '?')} (connector), {windows.get('python', '?')} "
            f"(Python source); the connector also read the same events from Apache Kafka 3.9{kafka_note}"
        )
        for r in rows.values():
            r.note = note
    finally:
        if spark is not None:
            spark.stop()
        if kafka is not None:
            kafka.stop()
        kb.stop()
    return list(rows.values())


def prepare(bootstrap: str, count: int, ctx: Ctx) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic("pv-in", PARTITIONS, 1)]).values():
        f.result(30)
    t0 = time.monotonic()
    produce_events(bootstrap, "pv-in", count)
    ctx.log(f"  produced {count} events to {bootstrap} in {time.monotonic() - t0:.1f} s")


def run_job(
    spark: Any, pageviews: Any, bootstrap: str, src: str, name: str, ckpts: Any, count: int
) -> tuple[int, float, str]:
    """One run of the job with a fresh output topic and checkpoint: (records read, seconds of micro-batches, where
    those seconds went by Spark's own phase names)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    out = f"pv-out-{name}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a collected client cancels its requests
    for f in admin.create_topics([NewTopic(out, 1, 1)]).values():
        f.result(30)
    cfg = pageviews.JobConfig(bootstrap, "pv-in", out, str(ckpts / name), source=src)
    q = pageviews.run(spark, cfg)
    progress = q.recentProgress
    n = sum(p["numInputRows"] for p in progress)
    busy = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    assert n == count, f"{src} on {bootstrap}: read {n} of {count}"
    phases: dict[str, int] = {}
    for prog in progress:
        for k, v in prog["durationMs"].items():
            if k != "triggerExecution":
                phases[k] = phases.get(k, 0) + v
    spent = ", ".join(
        f"{k} {v / 1000:.1f} s" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]) if v >= 50
    )
    return n, busy, f"{len(progress)} micro-batches: {spent}"

"""Page views per page from Avro records written through the schema registry: a batch job that reads a topic,
strips Confluent's 5-byte framing (magic byte, schema id), decodes with Spark's `from_avro` and the writer schema
fetched from the registry, and prints one JSON line per page with its view count.

    python -m kbroker.spark_jobs.avro_pageviews --bootstrap-servers HOST:PORT --topic T \\
        --schema-registry-url http://HOST:8081 --jars spark-avro_2.13-<spark version>.jar [--source kafka|python|auto]

`from_avro` lives in Spark's spark-avro module (org.apache.spark:spark-avro_2.13): give its jar with --jars.
The schema is the latest version of the subject `<topic>-value` (TopicNameStrategy, the serializers' default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from collections.abc import Sequence
from typing import Any


def fetch_schema(registry_url: str, subject: str) -> tuple[int, str]:
    """(id, schema text) of the subject's latest version."""
    with urllib.request.urlopen(
        f"{registry_url.rstrip('/')}/subjects/{subject}/versions/latest", timeout=30
    ) as r:
        body = json.loads(r.read())
    if body.get("schemaType", "AVRO") != "AVRO":
        raise ValueError(f"subject {subject} holds a {body['schemaType']} schema, not Avro")
    return int(body["id"]), str(body["schema"])


def page_counts(spark: Any, fmt: str, bootstrap: str, topic: str, schema: str) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    raw = (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    # Confluent's framing: byte 0 is the magic byte 0, bytes 1-4 the schema id; the Avro body follows.
    views = raw.select(from_avro(F.expr("substring(value, 6)"), schema).alias("v")).select("v.*")
    rows = views.groupBy("page").count().orderBy("page").collect()
    return [{"page": r["page"], "views": r["count"]} for r in rows]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kbroker.spark_jobs.avro_pageviews",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--schema-registry-url", required=True)
    ap.add_argument(
        "--jars", default="", help="spark-avro (and anything else) for spark.jars, comma-separated"
    )
    ap.add_argument("--source", default="auto", choices=("kafka", "python", "auto"))
    args = ap.parse_args(argv)
    try:
        schema_id, schema = fetch_schema(args.schema_registry_url, f"{args.topic}-value")
    except (OSError, ValueError, KeyError) as e:
        print(f"avro_pageviews: cannot fetch the schema of {args.topic}-value: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from kbroker.spark_jobs.pageviews import choose_format, python_worker_env
    from pyspark.sql import SparkSession

    os.environ.update(python_worker_env(os.environ, sys.executable))
    builder = SparkSession.builder.appName("kbroker-avro-pageviews").config("spark.ui.enabled", "false")
    if args.jars:
        builder = builder.config("spark.jars", args.jars)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        fmt = choose_format(spark, args.source)
        for row in page_counts(spark, fmt, args.bootstrap_servers, args.topic, schema):
            print(json.dumps({**row, "schema_id": schema_id}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

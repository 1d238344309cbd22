"""Spark reads Avro records written by confluent-kafka's AvroSerializer through kbroker's schema registry:
`from_avro` with the writer schema fetched from the registry (spark_jobs/avro_pageviews.py, run as a user would)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

from tests.schema_registry.registry_http import registry_broker  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {
    "type": "record",
    "name": "PageView",
    "namespace": "demo",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "ts", "type": "long"},
    ],
}


# The newest spark-avro the Maven repository reachable here serves; it decodes under pyspark 4.3 as well.
SPARK_AVRO = "org.apache.spark:spark-avro_2.13:4.2.0"


def _spark_avro_jar() -> Path:
    """Spark's spark-avro module (from_avro), fetched once into the project's Maven cache."""
    from bench.peers.maven import ArtifactUnavailable, jars

    try:
        folder = jars("spark-avro", [SPARK_AVRO], timeout=300)
    except ArtifactUnavailable as e:
        pytest.skip(f"{SPARK_AVRO} could not be fetched here: {e}")
    found = sorted(folder.glob("spark-avro_2.13-*.jar"))
    if not found:
        pytest.skip(f"{SPARK_AVRO}: no jar in {folder}")
    return found[0]


def test_from_avro_with_the_schema_from_the_registry(tmp_path: Path) -> None:
    jar = _spark_avro_jar()
    b, url = registry_broker(tmp_path / "broker")
    try:
        serialize = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(SCHEMA))
        p = Producer({"bootstrap.servers": b.bootstrap})
        pages = [f"/p{i % 3}" for i in range(30)]
        for i, page in enumerate(pages):
            p.produce(
                "views",
                value=serialize(
                    {"user": f"u{i}", "page": page, "ts": i},
                    SerializationContext("views", MessageField.VALUE),
                ),
            )
        assert p.flush(30) == 0
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "kbroker.spark_jobs.avro_pageviews",
                "--bootstrap-servers",
                b.bootstrap,
                "--topic",
                "views",
                "--schema-registry-url",
                url,
                "--jars",
                str(jar),
                "--source",
                "python",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-4000:]
        rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        expected = Counter(pages)
        assert [(row["page"], row["views"]) for row in rows] == sorted(expected.items())
        assert {row["schema_id"] for row in rows} == {1}
    finally:
        assert b.stop() == 0

"""The pytest plugin's `schema_registry_url` fixture in a user's project: a test that asks for it gets a broker
with the registry on, and confluent-kafka's Avro serializer works against it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.broker_process import ROOT

USER_TEST = """
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

SCHEMA = '{"type": "record", "name": "Ping", "fields": [{"name": "n", "type": "int"}]}'


def test_avro_with_the_registry(kafka_broker, kafka_topic, schema_registry_url):
    client = SchemaRegistryClient({"url": schema_registry_url})
    serialize = AvroSerializer(client, SCHEMA)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    p.produce(kafka_topic, value=serialize({"n": 1}, SerializationContext(kafka_topic, MessageField.VALUE)))
    assert p.flush(10) == 0
    assert client.get_subjects() == [kafka_topic + "-value"]
"""


def test_schema_registry_url_fixture(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "test_user.py").write_text(USER_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(PYTHONPATH=str(ROOT), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "kbroker_tools.pytest_plugin", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout

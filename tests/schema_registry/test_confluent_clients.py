"""confluent-kafka's SchemaRegistryClient and its Avro, JSON Schema and Protobuf serializers against kbroker's registry: records produced and
consumed through the broker, schema evolution accepted and refused per compatibility level, ids shared across
subjects, and the registry surviving kill -9."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

from tests.broker_process import BrokerProcess
from tests.schema_registry.registry_http import Http, registry_broker, wait_for_port

USER_V1 = {
    "type": "record",
    "name": "User",
    "namespace": "com.example",
    "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}],
}
USER_V2 = {
    **USER_V1,
    "fields": [*USER_V1["fields"], {"name": "email", "type": ["null", "string"], "default": None}],
}
USER_NO_DEFAULT = {**USER_V1, "fields": [*USER_V1["fields"], {"name": "city", "type": "string"}]}


def _avro(schema: dict) -> str:
    return json.dumps(schema)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    b, url = registry_broker(tmp_path_factory.mktemp("registry"))
    try:
        yield b, url
    finally:
        assert b.stop() == 0


def _consume(bootstrap: str, topic: str, n: int) -> list[bytes]:
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
    )
    c.subscribe([topic])
    out: list[bytes] = []
    try:
        for _ in range(600):
            if len(out) >= n:
                break
            m = c.poll(0.1)
            if m is not None and not m.error():
                out.append(m.value())
    finally:
        c.close()
    return out


def test_avro_records_round_trip_through_the_broker(broker: tuple[BrokerProcess, str]) -> None:
    b, url = broker
    client = SchemaRegistryClient({"url": url})
    topic = "users"
    ser_v1 = AvroSerializer(client, _avro(USER_V1))
    ser_v2 = AvroSerializer(client, _avro(USER_V2))
    p = Producer({"bootstrap.servers": b.bootstrap})
    sent = [({"name": f"u{i}", "age": i}, ser_v1) for i in range(5)]
    sent += [({"name": f"v{i}", "age": 50 + i, "email": f"v{i}@example.com"}, ser_v2) for i in range(5)]
    for record, ser in sent:
        p.produce(topic, value=ser(record, SerializationContext(topic, MessageField.VALUE)))
    assert p.flush(30) == 0

    # Both schemas were registered under the topic's value subject, as versions 1 and 2 with ids 1 and 2.
    assert client.get_versions("users-value") == [1, 2]
    latest = client.get_latest_version("users-value")
    assert latest.version == 2 and latest.schema.schema_type == "AVRO"

    # A deserializer without a schema of its own reads each record with the writer's schema fetched by id.
    plain = SchemaRegistryClient({"url": url})
    deserialize = AvroDeserializer(plain)
    values = [
        deserialize(v, SerializationContext(topic, MessageField.VALUE))
        for v in _consume(b.bootstrap, topic, 10)
    ]
    assert values[:5] == [{"name": f"u{i}", "age": i} for i in range(5)]
    assert values[5:] == [{"name": f"v{i}", "age": 50 + i, "email": f"v{i}@example.com"} for i in range(5)]

    # A reader schema: old records are resolved to v2 (email takes its default).
    as_v2 = AvroDeserializer(plain, _avro(USER_V2))
    upgraded = [
        as_v2(v, SerializationContext(topic, MessageField.VALUE)) for v in _consume(b.bootstrap, topic, 10)
    ]
    assert upgraded[0] == {"name": "u0", "age": 0, "email": None}


def test_incompatible_evolution_is_refused_by_level(broker: tuple[BrokerProcess, str]) -> None:
    _, url = broker
    client = SchemaRegistryClient({"url": url})
    subject = "evolve-value"
    first = client.register_schema(subject, Schema(_avro(USER_V1), "AVRO"))
    # Same schema again: the same id and no new version.
    assert client.register_schema(subject, Schema(_avro(USER_V1), "AVRO")) == first
    assert client.get_versions(subject) == [1]

    # BACKWARD (the default): a new field without a default cannot read old data.
    assert client.test_compatibility(subject, Schema(_avro(USER_NO_DEFAULT), "AVRO")) is False
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema(subject, Schema(_avro(USER_NO_DEFAULT), "AVRO"))
    assert e.value.http_status_code == 409 and e.value.error_code == 409
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in e.value.error_message

    # FORWARD: the old schema can read data with the extra field (it ignores it): accepted.
    client.set_compatibility(subject, "FORWARD")
    assert client.get_compatibility(subject) == "FORWARD"
    assert client.test_compatibility(subject, Schema(_avro(USER_NO_DEFAULT), "AVRO")) is True
    second = client.register_schema(subject, Schema(_avro(USER_NO_DEFAULT), "AVRO"))
    assert second != first and client.get_versions(subject) == [1, 2]

    # NONE: anything goes, even a type change.
    changed = {**USER_V1, "fields": [{"name": "name", "type": "long"}]}
    with pytest.raises(SchemaRegistryError):
        client.register_schema(subject, Schema(_avro(changed), "AVRO"))
    client.set_compatibility(subject, "NONE")
    client.register_schema(subject, Schema(_avro(changed), "AVRO"))
    assert client.get_versions(subject) == [1, 2, 3]


def test_identical_schemas_share_one_id_across_subjects(broker: tuple[BrokerProcess, str]) -> None:
    _, url = broker
    client = SchemaRegistryClient({"url": url})
    schema = Schema(
        _avro({"type": "record", "name": "Shared", "fields": [{"name": "x", "type": "long"}]}), "AVRO"
    )
    a = client.register_schema("shared-a", schema)
    b = client.register_schema("shared-b", schema)
    assert a == b
    versions = Http(url).ok("GET", f"/schemas/ids/{a}/versions")
    assert versions == [{"subject": "shared-a", "version": 1}, {"subject": "shared-b", "version": 1}]
    found = client.lookup_schema("shared-b", schema)
    assert (found.schema_id, found.version, found.subject) == (a, 1, "shared-b")


def test_the_registry_survives_kill_9(tmp_path: Path) -> None:
    b, url = registry_broker(tmp_path)
    try:
        client = SchemaRegistryClient({"url": url})
        ids = [
            client.register_schema(
                f"s{i}",
                Schema(
                    _avro({"type": "record", "name": f"R{i}", "fields": [{"name": "f", "type": "int"}]}),
                    "AVRO",
                ),
            )
            for i in range(5)
        ]
        client.set_compatibility("s0", "FULL")
        client.delete_subject("s4")
        b.kill()
        b.start()
        wait_for_port(int(url.rsplit(":", 1)[1]))
        again = SchemaRegistryClient({"url": url})  # no cache: every answer comes from the rebuilt state
        assert again.get_subjects() == ["s0", "s1", "s2", "s3"]
        assert [again.get_latest_version(f"s{i}").schema_id for i in range(4)] == ids[:4]
        assert again.get_compatibility("s0") == "FULL"
        assert Http(url).ok("GET", "/subjects?deleted=true") == ["s0", "s1", "s2", "s3", "s4"]
        # New ids continue after the recovered ones.
        new = again.register_schema(
            "s5",
            Schema(_avro({"type": "record", "name": "R5", "fields": [{"name": "f", "type": "int"}]}), "AVRO"),
        )
        assert new == max(ids) + 1
    finally:
        assert b.stop() == 0


def test_json_schema_records_round_trip(broker: tuple[BrokerProcess, str]) -> None:
    b, url = broker
    client = SchemaRegistryClient({"url": url})
    schema = json.dumps(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "title": "Order",
            "type": "object",
            "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
            "required": ["id"],
            "additionalProperties": False,
        }
    )
    serialize = JSONSerializer(schema, client)
    topic = "orders-json"
    p = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(5):
        p.produce(
            topic,
            value=serialize({"id": i, "item": f"thing {i}"}, SerializationContext(topic, MessageField.VALUE)),
        )
    assert p.flush(30) == 0
    # The serializer validates against the schema before anything reaches the broker.
    with pytest.raises(SerializationError):
        serialize({"id": "not a number"}, SerializationContext(topic, MessageField.VALUE))
    registered = client.get_latest_version(f"{topic}-value")
    assert registered.schema.schema_type == "JSON"
    deserialize = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": url}))
    values = [
        deserialize(v, SerializationContext(topic, MessageField.VALUE))
        for v in _consume(b.bootstrap, topic, 5)
    ]
    assert values == [{"id": i, "item": f"thing {i}"} for i in range(5)]
    # BACKWARD by the reference registry's JSON rules: an optional property added to a closed model is accepted;
    # one removed from a closed model is refused (old documents carry it, the new closed schema rejects them).
    evolved = json.loads(schema)
    evolved["properties"]["note"] = {"type": "string"}
    assert client.test_compatibility(f"{topic}-value", Schema(json.dumps(evolved), "JSON")) is True
    del evolved["properties"]["item"]
    assert client.test_compatibility(f"{topic}-value", Schema(json.dumps(evolved), "JSON")) is False


def _protobuf_class(tmp: Path):  # type: ignore[no-untyped-def]
    """A generated message class, as a user's build would make it (protoc from grpcio-tools)."""
    import importlib
    import sys

    from grpc_tools import protoc

    (tmp / "sensor.proto").write_text(
        'syntax = "proto3";\npackage demo;\nimport "google/protobuf/timestamp.proto";\n'
        "message Reading { string sensor = 1; double value = 2; "
        "google.protobuf.Timestamp at = 3; }\n"
    )
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    assert protoc.main(["protoc", f"-I{tmp}", f"-I{well_known}", f"--python_out={tmp}", "sensor.proto"]) == 0
    sys.path.insert(0, str(tmp))
    try:
        return importlib.import_module("sensor_pb2").Reading
    finally:
        sys.path.remove(str(tmp))


def test_protobuf_records_round_trip(broker: tuple[BrokerProcess, str], tmp_path: Path) -> None:
    b, url = broker
    reading = _protobuf_class(tmp_path)
    client = SchemaRegistryClient({"url": url})
    serialize = ProtobufSerializer(reading, client, {"use.deprecated.format": False})
    topic = "readings"
    p = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(5):
        msg = reading(sensor=f"s{i}", value=i / 2)
        msg.at.seconds = 1_700_000_000 + i
        p.produce(topic, value=serialize(msg, SerializationContext(topic, MessageField.VALUE)))
    assert p.flush(30) == 0
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "PROTOBUF"
    deserialize = ProtobufDeserializer(
        reading, {"use.deprecated.format": False}, schema_registry_client=SchemaRegistryClient({"url": url})
    )
    got = [
        deserialize(v, SerializationContext(topic, MessageField.VALUE))
        for v in _consume(b.bootstrap, topic, 5)
    ]
    assert [(m.sensor, m.value, m.at.seconds) for m in got] == [
        (f"s{i}", i / 2, 1_700_000_000 + i) for i in range(5)
    ]
    # .proto text over plain HTTP: the same registry compiles it; a field's scalar group change is refused.
    http = Http(url)
    text = 'syntax = "proto3";\npackage demo;\nmessage Reading { string sensor = 1; float value = 2; }\n'
    status, code, _ = http.error(
        "POST", f"/subjects/{topic}-value/versions", {"schemaType": "PROTOBUF", "schema": text}
    )
    assert (status, code) == (409, 409)

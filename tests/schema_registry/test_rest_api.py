"""The REST API as Confluent's API reference documents it, spoken over plain HTTP: status codes, error_code and
message bodies, content types, soft and permanent deletes, references, config and mode."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.broker_process import BrokerProcess
from tests.schema_registry.registry_http import CONTENT_TYPE, Http, registry_broker


def avro(name: str, *fields: tuple[str, object], **extra: object) -> dict[str, str]:
    return {
        "schema": json.dumps(
            {"type": "record", "name": name, "fields": [{"name": f, "type": t, **extra} for f, t in fields]}
        )
    }


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Http]:
    b: BrokerProcess
    b, url = registry_broker(tmp_path_factory.mktemp("rest"))
    try:
        yield Http(url)
    finally:
        assert b.stop() == 0


def test_reads_of_what_does_not_exist(http: Http) -> None:
    assert http.ok("GET", "/") == {}
    assert http.ok("GET", "/schemas/types") == ["JSON", "PROTOBUF", "AVRO"]
    assert http.error("GET", "/subjects/nope/versions") == (404, 40401, "Subject 'nope' not found.")
    assert http.error("GET", "/subjects/nope/versions/1") == (404, 40401, "Subject 'nope' not found.")
    assert http.error("GET", "/schemas/ids/999") == (404, 40403, "Schema not found")
    assert http.error("POST", "/subjects/nope", avro("R", ("a", "int"))) == (
        404,
        40401,
        "Subject 'nope' not found.",
    )
    assert http.error("GET", "/config/nope")[:2] == (404, 40408)
    assert http.ok("GET", "/config/nope?defaultToGlobal=true") == {"compatibilityLevel": "BACKWARD"}
    assert http.error("GET", "/no/such/route")[:2] == (404, 404)
    assert http.error("PUT", "/subjects")[:2] == (405, 405)


def test_register_read_and_look_up(http: Http) -> None:
    body = avro("Reading", ("a", "int"))
    schema_id = http.ok("POST", "/subjects/reading/versions", body)["id"]
    assert http.ok("POST", "/subjects/reading/versions", body) == {"id": schema_id}
    assert http.ok("GET", "/subjects/reading/versions") == [1]
    expected = {
        "subject": "reading",
        "version": 1,
        "id": schema_id,
        "schema": '{"type":"record","name":"Reading","fields":[{"type":"int","name":"a"}]}',
    }
    assert http.ok("GET", "/subjects/reading/versions/1") == expected
    assert http.ok("GET", "/subjects/reading/versions/latest") == expected
    assert http.ok("GET", "/subjects/reading/versions/-1") == expected
    assert http.ok("GET", "/subjects/reading/versions/1/schema") == json.loads(expected["schema"])
    assert http.ok("GET", f"/schemas/ids/{schema_id}") == {"schema": expected["schema"]}
    assert http.ok("GET", f"/schemas/ids/{schema_id}/subjects") == ["reading"]
    assert http.ok("POST", "/subjects/reading", body) == expected
    assert http.error("POST", "/subjects/reading", avro("Other", ("a", "int"))) == (
        404,
        40403,
        "Schema not found",
    )
    assert http.error("GET", "/subjects/reading/versions/2") == (404, 40402, "Version 2 not found.")
    for bad in ("0", "abc", "2147483648"):
        status, code, message = http.error("GET", f"/subjects/reading/versions/{bad}")
        assert (status, code) == (422, 42202) and f"'{bad}'" in message
    # Whitespace and key order do not make a different schema: the text is parsed, and the canonical form compared.
    spaced = {"schema": json.dumps(json.loads(body["schema"]), indent=4)}
    assert http.ok("POST", "/subjects/reading/versions", spaced) == {"id": schema_id}
    assert "reading" in http.ok("GET", "/subjects")


def test_invalid_schemas_and_bodies(http: Http) -> None:
    status, code, _ = http.error(
        "POST", "/subjects/bad/versions", {"schema": '{"type": "record", "name": "x"}'}
    )
    assert (status, code) == (422, 42201)
    assert http.error("POST", "/subjects/bad/versions", {"schema": "not json"})[:2] == (422, 42201)
    assert http.error("POST", "/subjects/bad/versions", {"schema": '"nosuchtype"'})[:2] == (422, 42201)
    assert http.error("POST", "/subjects/bad/versions", {"schema": '"int"', "schemaType": "XML"})[:2] == (
        422,
        42201,
    )
    status, _, payload = http.call("POST", "/subjects/bad/versions", raw=b"{not json")
    assert status == 400 and payload["error_code"] == 400
    status, _, payload = http.call(
        "POST", "/subjects/bad/versions", {"schema": '"int"'}, content_type="text/plain"
    )
    assert status == 415 and payload == {"error_code": 415, "message": "HTTP 415 Unsupported Media Type"}
    # application/json is accepted as well as the registry's own type.
    status, content_type, _ = http.call(
        "POST", "/subjects/plain/versions", {"schema": '"string"'}, content_type="application/json"
    )
    assert status == 200 and content_type == CONTENT_TYPE
    assert http.error("GET", "/subjects/bad/versions")[:2] == (404, 40401)  # nothing was registered


def test_compatibility_levels_and_checks(http: Http) -> None:
    assert http.ok("GET", "/config") == {"compatibilityLevel": "BACKWARD"}
    assert http.error("PUT", "/config/compat", {"compatibility": "SIDEWAYS"})[:2] == (422, 42203)
    v1 = avro("C", ("a", "int"))
    http.ok("POST", "/subjects/compat/versions", v1)
    added_required = avro("C", ("a", "int"), ("b", "string"))
    assert http.ok("POST", "/compatibility/subjects/compat/versions/latest", added_required) == {
        "is_compatible": False
    }
    verbose = http.ok("POST", "/compatibility/subjects/compat/versions/1?verbose=true", added_required)
    assert verbose["is_compatible"] is False and any(
        "READER_FIELD_MISSING_DEFAULT_VALUE" in m for m in verbose["messages"]
    )
    status, code, message = http.error("POST", "/subjects/compat/versions", added_required)
    assert (status, code) == (409, 409) and message.startswith(
        'Schema being registered is incompatible with an earlier schema for subject "compat"'
    )
    assert http.error("POST", "/compatibility/subjects/compat/versions/7", added_required)[:2] == (404, 40402)
    # A subject without versions: anything is compatible with nothing.
    assert http.ok("POST", "/compatibility/subjects/empty/versions/latest", v1) == {"is_compatible": True}

    assert http.ok("PUT", "/config/compat", {"compatibility": "FORWARD_TRANSITIVE"}) == {
        "compatibility": "FORWARD_TRANSITIVE"
    }
    assert http.ok("GET", "/config/compat") == {"compatibilityLevel": "FORWARD_TRANSITIVE"}
    assert http.ok("POST", "/subjects/compat/versions", added_required)["id"] > 0
    # Transitive: v3 drops `a` without a default in v1 and v2's readers... both old readers need `a`: refused.
    dropped = avro("C", ("b", "string"))
    assert http.error("POST", "/subjects/compat/versions", dropped)[:2] == (409, 409)
    assert http.ok("DELETE", "/config/compat") == {"compatibilityLevel": "FORWARD_TRANSITIVE"}
    assert http.ok("GET", "/config/compat?defaultToGlobal=true") == {"compatibilityLevel": "BACKWARD"}
    assert http.ok("PUT", "/config", {"compatibility": "NONE"}) == {"compatibility": "NONE"}
    assert http.ok("POST", "/subjects/compat/versions", dropped)["id"] > 0
    assert http.ok("PUT", "/config", {"compatibility": "BACKWARD"}) == {"compatibility": "BACKWARD"}


def test_soft_and_permanent_deletes(http: Http) -> None:
    ids = [
        http.ok(
            "POST",
            "/subjects/del/versions",
            avro("D", ("a", "int"), *[(f"f{i}", "int")] if i else [], default=0),
        )["id"]
        for i in range(3)
    ]
    assert http.ok("GET", "/subjects/del/versions") == [1, 2, 3]
    assert http.error("DELETE", "/subjects/del/versions/2?permanent=true") == (
        404,
        40407,
        "Subject 'del' Version 2 was not deleted first before being permanently deleted",
    )
    assert http.ok("DELETE", "/subjects/del/versions/2") == 2
    assert http.error("DELETE", "/subjects/del/versions/2")[:2] == (404, 40406)
    assert http.ok("GET", "/subjects/del/versions") == [1, 3]
    assert http.ok("GET", "/subjects/del/versions?deleted=true") == [1, 2, 3]
    assert http.error("GET", "/subjects/del/versions/2") == (404, 40402, "Version 2 not found.")
    assert http.ok("GET", "/subjects/del/versions/2?deleted=true")["id"] == ids[1]
    assert http.ok("DELETE", "/subjects/del/versions/2?permanent=true") == 2
    assert http.ok("GET", "/subjects/del/versions?deleted=true") == [1, 3]

    assert http.error("DELETE", "/subjects/del?permanent=true")[:2] == (404, 40405)
    assert http.ok("DELETE", "/subjects/del") == [1, 3]
    assert http.error("DELETE", "/subjects/del") == (
        404,
        40404,
        "Subject 'del' was soft deleted.Set permanent=true to delete permanently",
    )
    assert "del" not in http.ok("GET", "/subjects") and "del" in http.ok("GET", "/subjects?deleted=true")
    assert http.error("GET", "/subjects/del/versions")[:2] == (404, 40401)
    # A soft-deleted schema keeps its id; registering it again makes a new version with that id.
    assert http.ok("GET", f"/schemas/ids/{ids[0]}")["schema"]
    assert http.ok("POST", "/subjects/del/versions", avro("D", ("a", "int"), default=0)) == {"id": ids[0]}
    assert http.ok("GET", "/subjects/del/versions") == [4]
    assert http.ok("DELETE", "/subjects/del") == [4]
    assert http.ok("DELETE", "/subjects/del?permanent=true") == [1, 3, 4]
    assert http.error("GET", f"/schemas/ids/{ids[2]}")[:2] == (404, 40403)
    assert http.error("DELETE", "/subjects/del")[:2] == (404, 40401)


def test_references(http: Http) -> None:
    address = {
        "type": "record",
        "name": "Address",
        "namespace": "com.acme",
        "fields": [{"name": "street", "type": "string"}],
    }
    address_id = http.ok("POST", "/subjects/address/versions", {"schema": json.dumps(address)})["id"]
    person = {
        "type": "record",
        "name": "Person",
        "namespace": "com.acme",
        "fields": [{"name": "home", "type": "com.acme.Address"}],
    }
    refs = [{"name": "com.acme.Address", "subject": "address", "version": 1}]
    assert http.error("POST", "/subjects/person/versions", {"schema": json.dumps(person)})[:2] == (422, 42201)
    person_id = http.ok(
        "POST", "/subjects/person/versions", {"schema": json.dumps(person), "references": refs}
    )["id"]
    got = http.ok("GET", f"/schemas/ids/{person_id}")
    assert got["references"] == refs and "com.acme.Address" in got["schema"] and "street" not in got["schema"]
    assert http.ok("GET", "/subjects/address/versions/1/referencedby") == [person_id]
    status, code, message = http.error("DELETE", "/subjects/address/versions/1")
    assert (status, code) == (422, 42206) and "subject=address,version=1" in message
    missing = [{"name": "com.acme.Address", "subject": "address", "version": 9}]
    assert http.error("POST", "/subjects/p2/versions", {"schema": json.dumps(person), "references": missing})[
        :2
    ] == (422, 42201)
    assert address_id != person_id


def test_modes(http: Http) -> None:
    assert http.ok("GET", "/mode") == {"mode": "READWRITE"}
    assert http.error("PUT", "/mode/ro", {"mode": "SOMETIMES"})[:2] == (422, 42204)
    http.ok("POST", "/subjects/ro/versions", {"schema": '"int"'})
    assert http.ok("PUT", "/mode/ro", {"mode": "READONLY"}) == {"mode": "READONLY"}
    assert http.ok("GET", "/mode/ro") == {"mode": "READONLY"}
    assert http.error("POST", "/subjects/ro/versions", {"schema": '"long"'}) == (
        422,
        42205,
        "Subject ro is in read-only mode",
    )
    assert http.error("DELETE", "/subjects/ro")[:2] == (422, 42205)
    assert http.ok("DELETE", "/mode/ro") == {"mode": "READONLY"}
    assert http.error("GET", "/mode/ro")[:2] == (404, 40409)
    # IMPORT keeps the ids and versions a migration brings along; it needs an empty subject (or force).
    assert http.error("PUT", "/mode/ro", {"mode": "IMPORT"})[:2] == (422, 42205)
    assert http.ok("PUT", "/mode/imported", {"mode": "IMPORT"}) == {"mode": "IMPORT"}
    assert http.ok("POST", "/subjects/imported/versions", {"schema": '"bytes"', "id": 500, "version": 7}) == {
        "id": 500
    }
    assert http.ok("GET", "/subjects/imported/versions/7")["id"] == 500
    assert http.error("POST", "/subjects/ro/versions", {"schema": '"float"', "id": 501})[:2] == (422, 42205)
    http.ok("DELETE", "/mode/imported")
    # New ids continue after the imported one.
    assert http.ok("POST", "/subjects/after-import/versions", {"schema": '"double"'}) == {"id": 501}


def test_a_schemas_topic_written_by_another_registry_is_read_as_is(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Records in the reference registry's key/value format (as its KafkaStore writes them), produced by a plain
    Kafka client before the registry starts: ids, versions, deletes, configs and modes come back as written."""
    from confluent_kafka import Producer

    from tests.broker_process import free_port
    from tests.schema_registry.registry_http import wait_for_port

    port = free_port()
    b = BrokerProcess(tmp_path, {"schema.registry.listeners": f"http://127.0.0.1:{port}"})
    # The registry creates _schemas when it first starts: written first by a plain client, the topic is the other
    # registry's, and this one must take it as it is.
    plain = BrokerProcess(tmp_path, port=b.port).start()
    records = [
        (
            {"keytype": "SCHEMA", "subject": "legacy", "version": 1, "magic": 1},
            {"subject": "legacy", "version": 1, "id": 21, "schema": '"string"', "deleted": False},
        ),
        (
            {"keytype": "SCHEMA", "subject": "legacy", "version": 2, "magic": 1},
            {"subject": "legacy", "version": 2, "id": 22, "schema": '"bytes"', "deleted": False},
        ),
        (
            {"keytype": "SCHEMA", "subject": "legacy-json", "version": 1, "magic": 1},
            {
                "subject": "legacy-json",
                "version": 1,
                "id": 23,
                "schemaType": "JSON",
                "schema": '{"type":"object"}',
                "deleted": False,
            },
        ),
        (
            {"keytype": "SCHEMA", "subject": "gone", "version": 1, "magic": 1},
            {"subject": "gone", "version": 1, "id": 24, "schema": '"int"', "deleted": False},
        ),
        ({"keytype": "DELETE_SUBJECT", "subject": "gone", "magic": 0}, {"subject": "gone", "version": 1}),
        ({"keytype": "CONFIG", "subject": None, "magic": 0}, {"compatibilityLevel": "FULL"}),
        ({"keytype": "CONFIG", "subject": "legacy", "magic": 0}, {"compatibilityLevel": "NONE"}),
        ({"keytype": "MODE", "subject": "legacy-json", "magic": 0}, {"mode": "READONLY"}),
        ({"keytype": "NOOP", "magic": 0}, None),
    ]
    p = Producer({"bootstrap.servers": plain.bootstrap})
    for key, value in records:
        p.produce(
            "_schemas",
            key=json.dumps(key).encode(),
            value=None if value is None else json.dumps(value).encode(),
        )
    assert p.flush(30) == 0
    assert plain.stop() == 0
    b.start()
    wait_for_port(port)
    try:
        http = Http(f"http://127.0.0.1:{port}")
        assert http.ok("GET", "/subjects") == ["legacy", "legacy-json"]
        assert http.ok("GET", "/subjects/legacy/versions/2") == {
            "subject": "legacy",
            "version": 2,
            "id": 22,
            "schema": '"bytes"',
        }
        assert http.ok("GET", "/schemas/ids/23") == {"schemaType": "JSON", "schema": '{"type":"object"}'}
        assert http.ok("GET", "/subjects/gone/versions?deleted=true") == [1]
        assert http.ok("GET", "/config") == {"compatibilityLevel": "FULL"}
        assert http.ok("GET", "/config/legacy") == {"compatibilityLevel": "NONE"}
        assert http.ok("GET", "/mode/legacy-json") == {"mode": "READONLY"}
        # New ids continue after the other registry's.
        assert http.ok("POST", "/subjects/new/versions", {"schema": '"long"'}) == {"id": 25}
    finally:
        assert b.stop() == 0


def test_normalize_finds_another_spelling(http: Http) -> None:
    # JSON Schema keeps the key order it was given; normalize=true compares normalized forms on both sides.
    first = {
        "schemaType": "JSON",
        "schema": json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}),
    }
    reordered = {
        "schemaType": "JSON",
        "schema": json.dumps({"properties": {"a": {"type": "integer"}}, "type": "object"}),
    }
    schema_id = http.ok("POST", "/subjects/norm/versions", first)["id"]
    assert http.error("POST", "/subjects/norm", reordered)[:2] == (404, 40403)
    assert http.ok("POST", "/subjects/norm?normalize=true", reordered)["id"] == schema_id
    assert http.ok("POST", "/subjects/norm/versions?normalize=true", reordered)["id"] == schema_id
    assert http.ok("GET", "/subjects/norm/versions") == [1]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/subjects/m/versions", []),
        ("POST", "/subjects/m/versions", "text"),
        ("POST", "/subjects/m/versions", {"schema": 5}),
        ("POST", "/subjects/m/versions", {"schema": '"int"', "references": 5}),
        ("POST", "/subjects/m/versions", {"schema": '"int"', "references": [{"name": 1}]}),
        ("POST", "/subjects/m/versions", {"schema": '"int"', "schemaType": 5}),
        ("POST", "/subjects/m/versions", {"schema": '{"type": "record", "name": "x", "fields": 7}'}),
        ("POST", "/subjects/m/versions", {"schema": "[]", "schemaType": "JSON"}),
        ("POST", "/subjects/m/versions", {"schema": "syntax = nonsense", "schemaType": "PROTOBUF"}),
        ("POST", "/compatibility/subjects/m/versions/x", {"schema": '"int"'}),
        ("PUT", "/config", []),
        ("PUT", "/config", {"compatibility": 3}),
        ("PUT", "/mode", {"mode": None}),
        ("GET", "/schemas/ids/abc", None),
        ("DELETE", "/subjects/m/versions/0", None),
    ],
)
def test_malformed_requests_get_a_client_error(http: Http, method: str, path: str, body: object) -> None:
    status, code, message = http.error(method, path, body)
    assert 400 <= status < 500 and code >= 400 and message, (status, code, message)

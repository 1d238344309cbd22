"""JSON Schema compatibility by the reference registry's rules (JsonSchemaDiff): one case per rule, both directions.
BACKWARD: the new schema accepts every document the old one did; FORWARD: the old accepts every new document."""

from __future__ import annotations

import json

import pytest
from kbroker.schema_registry.compatibility import check
from kbroker.schema_registry.errors import RegistryError
from kbroker.schema_registry.formats import parse


def obj(properties: dict, required: list[str] | None = None, closed: bool = False, **extra: object) -> dict:
    out: dict = {"type": "object", "properties": properties, **extra}
    if required:
        out["required"] = required
    if closed:
        out["additionalProperties"] = False
    return out


STR, INT, NUM = {"type": "string"}, {"type": "integer"}, {"type": "number"}

# (rule, old, new, compatible BACKWARD, compatible FORWARD)
CASES = [
    ("identical", obj({"a": STR}), obj({"a": STR}), True, True),
    (
        "add an optional property to a closed model",
        obj({"a": STR}, closed=True),
        obj({"a": STR, "b": INT}, closed=True),
        True,
        False,
    ),
    ("add a property to an open model", obj({"a": STR}), obj({"a": STR, "b": INT}), False, True),
    (
        "add a required property",
        obj({"a": STR}, closed=True),
        obj({"a": STR, "b": INT}, ["b"], closed=True),
        False,
        False,
    ),
    ("make a property required", obj({"a": STR}), obj({"a": STR}, ["a"]), False, True),
    ("widen integer to number", obj({"a": INT}), obj({"a": NUM}), True, False),
    ("change a property's type", obj({"a": STR}), obj({"a": INT}), False, False),
    ("close an open model", obj({"a": STR}), obj({"a": STR}, closed=True), False, True),
    ("add maxLength", obj({"a": STR}), obj({"a": {"type": "string", "maxLength": 5}}), False, True),
    (
        "increase maximum",
        obj({"a": {"type": "integer", "maximum": 5}}),
        obj({"a": {"type": "integer", "maximum": 9}}),
        True,
        False,
    ),
    (
        "raise minimum",
        obj({"a": {"type": "integer", "minimum": 0}}),
        obj({"a": {"type": "integer", "minimum": 1}}),
        False,
        True,
    ),
    ("extend an enum", obj({"c": {"enum": ["R", "G"]}}), obj({"c": {"enum": ["R", "G", "B"]}}), True, False),
    ("add a pattern", obj({"a": STR}), obj({"a": {"type": "string", "pattern": "^x"}}), False, True),
    ("add a oneOf branch", {"oneOf": [STR, INT]}, {"oneOf": [STR, INT, {"type": "boolean"}]}, True, False),
    ("change array items", {"type": "array", "items": INT}, {"type": "array", "items": STR}, False, False),
    ("widen array items", {"type": "array", "items": INT}, {"type": "array", "items": NUM}, True, False),
]


def _parsed(schema: dict):  # type: ignore[no-untyped-def]
    return parse("JSON", json.dumps(schema), [])


@pytest.mark.parametrize(("rule", "old", "new", "backward", "forward"), CASES, ids=[c[0] for c in CASES])
def test_rule(rule: str, old: dict, new: dict, backward: bool, forward: bool) -> None:
    previous = [(1, _parsed(old))]
    assert (not check("BACKWARD", _parsed(new), previous)) is backward
    assert (not check("FORWARD", _parsed(new), previous)) is forward
    assert (not check("FULL", _parsed(new), previous)) is (backward and forward)


def test_refs_are_followed() -> None:
    old = {"$defs": {"n": INT}, "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}}
    new = {"$defs": {"n": NUM}, "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}}
    assert not check("BACKWARD", _parsed(new), [(1, _parsed(old))])
    assert check("FORWARD", _parsed(new), [(1, _parsed(old))])


def test_meta_schema_violations_are_invalid() -> None:
    with pytest.raises(RegistryError) as e:
        _parsed({"type": "object", "properties": {"a": {"type": "nosuchtype"}}})
    assert e.value.error_code == 42201

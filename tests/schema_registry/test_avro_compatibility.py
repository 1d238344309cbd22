"""Avro compatibility as the reference registry documents it: one case per rule, in both directions (BACKWARD:
the new schema reads old data; FORWARD: old readers read new data; FULL: both)."""

from __future__ import annotations

import json

import pytest
from kbroker.schema_registry.compatibility import check
from kbroker.schema_registry.formats import parse


def record(*fields: dict, name: str = "R", **extra: object) -> dict:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def field(name: str, type_: object, **extra: object) -> dict:
    return {"name": name, "type": type_, **extra}


A = field("a", "int")
B_REQUIRED = field("b", "string")
B_OPTIONAL = field("b", ["null", "string"], default=None)
COLOR = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}
COLOR_MORE = {**COLOR, "symbols": ["RED", "GREEN", "BLUE"]}

# (rule, old, new, compatible BACKWARD, compatible FORWARD)
CASES = [
    ("add a field with a default", record(A), record(A, B_OPTIONAL), True, True),
    ("add a field without a default", record(A), record(A, B_REQUIRED), False, True),
    ("delete a field with a default", record(A, B_OPTIONAL), record(A), True, True),
    ("delete a field without a default", record(A, B_REQUIRED), record(A), True, False),
    ("promote int to long", record(field("a", "int")), record(field("a", "long")), True, False),
    ("promote float to double", record(field("a", "float")), record(field("a", "double")), True, False),
    ("promote string to bytes", record(field("a", "string")), record(field("a", "bytes")), True, True),
    (
        "change a type with no promotion",
        record(field("a", "int")),
        record(field("a", "string")),
        False,
        False,
    ),
    ("add an enum symbol", record(field("c", COLOR)), record(field("c", COLOR_MORE)), True, False),
    ("remove an enum symbol", record(field("c", COLOR_MORE)), record(field("c", COLOR)), False, True),
    (
        "add a union branch",
        record(field("u", ["null", "int"])),
        record(field("u", ["null", "int", "string"])),
        True,
        False,
    ),
    ("rename the record", record(A, name="R"), record(A, name="S"), False, False),
    ("rename the record with an alias", record(A, name="R"), record(A, name="S", aliases=["R"]), True, False),
    (
        "resize a fixed",
        record(field("f", {"type": "fixed", "name": "F", "size": 4})),
        record(field("f", {"type": "fixed", "name": "F", "size": 8})),
        False,
        False,
    ),
    (
        "widen an array's items",
        record(field("xs", {"type": "array", "items": "int"})),
        record(field("xs", {"type": "array", "items": "long"})),
        True,
        False,
    ),
    (
        "change a map's values",
        record(field("m", {"type": "map", "values": "int"})),
        record(field("m", {"type": "map", "values": "boolean"})),
        False,
        False,
    ),
]


def _parsed(schema: dict):  # type: ignore[no-untyped-def]
    return parse("AVRO", json.dumps(schema), [])


@pytest.mark.parametrize(("rule", "old", "new", "backward", "forward"), CASES, ids=[c[0] for c in CASES])
def test_rule(rule: str, old: dict, new: dict, backward: bool, forward: bool) -> None:
    previous = [(1, _parsed(old))]
    assert (not check("BACKWARD", _parsed(new), previous)) is backward
    assert (not check("FORWARD", _parsed(new), previous)) is forward
    assert (not check("FULL", _parsed(new), previous)) is (backward and forward)
    assert not check("NONE", _parsed(new), previous)


def test_transitive_levels_compare_with_every_version() -> None:
    # FORWARD: v1 has `b` without a default, v2 gives it one, v3 drops it. Each step is compatible with the one
    # before; v1's readers cannot read v3's data, which only the transitive level checks.
    v1, v2, v3 = record(A, B_REQUIRED), record(A, B_OPTIONAL), record(A)
    history = [(1, _parsed(v1)), (2, _parsed(v2))]
    assert not check("FORWARD", _parsed(v3), history)  # v2 reads v3's data: b takes its default
    problems = check("FORWARD_TRANSITIVE", _parsed(v3), history)  # v1 cannot: b has no default
    assert problems and "{oldSchemaVersion: 1}" in problems
    assert not check("FORWARD_TRANSITIVE", _parsed(v3), history[1:])

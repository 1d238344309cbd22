"""Protobuf compatibility by the reference registry's SchemaDiff rules: one case per rule, both directions."""

from __future__ import annotations

import pytest
from kbroker.schema_registry.compatibility import check
from kbroker.schema_registry.errors import RegistryError
from kbroker.schema_registry.formats import parse


def proto(body: str, package: str = "acme", syntax: str = "proto3") -> str:
    return f'syntax = "{syntax}";\npackage {package};\n{body}\n'


BASE = proto("message M { int32 a = 1; string s = 2; }")

# (rule, old, new, compatible BACKWARD, compatible FORWARD)
CASES = [
    ("add a field", BASE, proto("message M { int32 a = 1; string s = 2; double d = 3; }"), True, True),
    ("remove a field", BASE, proto("message M { int32 a = 1; }"), True, True),
    ("rename a field", BASE, proto("message M { int32 b = 1; string s = 2; }"), True, True),
    ("int32 to int64 (same wire group)", BASE, proto("message M { int64 a = 1; string s = 2; }"), True, True),
    ("string to bytes", BASE, proto("message M { int32 a = 1; bytes s = 2; }"), True, True),
    ("int32 to sint32 (other group)", BASE, proto("message M { sint32 a = 1; string s = 2; }"), False, False),
    ("scalar to message", BASE, proto("message N {}\nmessage M { N a = 1; string s = 2; }"), False, False),
    (
        "change the package",
        BASE,
        proto("message M { int32 a = 1; string s = 2; }", package="other"),
        False,
        False,
    ),
    (
        "remove a message",
        proto("message M { int32 a = 1; }\nmessage N { int32 b = 1; }"),
        proto("message M { int32 a = 1; }"),
        False,
        True,
    ),
    (
        "numeric field made repeated",
        BASE,
        proto("message M { repeated int32 a = 1; string s = 2; }"),
        False,
        False,
    ),
    (
        "string field made repeated",
        BASE,
        proto("message M { int32 a = 1; repeated string s = 2; }"),
        True,
        True,
    ),
    (
        "add a required field (proto2)",
        proto("message M { optional int32 a = 1; }", syntax="proto2"),
        proto("message M { optional int32 a = 1; required int32 b = 2; }", syntax="proto2"),
        False,
        True,
    ),
    (
        "move one field into a new oneof",
        BASE,
        proto("message M { oneof o { int32 a = 1; } string s = 2; }"),
        True,
        True,
    ),
    (
        "move two fields into a new oneof",
        BASE,
        proto("message M { oneof o { int32 a = 1; string s = 2; } }"),
        False,
        True,
    ),
    (
        "change a nested message's field kind",
        proto("message N { int32 x = 1; }\nmessage M { N n = 1; }"),
        proto("message N { string x = 1; }\nmessage M { N n = 1; }"),
        False,
        False,
    ),
    (
        "change the message type of a field",
        proto("message N {}\nmessage O {}\nmessage M { N n = 1; }"),
        proto("message N {}\nmessage O {}\nmessage M { O n = 1; }"),
        False,
        False,
    ),
]


@pytest.mark.parametrize(("rule", "old", "new", "backward", "forward"), CASES, ids=[c[0] for c in CASES])
def test_rule(rule: str, old: str, new: str, backward: bool, forward: bool) -> None:
    previous = [(1, parse("PROTOBUF", old, []))]
    latest = parse("PROTOBUF", new, [])
    assert (not check("BACKWARD", latest, previous)) is backward
    assert (not check("FORWARD", latest, previous)) is forward


def test_references_and_invalid_text() -> None:
    dep = proto("message Address { string street = 1; }", package="geo")
    person = 'syntax = "proto3";\nimport "geo/address.proto";\nmessage P { geo.Address home = 1; }\n'
    parsed = parse("PROTOBUF", person, [("geo/address.proto", "PROTOBUF", dep)])
    assert list(parsed.descriptor.dependency) == ["geo/address.proto"]
    # Text and its base64 FileDescriptorProto are one schema.
    assert (
        parse("PROTOBUF", parsed.canonical(), [("geo/address.proto", "PROTOBUF", dep)]).canonical()
        == parsed.canonical()
    )
    with pytest.raises(RegistryError) as e:
        parse("PROTOBUF", person, [])
    assert e.value.error_code == 42201 and "geo/address.proto" in e.value.message

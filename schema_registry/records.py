"""The `_schemas` topic's keys and values in the reference registry's JSON format (so a topic written by another
registry is read as is): SCHEMA, CONFIG, MODE, DELETE_SUBJECT, CLEAR_SUBJECT and NOOP keys."""

from __future__ import annotations

import json
from typing import Any

SCHEMA, CONFIG, MODE, DELETE_SUBJECT, CLEAR_SUBJECT, NOOP = (
    "SCHEMA",
    "CONFIG",
    "MODE",
    "DELETE_SUBJECT",
    "CLEAR_SUBJECT",
    "NOOP",
)


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def schema_key(subject: str, version: int) -> bytes:
    return _dump({"keytype": SCHEMA, "subject": subject, "version": version, "magic": 1})


def schema_value(
    subject: str,
    version: int,
    schema_id: int,
    schema_type: str,
    references: list[dict[str, Any]],
    schema: str,
    deleted: bool,
) -> bytes:
    value: dict[str, Any] = {"subject": subject, "version": version, "id": schema_id}
    if schema_type != "AVRO":
        value["schemaType"] = schema_type
    if references:
        value["references"] = references
    value["schema"] = schema
    value["deleted"] = deleted
    return _dump(value)


def config_key(subject: str | None) -> bytes:
    return _dump({"keytype": CONFIG, "subject": subject, "magic": 0})


def config_value(level: str) -> bytes:
    return _dump({"compatibilityLevel": level})


def mode_key(subject: str | None) -> bytes:
    return _dump({"keytype": MODE, "subject": subject, "magic": 0})


def mode_value(mode: str) -> bytes:
    return _dump({"mode": mode})


def delete_subject_key(subject: str) -> bytes:
    return _dump({"keytype": DELETE_SUBJECT, "subject": subject, "magic": 0})


def delete_subject_value(subject: str, version: int) -> bytes:
    return _dump({"subject": subject, "version": version})


def decode(data: bytes | None) -> dict[str, Any] | None:
    """A key or value as a dict; None for a tombstone, and for bytes that are not a JSON object (skipped, as the
    reference registry skips records it cannot deserialize)."""
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None

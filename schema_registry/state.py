"""The registry's state as the `_schemas` topic builds it: subjects and their versions, schemas by id, compatibility
levels and modes. Changed only by apply(), record by record in topic order (the store's reader thread), read by the
HTTP threads under the same lock."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from kbroker.schema_registry import records

DEFAULT_COMPATIBILITY, DEFAULT_MODE = "BACKWARD", "READWRITE"


@dataclass
class SchemaVersion:
    subject: str
    version: int
    id: int
    schema_type: str
    references: list[dict[str, Any]]
    schema: str
    deleted: bool

    def identity(self) -> tuple[str, str, str]:
        """Same identity, same id: the type, the canonical text and the references."""
        return schema_identity(self.schema_type, self.schema, self.references)


def schema_identity(schema_type: str, schema: str, references: list[dict[str, Any]]) -> tuple[str, str, str]:
    return schema_type, schema, json.dumps(references, sort_keys=True)


@dataclass
class RegistryState:
    lock: threading.RLock = field(default_factory=threading.RLock)
    subjects: dict[str, dict[int, SchemaVersion]] = field(default_factory=dict)
    by_id: dict[int, dict[tuple[str, int], SchemaVersion]] = field(default_factory=dict)
    ids: dict[tuple[str, str, str], int] = field(default_factory=dict)
    max_id: int = 0
    configs: dict[str | None, str] = field(default_factory=dict)
    modes: dict[str | None, str] = field(default_factory=dict)

    def apply(self, key_bytes: bytes | None, value_bytes: bytes | None) -> None:
        key = records.decode(key_bytes)
        if key is None:
            return
        value = records.decode(value_bytes)
        keytype, subject = key.get("keytype"), key.get("subject")
        with self.lock:
            if keytype == records.SCHEMA and isinstance(subject, str) and isinstance(key.get("version"), int):
                self._apply_schema(subject, key["version"], value)
            elif keytype == records.CONFIG:
                level = (value or {}).get("compatibilityLevel")
                if isinstance(level, str):
                    self.configs[subject] = level.upper()
                else:
                    self.configs.pop(subject, None)
            elif keytype == records.MODE:
                mode = (value or {}).get("mode")
                if isinstance(mode, str):
                    self.modes[subject] = mode.upper()
                else:
                    self.modes.pop(subject, None)
            elif keytype == records.DELETE_SUBJECT and isinstance(subject, str) and value is not None:
                through = value.get("version")
                for v, sv in self.subjects.get(subject, {}).items():
                    if isinstance(through, int) and v <= through:
                        sv.deleted = True
            elif keytype == records.CLEAR_SUBJECT and isinstance(subject, str) and value is not None:
                through = value.get("version")
                for v in [
                    v for v in self.subjects.get(subject, {}) if isinstance(through, int) and v <= through
                ]:
                    self._apply_schema(subject, v, None)
            # NOOP (the reference registry's marker for reading to the end) and unknown key types change nothing.

    def _apply_schema(self, subject: str, version: int, value: dict[str, Any] | None) -> None:
        versions = self.subjects.setdefault(subject, {})
        old = versions.pop(version, None)
        if old is not None:
            users = self.by_id.get(old.id, {})
            users.pop((subject, version), None)
            if not users:
                self.by_id.pop(old.id, None)
                self.ids.pop(old.identity(), None)
        if value is None or not isinstance(value.get("id"), int) or not isinstance(value.get("schema"), str):
            if not versions:
                del self.subjects[subject]
            return
        sv = SchemaVersion(
            subject,
            version,
            value["id"],
            value.get("schemaType") or "AVRO",
            list(value.get("references") or []),
            value["schema"],
            bool(value.get("deleted")),
        )
        versions[version] = sv
        self.by_id.setdefault(sv.id, {})[(subject, version)] = sv
        self.ids.setdefault(sv.identity(), sv.id)
        self.max_id = max(self.max_id, sv.id)

    # ------------------------------------------------------------ reads (callers hold self.lock)

    def live_versions(self, subject: str, deleted: bool = False) -> list[SchemaVersion]:
        return sorted(
            (sv for sv in self.subjects.get(subject, {}).values() if deleted or not sv.deleted),
            key=lambda sv: sv.version,
        )

    def schema_by_id(self, schema_id: int) -> SchemaVersion | None:
        users = self.by_id.get(schema_id)
        if not users:
            return None
        return min(users.values(), key=lambda sv: (sv.deleted, sv.subject, sv.version))

    def compatibility(self, subject: str | None) -> str:
        return self.configs.get(subject) or self.configs.get(None) or DEFAULT_COMPATIBILITY

    def mode(self, subject: str | None) -> str:
        return self.modes.get(subject) or self.modes.get(None) or DEFAULT_MODE

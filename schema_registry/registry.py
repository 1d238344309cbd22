"""The registry's operations as the REST API names them: register, look up, read, delete, compatibility and mode,
over RegistryState and written through KafkaStore. Writers in one process are serialised by a lock, so ids and
versions are assigned from the state every earlier write produced."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kbroker.schema_registry import errors, records
from kbroker.schema_registry.compatibility import LEVELS, check
from kbroker.schema_registry.formats import AVRO, SCHEMA_TYPES, ParsedSchema, parse
from kbroker.schema_registry.kafka_store import KafkaStore
from kbroker.schema_registry.state import RegistryState, SchemaVersion, schema_identity

MODES = ("READWRITE", "READONLY", "IMPORT")
MAX_VERSION = 2**31 - 1


def parse_version(text: str) -> int | None:
    """A version path segment: None for the latest ("latest" or -1)."""
    if text in ("latest", "-1"):
        return None
    try:
        version = int(text)
    except ValueError:
        raise errors.invalid_version(text) from None
    if not 1 <= version <= MAX_VERSION:
        raise errors.invalid_version(text)
    return version


def version_json(sv: SchemaVersion) -> dict[str, Any]:
    out: dict[str, Any] = {"subject": sv.subject, "version": sv.version, "id": sv.id}
    if sv.schema_type != AVRO:
        out["schemaType"] = sv.schema_type
    if sv.references:
        out["references"] = sv.references
    out["schema"] = sv.schema
    return out


class Registry:
    def __init__(self, store: KafkaStore, state: RegistryState, ready_timeout: float = 30.0) -> None:
        self.store = store
        self.state = state
        self.ready_timeout = ready_timeout
        self._write_lock = threading.Lock()

    def _ready(self) -> None:
        self.store.wait_ready(self.ready_timeout)

    # ------------------------------------------------------------ reading

    def subjects(self, deleted: bool = False, prefix: str = "") -> list[str]:
        self._ready()
        with self.state.lock:
            return sorted(
                s
                for s in self.state.subjects
                if s.startswith(prefix) and self.state.live_versions(s, deleted)
            )

    def versions(self, subject: str, deleted: bool = False) -> list[int]:
        self._ready()
        with self.state.lock:
            found = self.state.live_versions(subject, deleted)
        if not found:
            raise errors.subject_not_found(subject)
        return [sv.version for sv in found]

    def version(self, subject: str, version_text: str, deleted: bool = False) -> SchemaVersion:
        version = parse_version(version_text)
        self._ready()
        with self.state.lock:
            if not self.state.live_versions(subject, True):
                raise errors.subject_not_found(subject)
            live = self.state.live_versions(subject, deleted)
            if version is None:
                if not live:
                    raise errors.subject_not_found(subject)
                return live[-1]
            for sv in live:
                if sv.version == version:
                    return sv
        raise errors.version_not_found(version)

    def schema_by_id(self, schema_id: int) -> SchemaVersion:
        self._ready()
        with self.state.lock:
            sv = self.state.schema_by_id(schema_id)
        if sv is None:
            raise errors.schema_not_found("Schema not found")
        return sv

    def parsed_schema(self, schema_id: int) -> ParsedSchema:
        """The schema with this id, parsed with its references (for readers of the wire format)."""
        return self._parsed(self.schema_by_id(schema_id))

    def id_versions(self, schema_id: int, deleted: bool = False) -> list[dict[str, Any]]:
        self._ready()
        with self.state.lock:
            users = self.state.by_id.get(schema_id)
            if not users:
                raise errors.schema_not_found("Schema not found")
            return [
                {"subject": s, "version": v}
                for (s, v), sv in sorted(users.items())
                if deleted or not sv.deleted
            ]

    def referenced_by(self, subject: str, version_text: str) -> list[int]:
        sv = self.version(subject, version_text)
        with self.state.lock:
            return sorted(
                {
                    other.id
                    for versions in self.state.subjects.values()
                    for other in versions.values()
                    if not other.deleted and _refers(other, sv)
                }
            )

    # ------------------------------------------------------------ parsing

    def _resolve(
        self, references: list[dict[str, Any]], seen: set[tuple[str, int]] | None = None
    ) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
        """References with their versions made concrete, and the (name, type, text) of every schema they need,
        dependencies first."""
        seen = set() if seen is None else seen
        concrete: list[dict[str, Any]] = []
        texts: list[tuple[str, str, str]] = []
        for ref in references:
            if (
                not isinstance(ref, dict)
                or not isinstance(ref.get("name"), str)
                or not isinstance(ref.get("subject"), str)
                or not isinstance(ref.get("version"), int)
            ):
                raise errors.invalid_schema(f"Invalid schema reference {ref}")
            try:
                target = self.version(ref["subject"], str(ref["version"]))
            except errors.RegistryError:
                raise errors.invalid_schema(
                    f"Invalid schema: reference {ref['name']} (subject {ref['subject']}, "
                    f"version {ref['version']}) not found"
                ) from None
            concrete.append({"name": ref["name"], "subject": target.subject, "version": target.version})
            if (target.subject, target.version) in seen:
                continue
            seen.add((target.subject, target.version))
            _, inner = self._resolve(target.references, seen)
            texts += inner + [(ref["name"], target.schema_type, target.schema)]
        return concrete, texts

    def _parse(self, body: Any, normalize: bool) -> tuple[ParsedSchema, list[dict[str, Any]]]:
        if not isinstance(body, dict):
            raise errors.unprocessable("The request body must be a JSON object")
        schema_type = body.get("schemaType") or AVRO
        if schema_type not in SCHEMA_TYPES:
            raise errors.invalid_schema(f"Invalid schema type {schema_type}")
        text = body.get("schema")
        if not isinstance(text, str) or not text.strip():
            raise errors.invalid_schema("Empty schema")
        raw_references = body.get("references") or []
        if not isinstance(raw_references, list):
            raise errors.invalid_schema(f"Invalid schema references {raw_references}")
        references, texts = self._resolve(raw_references)
        parsed = parse(schema_type, text, texts)
        return (parsed.normalized() if normalize else parsed), references

    def _parsed(self, sv: SchemaVersion) -> ParsedSchema:
        _, texts = self._resolve(sv.references)
        return parse(sv.schema_type, sv.schema, texts)

    def _previous(self, subject: str) -> list[tuple[int, ParsedSchema]]:
        with self.state.lock:
            live = self.state.live_versions(subject)
        return [(sv.version, self._parsed(sv)) for sv in live]

    # ------------------------------------------------------------ registering

    def register(self, subject: str, body: Any, normalize: bool = False) -> dict[str, Any]:
        self._ready()
        parsed, references = self._parse(body, normalize)
        identity = schema_identity(parsed.schema_type, parsed.canonical(), references)
        wanted_id, wanted_version = body.get("id"), body.get("version")
        with self._write_lock:
            with self.state.lock:
                mode = self.state.mode(subject)
                all_versions = self.state.live_versions(subject, True)
                for sv in all_versions:
                    same = sv.identity() == identity or (
                        normalize and self._normalized_identity(sv) == identity
                    )
                    if not sv.deleted and same and wanted_id in (None, sv.id):
                        return {"id": sv.id, "version": sv.version}
                if mode == "READONLY":
                    raise errors.operation_not_permitted(f"Subject {subject} is in read-only mode")
                if (wanted_id is not None or wanted_version is not None) and mode != "IMPORT":
                    raise errors.operation_not_permitted(f"Subject {subject} is not in import mode")
                existing_id = self.state.ids.get(identity)
                if mode == "IMPORT":
                    if not isinstance(wanted_id, int) or wanted_id < 1:
                        raise errors.unprocessable("Import mode requires the schema's id")
                    holder = self.state.schema_by_id(wanted_id)
                    if holder is not None and holder.identity() != identity:
                        raise errors.operation_not_permitted(
                            f"Overwrite new schema with id {wanted_id} is not permitted."
                        )
                    schema_id = wanted_id
                else:
                    schema_id = existing_id if existing_id is not None else self.state.max_id + 1
                last = max((sv.version for sv in all_versions), default=0)
                version = (
                    wanted_version if isinstance(wanted_version, int) and wanted_version > 0 else last + 1
                )
                level = self.state.compatibility(subject)
            if mode != "IMPORT":
                problems = check(level, parsed, self._previous(subject))
                if problems:
                    raise errors.incompatible(
                        f'Schema being registered is incompatible with an earlier schema for subject "{subject}", '
                        f"details: [{', '.join(problems)}]"
                    )
            self.store.write(
                records.schema_key(subject, version),
                records.schema_value(
                    subject, version, schema_id, parsed.schema_type, references, parsed.canonical(), False
                ),
            )
        return {"id": schema_id, "version": version}

    def lookup(
        self, subject: str, body: Any, normalize: bool = False, deleted: bool = False
    ) -> SchemaVersion:
        self._ready()
        with self.state.lock:
            if not self.state.live_versions(subject, deleted):
                raise errors.subject_not_found(subject)
        parsed, references = self._parse(body, normalize)
        identity = schema_identity(parsed.schema_type, parsed.canonical(), references)
        with self.state.lock:
            candidates = list(reversed(self.state.live_versions(subject, deleted)))
        for sv in candidates:
            if sv.identity() == identity or (normalize and self._normalized_identity(sv) == identity):
                return sv
        raise errors.schema_not_found("Schema not found")

    def _normalized_identity(self, sv: SchemaVersion) -> tuple[str, str, str] | None:
        """normalize=true compares with the normalized form of what is stored, as the reference registry does (a
        schema registered without normalize is found by a normalized lookup of another spelling)."""
        try:
            normalized = self._parsed(sv).normalized()
        except errors.RegistryError:
            return None
        return schema_identity(normalized.schema_type, normalized.canonical(), sv.references)

    def test_compatibility(
        self, subject: str, version_text: str | None, body: Any, normalize: bool = False
    ) -> list[str]:
        """Messages why the schema in body is incompatible (empty when compatible) with one version of subject, or
        (version_text None) with the versions its level checks."""
        version = None if version_text is None else parse_version(version_text)
        self._ready()
        parsed, _ = self._parse(body, normalize)
        with self.state.lock:
            level = self.state.compatibility(subject)
            live = self.state.live_versions(subject)
        if version_text is not None:
            if version is None:
                live = live[-1:]
            else:
                live = [sv for sv in live if sv.version == version]
                if not live:
                    if not self.state.live_versions(subject):
                        raise errors.subject_not_found(subject)
                    raise errors.version_not_found(version)
            level = level.removesuffix("_TRANSITIVE")
        return check(level, parsed, [(sv.version, self._parsed(sv)) for sv in live])

    # ------------------------------------------------------------ deleting

    def _check_writable(self, subject: str) -> None:
        if self.state.mode(subject) == "READONLY":
            raise errors.operation_not_permitted(f"Subject {subject} is in read-only mode")

    def _check_unreferenced(self, targets: list[SchemaVersion]) -> None:
        for versions in self.state.subjects.values():
            for other in versions.values():
                if other.deleted:
                    continue
                for sv in targets:
                    if _refers(other, sv) and other.subject != sv.subject:
                        raise errors.reference_exists(
                            "One or more references exist to the schema {magic=1,keytype=SCHEMA,"
                            f"subject={sv.subject},version={sv.version}}}."
                        )

    def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        self._ready()
        with self._write_lock:
            with self.state.lock:
                self._check_writable(subject)
                every = self.state.live_versions(subject, True)
                if not every:
                    raise errors.subject_not_found(subject)
                live = [sv for sv in every if not sv.deleted]
                if permanent:
                    if live:
                        raise errors.subject_not_soft_deleted(subject)
                else:
                    if not live:
                        raise errors.subject_soft_deleted(subject)
                    self._check_unreferenced(live)
            if permanent:
                for sv in every:
                    self.store.write(records.schema_key(subject, sv.version), None)
                return [sv.version for sv in every]
            self.store.write(
                records.delete_subject_key(subject), records.delete_subject_value(subject, every[-1].version)
            )
            with self.state.lock:
                has_config, has_mode = subject in self.state.configs, subject in self.state.modes
            if has_config:
                self.store.write(records.config_key(subject), None)
            if has_mode:
                self.store.write(records.mode_key(subject), None)
            return [sv.version for sv in live]

    def delete_version(self, subject: str, version_text: str, permanent: bool = False) -> int:
        version = parse_version(version_text)
        self._ready()
        with self._write_lock:
            with self.state.lock:
                self._check_writable(subject)
                every = self.state.live_versions(subject, True)
                if not every:
                    raise errors.subject_not_found(subject)
                if version is None:
                    live = [sv for sv in every if not sv.deleted] if not permanent else every
                    if not live:
                        raise errors.subject_not_found(subject)
                    target = live[-1]
                else:
                    found = [sv for sv in every if sv.version == version]
                    if not found:
                        raise errors.version_not_found(version)
                    target = found[0]
                if permanent and not target.deleted:
                    raise errors.version_not_soft_deleted(subject, target.version)
                if not permanent and target.deleted:
                    raise errors.version_soft_deleted(subject, target.version)
                if not permanent:
                    self._check_unreferenced([target])
            key = records.schema_key(subject, target.version)
            if permanent:
                self.store.write(key, None)
            else:
                self.store.write(
                    key,
                    records.schema_value(
                        subject,
                        target.version,
                        target.id,
                        target.schema_type,
                        target.references,
                        target.schema,
                        True,
                    ),
                )
            return target.version

    # ------------------------------------------------------------ config and mode

    def _setting(
        self,
        subject: str | None,
        default_to_global: bool,
        effective: Callable[[str | None], str],
        table: dict[str | None, str],
        not_configured: Callable[[str], Exception],
    ) -> str:
        """A subject's own compatibility level or mode, or the effective one (falling back to the global)."""
        self._ready()
        with self.state.lock:
            if subject is None or default_to_global:
                return effective(subject)
            value = table.get(subject)
        if value is None:
            raise not_configured(subject)
        return value

    def _delete_setting(
        self,
        subject: str | None,
        table: dict[str | None, str],
        key: bytes,
        not_configured: Callable[[str], Exception],
    ) -> str | None:
        """Tombstone a subject's (or the global) level or mode; the value it had."""
        self._ready()
        with self._write_lock:
            with self.state.lock:
                value = table.get(subject)
            if subject is not None and value is None:
                raise not_configured(subject)
            self.store.write(key, None)
        return value

    def compatibility(self, subject: str | None, default_to_global: bool = False) -> str:
        return self._setting(
            subject,
            default_to_global,
            self.state.compatibility,
            self.state.configs,
            errors.compatibility_not_configured,
        )

    def set_compatibility(self, subject: str | None, body: Any) -> str:
        level = (
            body.get("compatibility") or body.get("compatibilityLevel") if isinstance(body, dict) else None
        )
        if not isinstance(level, str) or level.upper() not in LEVELS:
            raise errors.invalid_compatibility_level(level)
        self._ready()
        with self._write_lock:
            with self.state.lock:
                self._check_writable(subject) if subject is not None else None
            self.store.write(records.config_key(subject), records.config_value(level.upper()))
        return level.upper()

    def delete_compatibility(self, subject: str | None) -> str:
        level = self._delete_setting(
            subject, self.state.configs, records.config_key(subject), errors.compatibility_not_configured
        )
        return level or self.state.compatibility(None)

    def mode(self, subject: str | None, default_to_global: bool = False) -> str:
        return self._setting(
            subject, default_to_global, self.state.mode, self.state.modes, errors.mode_not_configured
        )

    def set_mode(self, subject: str | None, body: Any, force: bool = False) -> str:
        mode = body.get("mode") if isinstance(body, dict) else None
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise errors.invalid_mode(mode)
        mode = mode.upper()
        self._ready()
        with self._write_lock:
            with self.state.lock:
                if mode == "IMPORT" and not force:
                    has = (
                        self.state.live_versions(subject, True)
                        if subject is not None
                        else any(self.state.live_versions(s, True) for s in self.state.subjects)
                    )
                    if has:
                        raise errors.operation_not_permitted("Cannot import since found existing subjects")
            self.store.write(records.mode_key(subject), records.mode_value(mode))
        return mode

    def delete_mode(self, subject: str) -> str:
        mode = self._delete_setting(
            subject, self.state.modes, records.mode_key(subject), errors.mode_not_configured
        )
        assert mode is not None  # a subject's: _delete_setting raised when it had none
        return mode


def _refers(other: SchemaVersion, target: SchemaVersion) -> bool:
    return any(
        r.get("subject") == target.subject and r.get("version") == target.version for r in other.references
    )

"""Avro schemas: parsed by the avro library (named references pre-registered), compatibility by Avro's schema
resolution rules as the avro library's ReaderWriterCompatibilityChecker implements them (Java's SchemaCompatibility)."""

from __future__ import annotations

import json
from typing import Any

import avro.compatibility as compat
import avro.errors
import avro.schema
from kbroker.schema_registry.errors import invalid_schema


def _names(references: list[tuple[str, str, str]]) -> avro.schema.Names:
    names = avro.schema.Names()
    for name, schema_type, text in references:
        if schema_type != "AVRO":
            raise invalid_schema(f"Invalid schema: the Avro reference {name} is a {schema_type} schema")
        try:
            avro.schema.make_avsc_object(json.loads(text), names)
        except (ValueError, avro.errors.AvroException) as e:
            raise invalid_schema(f"Invalid schema: reference {name}: {e}") from None
    return names


def _sorted_json(value: Any) -> Any:
    """normalize=true: object keys in one order, so two spellings of the same schema become one."""
    if isinstance(value, dict):
        return {k: _sorted_json(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_json(v) for v in value]
    return value


class AvroSchema:
    schema_type = "AVRO"

    def __init__(self, schema: avro.schema.Schema, references: list[tuple[str, str, str]]) -> None:
        self.schema = schema
        self.references = references
        # Referenced types stay names in the canonical text, as the reference registry writes them.
        self._canonical = json.dumps(schema.to_json(_names(references)), separators=(",", ":"))

    @classmethod
    def parse(cls, text: str, references: list[tuple[str, str, str]]) -> AvroSchema:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise invalid_schema(f"Invalid schema {text}: {e}") from None
        try:
            schema = avro.schema.make_avsc_object(data, _names(references))
        except (ValueError, TypeError, KeyError, avro.errors.AvroException) as e:
            raise invalid_schema(f"Invalid schema {text}, details: {e}") from None
        return cls(schema, references)

    def canonical(self) -> str:
        return self._canonical

    def normalized(self) -> AvroSchema:
        return AvroSchema.parse(
            json.dumps(_sorted_json(json.loads(self._canonical)), separators=(",", ":")), self.references
        )

    def read_errors(self, writer: object) -> list[str]:
        if not isinstance(writer, AvroSchema):
            return [f"Incompatible schema type: {getattr(writer, 'schema_type', '?')} vs AVRO"]
        result = compat.ReaderWriterCompatibilityChecker().get_compatibility(self.schema, writer.schema)
        if result.compatibility is compat.SchemaCompatibilityType.compatible:
            return []
        locations = sorted(result.locations) or ["/"]
        kinds = [k.name.upper() for k in result.incompatibilities] or ["TYPE_MISMATCH"]
        details = sorted(str(m) for m in result.messages) or [""]
        out = []
        for i in range(max(len(kinds), len(locations))):
            kind, location = kinds[min(i, len(kinds) - 1)], locations[min(i, len(locations) - 1)]
            detail = details[min(i, len(details) - 1)]
            text = DESCRIPTIONS.get(kind, "{kind} at path '{path}': {detail}").format(
                kind=kind, path=location, detail=detail
            )
            out.append(f"{{errorType:'{kind}', description:'{text}', additionalInfo:'{detail}'}}")
        return out


# The reference registry's wording for each of Avro's incompatibility kinds.
DESCRIPTIONS = {
    "READER_FIELD_MISSING_DEFAULT_VALUE": "The field '{detail}' at path '{path}' in the new schema has no default "
    "value and is missing in the old schema",
    "TYPE_MISMATCH": "The type (path '{path}') of a field in the new schema does not match with the old schema",
    "NAME_MISMATCH": "The name of the schema has changed (path '{path}')",
    "MISSING_ENUM_SYMBOLS": "The new schema is missing enum symbols '{detail}' at path '{path}' in the old schema",
    "MISSING_UNION_BRANCH": "The new schema is missing a type inside a union field at path '{path}' in the old "
    "schema",
    "FIXED_SIZE_MISMATCH": "The size of FIXED type field at path '{path}' in the new schema does not match with the "
    "old schema",
}

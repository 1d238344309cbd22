"""Schema formats by schemaType: parsing a schema with its references, and each format's compatibility rules."""

from __future__ import annotations

from typing import Protocol

from kbroker.schema_registry.errors import invalid_schema

AVRO, JSON, PROTOBUF = "AVRO", "JSON", "PROTOBUF"
SCHEMA_TYPES = (JSON, PROTOBUF, AVRO)  # the order the reference registry lists them in /schemas/types


class ParsedSchema(Protocol):
    schema_type: str

    def canonical(self) -> str:
        """The text stored and compared: identical canonical text (and references) means the same schema id."""
        ...

    def normalized(self) -> ParsedSchema:
        """The form `normalize=true` registers and looks up (reordering that does not change meaning)."""
        ...

    def read_errors(self, writer: ParsedSchema) -> list[str]:
        """Why data written with `writer` cannot be read with this schema; empty when it can."""
        ...


def parse(schema_type: str, text: str, references: list[tuple[str, str, str]]) -> ParsedSchema:
    """A schema of schema_type; references are (name, schemaType, text) of every schema it imports, transitively
    resolved and ordered so each comes after those it needs."""
    if schema_type == AVRO:
        from kbroker.schema_registry.formats.avro import AvroSchema

        return AvroSchema.parse(text, references)
    if schema_type == JSON:
        from kbroker.schema_registry.formats.json_schema import JsonSchema

        return JsonSchema.parse(text, references)
    if schema_type == PROTOBUF:
        from kbroker.schema_registry.formats.protobuf import ProtobufSchema

        return ProtobufSchema.parse(text, references)
    raise invalid_schema(f"Invalid schema type {schema_type}")

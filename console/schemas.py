"""Keys and values in the schema registry's wire format (magic byte 0, a 4-byte schema id, the payload), decoded for
the message browser with the schemas of the broker's own registry: Avro to JSON, JSON Schema as its JSON."""

from __future__ import annotations

import base64
import io
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kbroker.schema_registry.registry import Registry

MAGIC = 0


def _jsonable(value: Any) -> Any:
    """An Avro datum as JSON: bytes and fixed as base64, everything else as the avro library reads it."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


class WireFormatDecoder:
    """Looks a record's schema id up in the registry; what is not in the wire format, or whose schema is unknown,
    is left to the browser's plain view (None)."""

    def __init__(self, registry: Registry | None) -> None:
        self.registry = registry

    def decode(self, data: bytes | None) -> dict[str, Any] | None:
        if self.registry is None or data is None or len(data) < 5 or data[0] != MAGIC:
            return None
        schema_id = int.from_bytes(data[1:5], "big")
        try:
            parsed = self.registry.parsed_schema(schema_id)
        except Exception:  # noqa: BLE001  (an unknown id or a registry still loading: show the bytes as they are)
            return None
        payload = data[5:]
        out: dict[str, Any] = {"schema_id": schema_id, "schema_type": parsed.schema_type}
        if parsed.schema_type == "AVRO":
            import avro.errors
            import avro.io

            try:
                datum = avro.io.DatumReader(parsed.schema).read(avro.io.BinaryDecoder(io.BytesIO(payload)))
            except (avro.errors.AvroException, EOFError, ValueError, TypeError):
                return None
            return out | {"encoding": "json", "data": json.dumps(_jsonable(datum))}
        if parsed.schema_type == "JSON":
            try:
                return out | {"encoding": "json", "data": json.dumps(json.loads(payload))}
            except ValueError:
                return None
        # Protobuf: the payload starts with the message indexes; the bytes are shown as they are.
        return out | {"encoding": "base64", "data": base64.b64encode(payload).decode()}

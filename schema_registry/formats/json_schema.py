"""JSON Schema: checked against its draft's meta-schema by the jsonschema library, and compared by the reference
registry's JsonSchemaDiff rules: the reader must accept every document the writer's schema accepts."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import jsonschema.exceptions
from kbroker.schema_registry.errors import invalid_schema

Schema = dict[str, Any] | bool

# A writer's bound that the reader drops or loosens is compatible; one it adds or tightens is not.
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
COMBINERS = ("oneOf", "anyOf")


def _types(schema: dict[str, Any]) -> set[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


class JsonSchema:
    schema_type = "JSON"

    def __init__(self, document: Schema, references: list[tuple[str, str, str]]) -> None:
        self.document = document
        self.references = references
        self.named: dict[str, Any] = {}
        for name, _, text in references:
            self.named[name] = json.loads(text)

    @classmethod
    def parse(cls, text: str, references: list[tuple[str, str, str]]) -> JsonSchema:
        try:
            document = json.loads(text)
        except ValueError as e:
            raise invalid_schema(f"Invalid schema {text}: {e}") from None
        if not isinstance(document, dict | bool):
            raise invalid_schema(f"Invalid schema {text}: a JSON Schema is an object or a boolean")
        for name, schema_type, _ in references:
            if schema_type != "JSON":
                raise invalid_schema(
                    f"Invalid schema: the JSON Schema reference {name} is a {schema_type} schema"
                )
        try:
            jsonschema.validators.validator_for(document).check_schema(document)
        except jsonschema.exceptions.SchemaError as e:
            raise invalid_schema(f"Invalid schema {text}, details: {e.message}") from None
        return cls(document, references)

    def canonical(self) -> str:
        return json.dumps(self.document, separators=(",", ":"))

    def normalized(self) -> JsonSchema:
        return JsonSchema(json.loads(json.dumps(self.document, sort_keys=True)), self.references)

    def read_errors(self, writer: object) -> list[str]:
        if not isinstance(writer, JsonSchema):
            return [f"Incompatible schema type: {getattr(writer, 'schema_type', '?')} vs JSON"]
        out: list[str] = []
        _Diff(writer, self, out).compare(writer.document, self.document, "#/", set())
        return out


class _Diff:
    """Differences from the writer's schema (original) to the reader's (update) that the reader would refuse."""

    def __init__(self, original: JsonSchema, update: JsonSchema, out: list[str]) -> None:
        self.original, self.update, self.out = original, update, out

    def _problem(self, kind: str, path: str) -> None:
        self.out.append(f"{{errorType:'{kind}', description:'at path '{path}''}}")

    def _resolve(self, schema: Schema, side: JsonSchema) -> Schema:
        for _ in range(32):  # a chain of $refs, not a cycle
            if not isinstance(schema, dict) or "$ref" not in schema or len(schema) > 2:
                return schema
            ref = schema["$ref"]
            target: Any
            if ref.startswith("#"):
                target = side.document
                for part in [p for p in ref[1:].split("/") if p]:
                    target = (
                        target.get(part.replace("~1", "/").replace("~0", "~"), {})
                        if isinstance(target, dict)
                        else {}
                    )
            else:
                name, _, pointer = ref.partition("#")
                target = side.named.get(name, {})
                for part in [p for p in pointer.split("/") if p]:
                    target = target.get(part, {}) if isinstance(target, dict) else {}
            schema = target
        return schema

    def compare(self, original: Schema, update: Schema, path: str, seen: set[tuple[int, int]]) -> None:
        original, update = self._resolve(original, self.original), self._resolve(update, self.update)
        if (id(original), id(update)) in seen:
            return
        seen = seen | {(id(original), id(update))}
        if update is True or update == {}:
            return  # the reader accepts anything
        if original is False:
            return  # the writer writes nothing
        if update is False or original is True or original == {}:
            self._problem("TYPE_NARROWED", path)
            return
        if not isinstance(original, dict) or not isinstance(update, dict):
            # Tuple-form `items` (a list of schemas) and the like: compared as written.
            if original != update:
                self._problem("TYPE_CHANGED", path)
            return
        before, after = _types(original), _types(update)
        if after is not None:
            if before is None:
                self._problem("TYPE_NARROWED", path)
            else:
                widened = after | ({"integer"} if "number" in after else set())
                if not before <= widened:
                    self._problem("TYPE_CHANGED" if not before & after else "TYPE_NARROWED", path)
                    return
        for key in UPPER_BOUNDS:
            if key in update and (key not in original or update[key] < original[key]):
                self._problem(f"{_snake(key)}_{'ADDED' if key not in original else 'DECREASED'}", path)
        for key in LOWER_BOUNDS:
            if key in update and (key not in original or update[key] > original[key]):
                self._problem(f"{_snake(key)}_{'ADDED' if key not in original else 'INCREASED'}", path)
        if "pattern" in update and update["pattern"] != original.get("pattern"):
            self._problem("PATTERN_ADDED" if "pattern" not in original else "PATTERN_CHANGED", path)
        if "multipleOf" in update and (original.get("multipleOf") or 0) % update["multipleOf"] != 0:
            self._problem(
                "MULTIPLE_OF_ADDED" if "multipleOf" not in original else "MULTIPLE_OF_CHANGED", path
            )
        if update.get("uniqueItems") and not original.get("uniqueItems"):
            self._problem("UNIQUE_ITEMS_ADDED", path)
        if "enum" in update:
            if "enum" not in original:
                self._problem("ENUM_ARRAY_CHANGED", path)
            elif any(v not in update["enum"] for v in original["enum"]):
                self._problem("ENUM_ARRAY_NARROWED", path)
        if "const" in update and update["const"] != original.get("const", object()):
            self._problem("CONST_CHANGED", path)
        self._objects(original, update, path, seen)
        if "items" in original or "items" in update:
            self.compare(original.get("items", True), update.get("items", True), path + "items/", seen)
        for key in COMBINERS:
            if key in update:
                branches = original.get(key, [original])
                for i, branch in enumerate(branches):
                    if not any(self._accepts(branch, candidate, seen) for candidate in update[key]):
                        self._problem("SUM_TYPE_NARROWED", f"{path}{key}/{i}")
        if len(update.get("allOf", [])) > len(original.get("allOf", [])):
            self._problem("PRODUCT_TYPE_EXTENDED", path)

    def _accepts(self, original: Schema, update: Schema, seen: set[tuple[int, int]]) -> bool:
        probe = _Diff(self.original, self.update, [])
        probe.compare(original, update, "#/", seen)
        return not probe.out

    def _objects(
        self, original: dict[str, Any], update: dict[str, Any], path: str, seen: set[tuple[int, int]]
    ) -> None:
        before, after = original.get("properties", {}), update.get("properties", {})
        original_open = original.get("additionalProperties", True) is not False
        update_open = update.get("additionalProperties", True) is not False
        required_before, required_after = set(original.get("required", [])), set(update.get("required", []))
        for name in sorted(set(after) - set(before)):
            where = f"{path}properties/{name}"
            if name in required_after and name not in required_before:
                self._problem(
                    "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"
                    if not original_open
                    else "REQUIRED_ATTRIBUTE_ADDED",
                    where,
                )
            elif original_open:
                # The writer allowed any value under that name: the reader must accept any.
                extra = original.get("additionalProperties", True)
                self.compare(extra, after[name], where, seen)
        for name in sorted(set(before) - set(after)):
            if not update_open:
                self._problem("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL", f"{path}properties/{name}")
            elif isinstance(update.get("additionalProperties"), dict):
                self.compare(before[name], update["additionalProperties"], f"{path}properties/{name}", seen)
        for name in sorted(set(before) & set(after)):
            self.compare(before[name], after[name], f"{path}properties/{name}/", seen)
        for name in sorted((required_after - required_before) & set(before)):
            self._problem("REQUIRED_ATTRIBUTE_ADDED", f"{path}required/{name}")
        if original_open and not update_open:
            self._problem("ADDITIONAL_PROPERTIES_REMOVED", path)
        elif original_open and isinstance(update.get("additionalProperties"), dict):
            self.compare(
                original.get("additionalProperties", True),
                update["additionalProperties"],
                path + "additionalProperties/",
                seen,
            )


def _snake(key: str) -> str:
    return "".join("_" + c if c.isupper() else c.upper() for c in key)

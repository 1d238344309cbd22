"""Protobuf schemas: .proto text compiled by protoc (grpcio-tools) or a base64 FileDescriptorProto (what
confluent-kafka's serializer sends), stored as the latter; compatibility by the reference registry's
SchemaDiff rules (package, messages, field kinds and scalar groups, labels, required fields, oneofs)."""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pb2 import FileDescriptorProto as FDP
from google.protobuf.message import DecodeError
from kbroker.schema_registry.errors import invalid_schema

F = descriptor_pb2.FieldDescriptorProto
MAIN_FILE = "schema.proto"

# Wire-compatible scalar groups (the protobuf guide's "updating a message type"); enums count as general numbers.
SCALAR_GROUPS = {
    F.TYPE_INT32: "GENERAL_NUMBER",
    F.TYPE_INT64: "GENERAL_NUMBER",
    F.TYPE_UINT32: "GENERAL_NUMBER",
    F.TYPE_UINT64: "GENERAL_NUMBER",
    F.TYPE_BOOL: "GENERAL_NUMBER",
    F.TYPE_ENUM: "GENERAL_NUMBER",
    F.TYPE_SINT32: "SIGNED_NUMBER",
    F.TYPE_SINT64: "SIGNED_NUMBER",
    F.TYPE_STRING: "STRING_OR_BYTES",
    F.TYPE_BYTES: "STRING_OR_BYTES",
    F.TYPE_FIXED32: "FIXED32",
    F.TYPE_SFIXED32: "FIXED32",
    F.TYPE_FIXED64: "FIXED64",
    F.TYPE_SFIXED64: "FIXED64",
    F.TYPE_FLOAT: "FLOAT",
    F.TYPE_DOUBLE: "DOUBLE",
}


def _from_base64(text: str) -> FDP | None:
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    fd = FDP()
    try:
        fd.ParseFromString(data)
    except DecodeError:
        return None
    return fd if fd.name or fd.message_type or fd.enum_type else None


def _compile(text: str, name: str, dependencies: list[FDP]) -> FDP:
    """protoc on the text, with the dependencies given as descriptors (they may have arrived as base64)."""
    try:
        from grpc_tools import protoc
    except ImportError:
        raise invalid_schema(
            "Invalid schema: .proto text needs grpcio-tools (pip install 'kbroker[registry]'); "
            "a base64 FileDescriptorProto is accepted without it"
        ) from None
    import grpc_tools

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory(prefix="kbroker-proto-") as tmp:
        path = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        args = ["protoc", f"-I{tmp}", f"-I{well_known}", f"--descriptor_set_out={tmp}/out.pb"]
        if dependencies:
            with open(os.path.join(tmp, "deps.pb"), "wb") as f:
                f.write(descriptor_pb2.FileDescriptorSet(file=dependencies).SerializeToString())
            args.append(f"--descriptor_set_in={tmp}/deps.pb")
        # protoc prints its complaints on stderr: read them back for the error message.
        err_path = os.path.join(tmp, "stderr")
        saved = os.dup(2)
        with open(err_path, "w") as err:
            os.dup2(err.fileno(), 2)
            try:
                rc = protoc.main([*args, name])
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        if rc != 0:
            with open(err_path) as err:
                detail = err.read().strip().replace(tmp + "/", "")
            raise invalid_schema(f"Invalid schema {text}, details: {detail or 'protoc failed'}")
        with open(os.path.join(tmp, "out.pb"), "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file
    return files[-1]


def _descriptor(text: str, name: str, dependencies: list[FDP]) -> FDP:
    fd = _from_base64(text)
    if fd is None:
        fd = _compile(text, name, dependencies)
    return fd


class ProtobufSchema:
    schema_type = "PROTOBUF"

    def __init__(
        self, descriptor: FDP, dependencies: list[FDP], references: list[tuple[str, str, str]]
    ) -> None:
        self.descriptor = descriptor
        self.dependencies = dependencies
        self.references = references
        self.types: dict[str, Any] = {}
        for fd in [*dependencies, descriptor]:
            prefix = "." + fd.package if fd.package else ""
            for m in fd.message_type:
                self._collect(prefix, m)
            for e in fd.enum_type:
                self.types[f"{prefix}.{e.name}"] = e

    def _collect(self, prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        full = f"{prefix}.{message.name}"
        self.types[full] = message
        for nested in message.nested_type:
            self._collect(full, nested)
        for e in message.enum_type:
            self.types[f"{full}.{e.name}"] = e

    @classmethod
    def parse(cls, text: str, references: list[tuple[str, str, str]]) -> ProtobufSchema:
        dependencies: list[FDP] = []
        for name, schema_type, ref_text in references:
            if schema_type != "PROTOBUF":
                raise invalid_schema(
                    f"Invalid schema: the Protobuf reference {name} is a {schema_type} schema"
                )
            dep = FDP()
            dep.CopyFrom(_descriptor(ref_text, name, list(dependencies)))
            dep.name = name  # imported under the reference's name, whatever name it was registered with
            dependencies.append(dep)
        return cls(_descriptor(text, MAIN_FILE, dependencies), dependencies, references)

    def canonical(self) -> str:
        return base64.b64encode(self.descriptor.SerializeToString(deterministic=True)).decode()

    def normalized(self) -> ProtobufSchema:
        fd = FDP()
        fd.CopyFrom(self.descriptor)
        fd.ClearField("source_code_info")
        return ProtobufSchema(fd, self.dependencies, self.references)

    def read_errors(self, writer: object) -> list[str]:
        if not isinstance(writer, ProtobufSchema):
            return [f"Incompatible schema type: {getattr(writer, 'schema_type', '?')} vs PROTOBUF"]
        out: list[str] = []
        original, update = writer, self
        if original.descriptor.package != update.descriptor.package:
            out.append(_problem("PACKAGE_CHANGED", "#/"))
        prefix_o = "." + original.descriptor.package if original.descriptor.package else ""
        prefix_u = "." + update.descriptor.package if update.descriptor.package else ""
        for m in original.descriptor.message_type:
            other = next((u for u in update.descriptor.message_type if u.name == m.name), None)
            if other is None:
                out.append(_problem("MESSAGE_REMOVED", f"#/{m.name}"))
            else:
                _Diff(original, update, out).message(
                    f"{prefix_o}.{m.name}", f"{prefix_u}.{m.name}", m.name, set()
                )
        return out


def _problem(kind: str, path: str) -> str:
    return f"{{errorType:'{kind}', description:'at path '{path}''}}"


class _Diff:
    def __init__(self, original: ProtobufSchema, update: ProtobufSchema, out: list[str]) -> None:
        self.original, self.update, self.out = original, update, out

    def message(self, original_name: str, update_name: str, path: str, seen: set[tuple[str, str]]) -> None:
        if (original_name, update_name) in seen:
            return
        seen.add((original_name, update_name))
        o, u = self.original.types[original_name], self.update.types[update_name]
        for nested in o.nested_type:
            if nested.options.map_entry:
                continue
            if not any(n.name == nested.name for n in u.nested_type):
                self.out.append(_problem("MESSAGE_REMOVED", f"#/{path}.{nested.name}"))
            else:
                self.message(
                    f"{original_name}.{nested.name}",
                    f"{update_name}.{nested.name}",
                    f"{path}.{nested.name}",
                    seen,
                )
        fields_o, fields_u = {f.number: f for f in o.field}, {f.number: f for f in u.field}

        def oneof(m: Any, f: Any) -> str | None:
            if not f.HasField("oneof_index") or f.proto3_optional:
                return None
            return m.oneof_decl[f.oneof_index].name

        for number, fo in fields_o.items():
            where = f"#/{path}/{number}"
            fu = fields_u.get(number)
            # A field leaving a oneof that still exists is refused; the whole oneof going is not (ONEOF_REMOVED).
            left_oneof = (
                oneof(o, fo) is not None
                and oneof(o, fo) in {d.name for d in u.oneof_decl}
                and (fu is None or oneof(u, fu) != oneof(o, fo))
            )
            if left_oneof:
                self.out.append(_problem("ONEOF_FIELD_REMOVED", where))
            if fu is None:
                continue
            self.field(fo, fu, where, seen)
            if (fo.label == F.LABEL_REQUIRED) != (fu.label == F.LABEL_REQUIRED):
                self.out.append(
                    _problem(
                        "REQUIRED_FIELD_ADDED" if fu.label == F.LABEL_REQUIRED else "REQUIRED_FIELD_REMOVED",
                        where,
                    )
                )
            elif (
                (fo.label == F.LABEL_REPEATED) != (fu.label == F.LABEL_REPEATED)
                and SCALAR_GROUPS.get(fo.type) not in (None, "STRING_OR_BYTES")
                and not self._is_map(fu, True)
            ):
                self.out.append(_problem("FIELD_NUMERIC_LABEL_CHANGED", where))
        for number, fu in fields_u.items():
            if number not in fields_o and fu.label == F.LABEL_REQUIRED:
                self.out.append(_problem("REQUIRED_FIELD_ADDED", f"#/{path}/{number}"))
        # Fields that were outside any oneof and are inside one now.
        moved: dict[str, int] = {}
        for number, fu in fields_u.items():
            fo = fields_o.get(number)
            if fo is not None and oneof(o, fo) is None and oneof(u, fu) is not None:
                name = oneof(u, fu)
                assert name is not None
                existing = any(oneof(o, f) == name for f in o.field)
                if existing:
                    self.out.append(_problem("FIELD_MOVED_TO_EXISTING_ONEOF", f"#/{path}/{number}"))
                moved[name] = moved.get(name, 0) + 1
        for name, count in moved.items():
            if count > 1:
                self.out.append(_problem("MULTIPLE_FIELDS_MOVED_TO_ONEOF", f"#/{path}/{name}"))

    def _is_map(self, f: Any, update: bool) -> bool:
        side = self.update if update else self.original
        t = side.types.get(f.type_name) if f.type == F.TYPE_MESSAGE else None
        return t is not None and t.options.map_entry

    def _kind(self, f: Any, update: bool) -> str:
        if f.type == F.TYPE_MESSAGE or f.type == F.TYPE_GROUP:
            return "MAP" if self._is_map(f, update) else "MESSAGE"
        return "SCALAR"

    def field(self, fo: Any, fu: Any, where: str, seen: set[tuple[str, str]]) -> None:
        ko, ku = self._kind(fo, False), self._kind(fu, True)
        if ko != ku:
            self.out.append(_problem("FIELD_KIND_CHANGED", where))
        elif ko == "SCALAR":
            if SCALAR_GROUPS.get(fo.type) != SCALAR_GROUPS.get(fu.type):
                self.out.append(_problem("FIELD_SCALAR_KIND_CHANGED", where))
        elif ko == "MAP":
            mo, mu = self.original.types[fo.type_name], self.update.types[fu.type_name]
            for a, b in zip(mo.field, mu.field, strict=False):
                self.field(a, b, where, seen)
        else:
            local_o = _local(fo.type_name, self.original)
            local_u = _local(fu.type_name, self.update)
            if local_o != local_u:
                self.out.append(_problem("FIELD_NAMED_TYPE_CHANGED", where))
            elif fo.type_name in self.original.types and fu.type_name in self.update.types:
                before = len(self.out)
                self.message(fo.type_name, fu.type_name, local_o.lstrip("."), seen)
                if len(self.out) > before:
                    self.out.append(_problem("FIELD_NAMED_TYPE_CHANGED", where))


def _local(type_name: str, side: ProtobufSchema) -> str:
    for fd in [*side.dependencies, side.descriptor]:
        prefix = f".{fd.package}." if fd.package else "."
        if fd.package and type_name.startswith(prefix):
            return type_name[len(prefix) :]
    return type_name.lstrip(".")

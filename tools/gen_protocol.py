"""Generate protocol/messages.py from Apache Kafka's JSON message specs.

Usage: python tools/gen_protocol.py [SPEC_DIR]   (default: ../shared/kafka-message-specs)

A spec in tools/spec_overrides/ (coordinator records in its coordinator/ folder) replaces the one of the same file
name, or adds a message Kafka 3.9 lacks: later versions of messages that clients need (ConsumerGroupHeartbeat v1 of
Kafka 4.0, which librdkafka's KIP-848 consumer requires; the share-group APIs of Kafka 4.2, KIP-932, which
KafkaShareConsumer speaks) and the records of __share_group_state; the streams-group APIs and records of Kafka
4.4 (KIP-1071, taken from the kafka-clients and kafka-group-coordinator 4.4.0 jars), which Kafka Streams speaks
with group.protocol=streams.

The output is committed, so the installed package never needs the spec files. It holds one
dataclass per message (nested structs as inner classes) plus the schema facts the codec needs:
per field its wire type, versions, nullable versions, tag, default and flexible override.
"""

from __future__ import annotations

import json
import keyword
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The repository's sibling `shared/` folder; a git worktree one level deeper finds it one more level up.
DEFAULT_SPECS = next(
    (
        p / "shared" / "kafka-message-specs"
        for p in (ROOT.parent, ROOT.parent.parent)
        if (p / "shared" / "kafka-message-specs").is_dir()
    ),
    ROOT.parent / "shared" / "kafka-message-specs",
)
OUT = ROOT / "protocol" / "messages.py"
OVERRIDES = ROOT / "tools" / "spec_overrides"
MAX_VERSION = 32767

PRIMITIVE_PY = {
    "bool": "bool",
    "int8": "int",
    "int16": "int",
    "uint16": "int",
    "int32": "int",
    "int64": "int",
    "float64": "float",
    "string": "str",
    "bytes": "bytes",
    "uuid": "bytes",
    "records": "Any",
}


def strip_comments(text: str) -> str:
    out = []
    for line in text.splitlines():
        # Comments in these files are whole-line or trailing `//`; none appear inside strings
        # except URLs in `about` texts, which never start a line and follow a quote.
        idx = _comment_start(line)
        out.append(line if idx < 0 else line[:idx])
    return "\n".join(out)


def _comment_start(line: str) -> int:
    in_str = False
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\" and in_str:
            i += 2
            continue
        if c == '"':
            in_str = not in_str
        elif not in_str and line.startswith("//", i):
            return i
        i += 1
    return -1


def parse_versions(spec: str | None) -> tuple[int, int] | None:
    if spec is None or spec == "none":
        return None
    if spec.endswith("+"):
        return int(spec[:-1]), MAX_VERSION
    if "-" in spec:
        lo, hi = spec.split("-")
        return int(lo), int(hi)
    return int(spec), int(spec)


def snake(name: str) -> str:
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s).lower()
    if keyword.iskeyword(s):
        s += "_"
    return s


class Gen:
    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.common = {c["name"]: c for c in spec.get("commonStructs", [])}
        self.structs: dict[str, list[dict]] = {}  # struct name -> fields, in definition order

    def collect(self, struct_name: str, fields: list[dict]) -> None:
        if struct_name in self.structs:
            return
        self.structs[struct_name] = fields
        for f in fields:
            base = f["type"].removeprefix("[]")
            if base in PRIMITIVE_PY:
                continue
            if "fields" in f:
                self.collect(base, f["fields"])
            elif base in self.common:
                self.collect(base, self.common[base]["fields"])
            else:
                raise SystemExit(f"{self.spec['name']}: unknown type {f['type']}")


def default_expr(f: dict, nullable: bool, owner: str) -> tuple[str, str]:
    """Return (python default expression for the dataclass, repr for the schema)."""
    t = f["type"]
    d = f.get("default")
    if t.startswith("[]"):
        if d == "null":
            return "None", "None"
        return "field(default_factory=list)", "[]"
    if t in ("int8", "int16", "uint16", "int32", "int64"):
        v = 0 if d in (None, "") else int(str(d).strip(), 0)
        return repr(v), repr(v)
    if t == "float64":
        v = 0.0 if d in (None, "") else float(d)
        return repr(v), repr(v)
    if t == "bool":
        v = str(d).strip().lower() == "true" if d is not None else False
        return repr(v), repr(v)
    if t == "string":
        if d == "null":
            return "None", "None"
        return repr(d or ""), repr(d or "")
    if t in ("bytes", "records"):
        if d == "null" or (t == "records"):
            return "None", "None"
        return "b''", "b''"
    if t == "uuid":
        return "ZERO_UUID", "ZERO_UUID"
    # struct
    if nullable or d == "null":
        return "None", "None"
    return f"field(default_factory=lambda: {owner}.{t}())", "NEW_STRUCT"


def py_type(f: dict, owner: str, nullable: bool) -> str:
    t = f["type"]
    if t.startswith("[]"):
        inner = t[2:]
        it = PRIMITIVE_PY.get(inner, f'"{owner}.{inner}"')
        if it.startswith('"'):
            it = f"{owner}.{inner}"
        s = f"list[{it}]"
    else:
        s = PRIMITIVE_PY.get(t, f"{owner}.{t}")
    if nullable and s != "Any":
        s += " | None"
    return s


def emit_struct(out: list[str], name: str, fields: list[dict], owner: str, indent: str) -> None:
    out.append(f"{indent}@dataclass(slots=True)")
    out.append(f"{indent}class {name}:")
    specs = []
    for f in fields:
        attr = snake(f["name"])
        nv = parse_versions(f.get("nullableVersions"))
        d = f.get("default")
        nullable = nv is not None or d == "null"
        dexpr, drepr = default_expr(f, nullable, owner)
        if dexpr == "None":
            nullable = True
        out.append(f"{indent}    {attr}: {py_type(f, owner, nullable)} = {dexpr}")
        # A tagged field may name only its taggedVersions (StreamsGroupMetadataValue.LastAssignmentConfigs of Kafka 4.4).
        ver = parse_versions(f.get("versions", f.get("taggedVersions")))
        tag = None if f.get("tag") is None else int(f["tag"])
        tv = parse_versions(f.get("taggedVersions")) if tag is not None else None
        flex_override = parse_versions(f["flexibleVersions"]) if "flexibleVersions" in f else "inherit"
        specs.append(
            (
                attr,
                f["type"],
                ver,
                nv,
                tag,
                tv,
                drepr,
                flex_override if flex_override != "inherit" else "INHERIT",
            )
        )
    if not fields:
        out.append(f"{indent}    pass")
    out.append("")
    body = ",\n".join(f"{indent}        {_spec_repr(s)}" for s in specs)
    out.append(
        f"{indent}    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (\n{body}{',' if specs else ''}\n{indent}    )"
    )
    out.append("")


def _spec_repr(s: tuple) -> str:
    attr, typ, ver, nv, tag, tv, drepr, flex = s
    flex_r = "INHERIT" if flex == "INHERIT" else repr(flex)
    return f"FieldSpec({attr!r}, {typ!r}, {ver!r}, {nv!r}, {tag!r}, {tv!r}, {drepr}, {flex_r})"


def emit_message(out: list[str], spec: dict) -> None:
    g = Gen(spec)
    name = spec["name"]
    # Inner structs first so the top-level FIELDS can name them; all inner classes live in the message class.
    for f in spec["fields"]:
        base = f["type"].removeprefix("[]")
        if base not in PRIMITIVE_PY:
            if "fields" in f:
                g.collect(base, f["fields"])
            else:
                g.collect(base, g.common[base]["fields"])
    for c in g.common:
        g.collect(c, g.common[c]["fields"])
    fields = spec["fields"]
    out.append("@dataclass(slots=True)")
    out.append(f"class {name}:")
    valid = parse_versions(spec["validVersions"])
    flex = parse_versions(spec.get("flexibleVersions"))
    api_key = spec.get("apiKey")
    out.append(f"    API_KEY: ClassVar[int | None] = {api_key!r}")
    out.append(f"    KIND: ClassVar[str] = {spec['type']!r}")
    out.append(f"    VALID_VERSIONS: ClassVar[tuple[int, int] | None] = {valid!r}")
    out.append(f"    FLEXIBLE_VERSIONS: ClassVar[tuple[int, int] | None] = {flex!r}")
    out.append("")
    # Emit inner struct classes via a nested generator (struct classes refer to siblings through the owner).
    inner: list[str] = []
    for sname, sfields in g.structs.items():
        emit_struct(inner, sname, sfields, name, "    ")
    # The top-level fields of the message itself.
    top: list[str] = []
    emit_struct(top, "__TOP__", fields, name, "")
    # top[0:2] are the decorator and class line of the placeholder; its body belongs to the message class.
    out.extend(top[2:])
    out.extend(inner)
    out.append("")


def render(spec_dir: Path) -> str:
    """The text of protocol/messages.py for the specs in spec_dir."""
    files = _with_overrides(sorted(spec_dir.glob("*.json")), OVERRIDES)
    files += _with_overrides(sorted((spec_dir / "coordinator").glob("*.json")), OVERRIDES / "coordinator")
    out = [
        "# Generated by tools/gen_protocol.py from Apache Kafka 3.9 message specs and tools/spec_overrides/",
        "# (clients/src/main/resources/common/message, Apache License 2.0, Copyright The Apache Software Foundation).",
        "# Do not edit: run `python tools/gen_protocol.py` instead.",
        "# ruff: noqa",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass, field",
        "from typing import Any, ClassVar",
        "",
        "from kbroker.protocol.fieldspec import INHERIT, NEW_STRUCT, ZERO_UUID, FieldSpec",
        "",
        "",
    ]
    names = []
    for path in files:
        spec = json.loads(strip_comments(path.read_text()))
        emit_message(out, spec)
        out.append("")
        names.append((spec["name"], spec["type"], spec.get("apiKey")))
    out.append("MESSAGES: dict[str, type] = {")
    for n, _, _ in names:
        out.append(f"    {n!r}: {n},")
    out.append("}")
    out.append("")
    return "\n".join(out) + "\n"


def _with_overrides(files: list[Path], override_dir: Path) -> list[Path]:
    """The spec files with overrides swapped in by file name; overrides naming a new message come last, sorted."""
    overrides = {p.name: p for p in override_dir.glob("*.json")}
    names = {f.name for f in files}
    return [overrides.get(f.name, f) for f in files] + [
        overrides[n] for n in sorted(overrides) if n not in names
    ]


def main() -> None:
    spec_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SPECS
    text = render(spec_dir)
    OUT.write_text(text)
    print(f"wrote {OUT} ({text.count(chr(10))} lines)")


if __name__ == "__main__":
    main()

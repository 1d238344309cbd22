"""Table-driven codec for the generated message classes.

For each (struct class, version) the codec writes a small Python function from the schema facts
in protocol/messages.py and compiles it once, the way kmsg/Kafka generate code per version, so
decoding and encoding run straight-line code with no per-field interpretation.

When protocol/_codec.c is built (setup.py), the same schema facts become a compiled Plan per (class, version)
instead, which decodes and encodes 3-5x faster (every request pays for its header, body and response); the
Python functions stay the reference (tests/protocol/test_codec_compiled.py compares the two) and the fallback.
KBROKER_PURE_PYTHON=1 selects them although the C codec is built.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from kbroker.protocol import accelerators
from kbroker.protocol import primitives as p
from kbroker.protocol.fieldspec import INHERIT, NEW_STRUCT, FieldSpec
from kbroker.protocol.messages import MESSAGES, RequestHeader, ResponseHeader

DecodeError = p.DecodeError


_compiled = accelerators.load("_codec")
if _compiled is not None:
    _compiled.configure(DecodeError)
COMPILED = _compiled is not None
IMPLEMENTATION = accelerators.describe("_codec", _compiled)

_FIXED = {
    "bool": ("?", 1),
    "int8": ("b", 1),
    "int16": ("h", 2),
    "uint16": ("H", 2),
    "int32": ("i", 4),
    "int64": ("q", 8),
    "float64": ("d", 8),
    "uuid": ("16s", 16),
}
# Smallest encoding of one array element, used to bound array counts against the frame size.
_MIN_SIZE = {"string": 1, "bytes": 1, "records": 1}

Decoder = Callable[[Any, int], tuple[Any, int]]
Encoder = Callable[[Any, bytearray, "list[tuple[int, Any]] | None"], None]

_decoders: dict[tuple[type, int], Decoder] = {}
_encoders: dict[tuple[type, int], Encoder] = {}
_py_decoders: dict[tuple[type, int], Decoder] = {}
_py_encoders: dict[tuple[type, int], Encoder] = {}


def _owner_of(cls: type) -> type:
    """The message class that holds `cls` (inner struct classes are named Message.Struct)."""
    top = cls.__qualname__.split(".")[0]
    return MESSAGES[top]


def _flexible(cls: type, version: int) -> bool:
    owner = _owner_of(cls)
    rng = owner.FLEXIBLE_VERSIONS  # type: ignore[attr-defined]
    return rng is not None and rng[0] <= version <= rng[1]


def _field_compact(f: FieldSpec, flexible: bool, version: int) -> bool:
    if f.flexible_versions == INHERIT:
        return flexible
    rng = f.flexible_versions
    return rng is not None and rng[0] <= version <= rng[1]  # type: ignore[index,operator]


def _struct_class(cls: type, type_name: str) -> type:
    owner = _owner_of(cls)
    return getattr(owner, type_name.removeprefix("[]"))  # type: ignore[no-any-return]


_struct_defaults: dict[type, Any] = {}


def tagged_default(struct_cls: type) -> Any:
    """The one instance of struct_cls at its defaults that the encoders compare a tagged struct field against.
    A field holding this very object is known to be at its default without calling the dataclass's __eq__ (three
    Python calls per partition of a Fetch response otherwise), so a hot path may put it in place of the fresh one
    the constructor would build. Shared: never edit it, assign another object instead."""
    found = _struct_defaults.get(struct_cls)
    if found is None:
        found = _struct_defaults[struct_cls] = struct_cls()
    return found


def _default_src(f: FieldSpec, cls: type, env: dict[str, Any]) -> str:
    if f.default is NEW_STRUCT:
        key = f"_cls_{f.attr}"
        env[key] = _struct_class(cls, f.type)
        return f"{key}()"
    if isinstance(f.default, list):
        return "[]"
    key = f"_def_{f.attr}"
    env[key] = f.default
    return key


def _min_item_size(cls: type, elem: str) -> int:
    if elem in _FIXED:
        return _FIXED[elem][1]
    if elem in _MIN_SIZE:
        return _MIN_SIZE[elem]
    return 1  # a struct needs at least its tagged-field count or one field byte


def _fixed_run(fields: tuple[FieldSpec, ...], i: int, version: int, flexible: bool) -> tuple[list[FieldSpec], int]:
    """The fixed-width fields on the wire from fields[i] on, packed or unpacked with one struct call."""
    run = [fields[i]]
    j = i + 1
    while j < len(fields):
        g = fields[j]
        if g.type not in _FIXED or not g.in_versions(version) or (flexible and g.tagged_in(version)):
            break
        run.append(g)
        j += 1
    return run, j


# ---------------------------------------------------------------- decoding


def _length_src(compact: bool, nullable: bool, classic: str, what: str, ind: str) -> list[str]:
    """Lines that read a length or count prefix into `_n` (primitives._read_length, inlined: the decoders are
    the per-request hot path, and a call per string costs more than the string)."""
    if compact:
        lines = [
            f"{ind}_n = buf[pos]",
            f"{ind}if _n < 0x80:",
            f"{ind}    pos += 1",
            f"{ind}else:",
            f"{ind}    _n, pos = _ru(buf, pos)",
            f"{ind}_n -= 1",
        ]
    else:
        size = 2 if classic == "_I16" else 4
        lines = [f"{ind}(_n,) = {classic}.unpack_from(buf, pos)", f"{ind}pos += {size}"]
    bad = "_n < -1" if nullable else "_n < 0"
    return lines + [
        f"{ind}if {bad}:",
        f"{ind}    raise DecodeError(f'invalid {what} length {{_n}}')",
    ]


def _decode_value_src(
    f: FieldSpec, cls: type, version: int, compact: bool, flexible: bool, target: str, env: dict[str, Any], ind: str
) -> list[str]:
    """Lines that decode one (non-fixed-grouped) field value into `target`, advancing `pos`."""
    t = f.type
    nullable = f.nullable_in(version)
    if t in _FIXED:
        fmt, size = _FIXED[t]
        key = f"_S_{f.attr}"
        env[key] = struct.Struct(">" + fmt)
        return [f"{ind}({target},) = {key}.unpack_from(buf, pos)", f"{ind}pos += {size}"]
    if t == "string":
        lines = _length_src(compact, nullable, "_I16", "string", ind)
        return lines + [
            f"{ind}if _n < 0:",
            f"{ind}    {target} = None",
            f"{ind}else:",
            # Kafka's generated readers refuse a string longer than an int16 could announce, compact or not.
            f"{ind}    if _n > {p.MAX_STRING_LENGTH}:",
            f"{ind}        raise DecodeError(f'string had invalid length {{_n}}')",
            f"{ind}    _e = pos + _n",
            f"{ind}    if _e > len(buf):",
            f"{ind}        raise DecodeError(f'string length {{_n}} exceeds the {{len(buf) - pos}} bytes left')",
            f"{ind}    try:",
            f"{ind}        {target} = str(buf[pos:_e], 'utf-8')",
            f"{ind}    except UnicodeDecodeError as _err:",
            f"{ind}        raise DecodeError(f'string is not valid UTF-8: {{_err}}') from None",
            f"{ind}    pos = _e",
        ]
    if t in ("bytes", "records"):
        # Records stay a zero-copy view of the frame; other bytes fields become bytes.
        value = "memoryview(buf)[pos:_e]" if t == "records" else "bytes(buf[pos:_e])"
        lines = _length_src(compact, nullable or t == "records", "_I32", "bytes", ind)
        return lines + [
            f"{ind}if _n < 0:",
            f"{ind}    {target} = None",
            f"{ind}else:",
            f"{ind}    _e = pos + _n",
            f"{ind}    if _e > len(buf):",
            f"{ind}        raise DecodeError(f'bytes length {{_n}} exceeds the {{len(buf) - pos}} bytes left')",
            f"{ind}    {target} = {value}",
            f"{ind}    pos = _e",
        ]
    if t.startswith("[]"):
        elem = t[2:]
        lines = _length_src(compact, nullable, "_I32", "array", ind) + [
            f"{ind}if _n * {_min_item_size(cls, elem)} > len(buf) - pos:",
            f"{ind}    raise DecodeError(f'array of {{_n}} items cannot fit in {{len(buf) - pos}} bytes')",
            f"{ind}if _n < 0:",
            f"{ind}    {target} = None",
            f"{ind}else:",
            f"{ind}    {target} = []",
            f"{ind}    _app = {target}.append",
            f"{ind}    for _ in range(_n):",
        ]
        ef = FieldSpec("e_" + f.attr, elem, f.versions, None, None, None, None, f.flexible_versions)
        lines += _decode_value_src(ef, cls, version, compact, flexible, "_x", env, ind + "        ")
        lines.append(f"{ind}        _app(_x)")
        return lines
    # a struct
    sub = _struct_class(cls, t)
    key = f"_dec_{sub.__name__}"
    env[key] = py_decoder(sub, version)
    if nullable:
        return [
            f"{ind}(_p,) = _I8.unpack_from(buf, pos)",
            f"{ind}pos += 1",
            f"{ind}if _p < 0:",
            f"{ind}    {target} = None",
            f"{ind}else:",
            f"{ind}    {target}, pos = {key}(buf, pos)",
        ]
    return [f"{ind}{target}, pos = {key}(buf, pos)"]


def _compile_decoder(cls: type, version: int) -> Decoder:
    flexible = _flexible(cls, version)
    fields: tuple[FieldSpec, ...] = cls.FIELDS  # type: ignore[attr-defined]
    env: dict[str, Any] = {
        "_ru": p.read_uvarint,
        "_I8": p.I8,
        "_I16": p.I16,
        "_I32": p.I32,
        "_cls": cls,
        "DecodeError": DecodeError,
    }
    lines = ["def _decode(buf, pos):"]
    values: list[str] = []
    tagged: list[FieldSpec] = []
    i = 0
    while i < len(fields):
        f = fields[i]
        var = f"v_{f.attr}"
        values.append(var)
        if flexible and f.tagged_in(version):
            tagged.append(f)
            lines.append(f"    {var} = {_default_src(f, cls, env)}")
            i += 1
            continue
        if not f.in_versions(version):
            lines.append(f"    {var} = {_default_src(f, cls, env)}")
            i += 1
            continue
        if f.type in _FIXED:
            group, j = _fixed_run(fields, i, version, flexible)
            key = f"_G{i}"
            env[key] = struct.Struct(">" + "".join(_FIXED[g.type][0] for g in group))
            names = [f"v_{g.attr}" for g in group]
            for g in group[1:]:
                values.append(f"v_{g.attr}")
            lines.append(f"    ({', '.join(names)},) = {key}.unpack_from(buf, pos)")
            lines.append(f"    pos += {env[key].size}")
            i = j
            continue
        compact = _field_compact(f, flexible, version)
        lines += _decode_value_src(f, cls, version, compact, flexible, var, env, "    ")
        i += 1
    if flexible:
        lines.append("    _nt, pos = _ru(buf, pos)")
        lines.append("    for _ in range(_nt):")
        lines.append("        _tag, pos = _ru(buf, pos)")
        lines.append("        _sz, pos = _ru(buf, pos)")
        lines.append("        _end = pos + _sz")
        lines.append("        if _end > len(buf):")
        lines.append("            raise DecodeError('tagged field runs past the end of the frame')")
        for k, f in enumerate(tagged):
            kw = "if" if k == 0 else "elif"
            lines.append(f"        {kw} _tag == {f.tag}:")
            lines += _decode_value_src(f, cls, version, True, True, f"v_{f.attr}", env, "            ")
            lines.append("            if pos != _end:")
            lines.append("                raise DecodeError('tagged field size does not match its value')")
        lines.append("        pos = _end")
    lines.append(f"    return _cls({', '.join(values)}), pos")
    src = "\n".join(lines)
    exec(compile(src, f"<decode {cls.__qualname__} v{version}>", "exec"), env)
    return env["_decode"]  # type: ignore[no-any-return]


def py_decoder(cls: type, version: int) -> Decoder:
    """The generated Python decoder: the reference of the compiled one, and the fallback without it."""
    key = (cls, version)
    fn = _py_decoders.get(key)
    if fn is None:
        fn = _py_decoders[key] = _compile_decoder(cls, version)
    return fn


def decoder(cls: type, version: int) -> Decoder:
    key = (cls, version)
    fn = _decoders.get(key)
    if fn is None:
        fn = _decoders[key] = plan(cls, version).decode if _compiled is not None else py_decoder(cls, version)
    return fn


# ---------------------------------------------------------------- encoding


def _write_length_src(compact: bool, classic: str, n: str, ind: str) -> list[str]:
    """Lines that write a length or count prefix (primitives._write_length, inlined)."""
    if compact:
        return [
            f"{ind}_l = {n} + 1",
            f"{ind}if _l < 0x80:",
            f"{ind}    out.append(_l)",
            f"{ind}else:",
            f"{ind}    _wu(out, _l)",
        ]
    return [f"{ind}out += {classic}.pack({n})"]


def _encode_value_src(
    f: FieldSpec, cls: type, version: int, compact: bool, src: str, env: dict[str, Any], ind: str
) -> list[str]:
    t = f.type
    nullable = f.nullable_in(version)
    if t in _FIXED:
        key = f"_S_{f.attr}"
        env[key] = struct.Struct(">" + _FIXED[t][0])
        return [f"{ind}out += {key}.pack({src})"]
    if t == "string":
        # primitives.write_string, inlined (per-request hot path); a null goes through it for its error.
        return [
            f"{ind}if {src} is None:",
            f"{ind}    _ws(out, None, {compact}, {nullable})",
            f"{ind}else:",
            f"{ind}    _d = {src}.encode()",
            *_write_length_src(compact, "_I16", "len(_d)", ind + "    "),
            f"{ind}    out += _d",
        ]
    if t == "bytes":
        return [f"{ind}_wb(out, {src}, {compact}, {nullable})"]
    if t == "records":
        return [f"{ind}_wr(out, ext, {src}, {compact})"]
    if t.startswith("[]"):
        elem = t[2:]
        ef = FieldSpec("e_" + f.attr, elem, f.versions, None, None, None, None, f.flexible_versions)
        # Encoding an item may run Python code that changes the list (__bool__ of a bool field...): a list whose
        # length no longer matches the count written is refused, as protocol/_codec.c does.
        arr, n = f"_a{len(ind)}", f"_c{len(ind)}"
        return [
            f"{ind}if {src} is None:",
            f"{ind}    _wa(out, None, {compact}, {nullable})",
            f"{ind}else:",
            f"{ind}    {arr} = {src}",
            f"{ind}    {n} = len({arr})",
            *_write_length_src(compact, "_I32", n, ind + "    "),
            f"{ind}    for _x in {arr}:",
            *_encode_value_src(ef, cls, version, compact, "_x", env, ind + "        "),
            f"{ind}    if len({arr}) != {n}:",
            f"{ind}        raise RuntimeError('array field changed size during encoding')",
        ]
    sub = _struct_class(cls, t)
    key = f"_enc_{sub.__name__}"
    env[key] = py_encoder(sub, version)
    if nullable:
        return [
            f"{ind}if {src} is None:",
            f"{ind}    out.append(0xff)",
            f"{ind}else:",
            f"{ind}    out.append(1)",
            f"{ind}    {key}({src}, out, ext)",
        ]
    return [f"{ind}{key}({src}, out, ext)"]


def _compile_encoder(cls: type, version: int) -> Encoder:
    flexible = _flexible(cls, version)
    fields: tuple[FieldSpec, ...] = cls.FIELDS  # type: ignore[attr-defined]
    env: dict[str, Any] = {
        "_ws": p.write_string,
        "_wb": p.write_bytes,
        "_wr": p.write_records,
        "_wa": p.write_array_len,
        "_wu": p.write_uvarint,
        "_I16": p.I16,
        "_I32": p.I32,
    }
    lines = ["def _encode(o, out, ext):"]
    tagged: list[FieldSpec] = []
    i = 0
    while i < len(fields):
        f = fields[i]
        if flexible and f.tagged_in(version):
            tagged.append(f)
            i += 1
            continue
        if not f.in_versions(version):
            i += 1
            continue
        if f.type in _FIXED:
            group, j = _fixed_run(fields, i, version, flexible)
            key = f"_G{i}"
            env[key] = struct.Struct(">" + "".join(_FIXED[g.type][0] for g in group))
            lines.append(f"    out += {key}.pack({', '.join('o.' + g.attr for g in group)})")
            i = j
            continue
        compact = _field_compact(f, flexible, version)
        lines += _encode_value_src(f, cls, version, compact, f"o.{f.attr}", env, "    ")
        i += 1
    if flexible:
        if not tagged:
            lines.append("    out.append(0)")
        else:
            lines.append("    _tags = []")
            for f in tagged:
                dkey = f"_tdef_{f.attr}"
                if f.default is NEW_STRUCT:
                    env[dkey] = tagged_default(_struct_class(cls, f.type))
                    cond = f"o.{f.attr} is not {dkey} and o.{f.attr} != {dkey}"
                else:
                    env[dkey] = [] if isinstance(f.default, list) else f.default
                    cond = f"o.{f.attr} != {dkey}"
                lines.append(f"    if {cond}:")
                lines.append("        _o, out = out, bytearray()")
                lines += _encode_value_src(f, cls, version, True, f"o.{f.attr}", env, "        ")
                lines.append(f"        _tags.append(({f.tag}, out))")
                lines.append("        out = _o")
            lines.append("    _wu(out, len(_tags))")
            lines.append("    for _t, _b in _tags:")
            lines.append("        _wu(out, _t)")
            lines.append("        _wu(out, len(_b))")
            lines.append("        out += _b")
    if len(lines) == 1:
        lines.append("    pass")
    src = "\n".join(lines)
    exec(compile(src, f"<encode {cls.__qualname__} v{version}>", "exec"), env)
    return env["_encode"]  # type: ignore[no-any-return]


def py_encoder(cls: type, version: int) -> Encoder:
    """The generated Python encoder: the reference of the compiled one, and the fallback without it."""
    key = (cls, version)
    fn = _py_encoders.get(key)
    if fn is None:
        fn = _py_encoders[key] = _compile_encoder(cls, version)
    return fn


def encoder(cls: type, version: int) -> Encoder:
    key = (cls, version)
    fn = _encoders.get(key)
    if fn is None:
        fn = _encoders[key] = plan(cls, version).encode if _compiled is not None else py_encoder(cls, version)
    return fn


# ---------------------------------------------------------------- the compiled codec (protocol/_codec.c)

# Op type codes of protocol/_codec.c
_C_TYPES = {"bool": 1, "int8": 2, "int16": 3, "uint16": 4, "int32": 5, "int64": 6, "float64": 7, "uuid": 8,
            "string": 9, "bytes": 10, "records": 11}
_C_ARRAY, _C_STRUCT = 12, 13
_plans: dict[tuple[type, int], Any] = {}


def _c_op(f: FieldSpec, cls: type, version: int, compact: bool, nullable: bool) -> tuple[Any, ...]:
    t = f.type
    if t in _C_TYPES:
        return (_C_TYPES[t], compact, nullable, 0, None, None)
    if t.startswith("[]"):
        elem = t[2:]
        ef = FieldSpec("e_" + f.attr, elem, f.versions, None, None, None, None, f.flexible_versions)
        return (_C_ARRAY, compact, nullable, _min_item_size(cls, elem), _c_op(ef, cls, version, compact, False), None)
    return (_C_STRUCT, compact, nullable, 0, None, plan(_struct_class(cls, t), version))


def _c_default(f: FieldSpec, cls: type) -> tuple[str, int, Any]:
    if f.default is NEW_STRUCT:
        return (f.attr, 2, _struct_class(cls, f.type))
    if isinstance(f.default, list):
        return (f.attr, 1, None)
    return (f.attr, 0, f.default)


def plan(cls: type, version: int) -> Any:
    """The compiled codec's Plan of `cls` at `version`: the same fields, defaults and tagged fields the Python
    decoder and encoder are generated from (requires protocol._codec)."""
    assert _compiled is not None
    key = (cls, version)
    found = _plans.get(key)
    if found is not None:
        return found
    flexible = _flexible(cls, version)
    fields: list[tuple[str, tuple[Any, ...]]] = []
    defaults: list[tuple[str, int, Any]] = []
    tagged: list[tuple[int, str, tuple[Any, ...], Any]] = []
    for f in cls.FIELDS:  # type: ignore[attr-defined]
        if flexible and f.tagged_in(version):
            defaults.append(_c_default(f, cls))
            if f.default is NEW_STRUCT:
                dflt = tagged_default(_struct_class(cls, f.type))  # compared by identity first
            else:
                dflt = [] if isinstance(f.default, list) else f.default
            tagged.append((f.tag, f.attr, _c_op(f, cls, version, True, f.nullable_in(version)), dflt))
        elif not f.in_versions(version):
            defaults.append(_c_default(f, cls))
        else:
            fields.append((f.attr, _c_op(f, cls, version, _field_compact(f, flexible, version), f.nullable_in(version))))
    found = _plans[key] = _compiled.Plan(cls, f"{cls.__qualname__} v{version}", flexible, tuple(fields),
                                         tuple(defaults), tuple(tagged))
    return found


# ---------------------------------------------------------------- public API


def decode(cls: type, version: int, buf: Any, pos: int = 0) -> tuple[Any, int]:
    """Decode one `cls` at `version` from buf[pos:]; truncation and bad lengths raise DecodeError."""
    try:
        return decoder(cls, version)(buf, pos)
    except struct.error as e:
        raise DecodeError(f"{cls.__qualname__} v{version}: truncated ({e})") from None
    except (IndexError, OverflowError, MemoryError) as e:
        raise DecodeError(f"{cls.__qualname__} v{version}: {e}") from None


def encode(obj: Any, version: int, out: bytearray | None = None, ext: list[tuple[int, Any]] | None = None) -> bytearray:
    if out is None:
        out = bytearray()
    encoder(type(obj), version)(obj, out, ext)
    return out


REQUESTS: dict[int, type] = {}
RESPONSES: dict[int, type] = {}
for _cls in MESSAGES.values():
    _key = getattr(_cls, "API_KEY", None)
    if _key is None:
        continue
    if _cls.KIND == "request":  # type: ignore[attr-defined]
        REQUESTS[_key] = _cls
    elif _cls.KIND == "response":  # type: ignore[attr-defined]
        RESPONSES[_key] = _cls

API_VERSIONS_KEY = 18


def is_flexible(api_key: int, version: int) -> bool:
    rng = REQUESTS[api_key].FLEXIBLE_VERSIONS  # type: ignore[attr-defined]
    return rng is not None and rng[0] <= version <= rng[1]


def request_header_version(api_key: int, version: int) -> int:
    if api_key == 7 and version == 0:  # ControlledShutdown v0 predates the client id
        return 0
    return 2 if is_flexible(api_key, version) else 1


def response_header_version(api_key: int, version: int) -> int:
    # ApiVersionsResponse keeps header v0 so that a client can always parse the answer.
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if is_flexible(api_key, version) else 0


_KEY_AND_VERSION = struct.Struct(">hh")
# (api key, version) -> the request header's decoder; filled for known keys and sane versions only, so a hostile
# client cannot grow it.
_header_decoders: dict[tuple[int, int], Decoder] = {}


def decode_request_header(buf: Any) -> tuple[RequestHeader, int]:
    """Decode the request header; the header version follows from the API key and version."""
    if len(buf) < 8:
        raise DecodeError("request shorter than a request header")
    key = _KEY_AND_VERSION.unpack_from(buf, 0)
    dec = _header_decoders.get(key)
    if dec is None:
        api_key, api_version = key
        hv = request_header_version(api_key, api_version) if api_key in REQUESTS else 1
        dec = decoder(RequestHeader, hv)
        if api_key in REQUESTS and 0 <= api_version < 64:
            _header_decoders[key] = dec
    try:
        return dec(buf, 0)  # type: ignore[no-any-return]
    except struct.error as e:
        raise DecodeError(f"RequestHeader: truncated ({e})") from None
    except (IndexError, OverflowError, MemoryError) as e:
        raise DecodeError(f"RequestHeader: {e}") from None


_SIZE_AND_CORRELATION = struct.Struct(">ii")
# (api key, version, body class) -> (response header is v1, body encoder)
_response_encoders: dict[tuple[int, int, type], tuple[bool, Encoder]] = {}


def encode_response(correlation_id: int, api_key: int, version: int, body: Any,
                    ext: list[tuple[int, Any]] | None = None) -> bytearray:
    """Size-prefixed response frame: int32 size, response header, body."""
    key = (api_key, version, type(body))
    found = _response_encoders.get(key)
    if found is None:
        found = _response_encoders[key] = (response_header_version(api_key, version) == 1,
                                           encoder(type(body), version))
    header_v1, enc = found
    out = bytearray(_SIZE_AND_CORRELATION.pack(0, correlation_id))
    if header_v1:
        out.append(0)
    enc(body, out, ext)
    size = len(out) - 4
    if ext:
        size += sum(region.size for _, region in ext)
    p.I32.pack_into(out, 0, size)
    return out


def encode_request(header: RequestHeader, body: Any) -> bytearray:
    """Size-prefixed request frame (used by tests and by the broker's own client paths)."""
    out = bytearray(4)
    hv = request_header_version(header.request_api_key, header.request_api_version)
    encoder(RequestHeader, hv)(header, out, None)
    encoder(type(body), header.request_api_version)(body, out, None)
    p.I32.pack_into(out, 0, len(out) - 4)
    return out


def decode_response(api_key: int, version: int, frame: Any) -> tuple[int, Any]:
    """Decode a response frame without its size prefix; returns (correlation_id, body)."""
    hv = response_header_version(api_key, version)
    header, pos = decode(ResponseHeader, hv, frame, 0)
    body, _ = decode(RESPONSES[api_key], version, frame, pos)
    return header.correlation_id, body

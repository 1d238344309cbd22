"""Wire primitives of the Kafka protocol: big-endian integers, varints, strings, bytes.

Readers take (buf, pos) and return (value, new_pos); they bound every length by the buffer
before slicing, so a hostile length prefix never causes a large allocation.
Writers append to a bytearray.
"""

from __future__ import annotations

import struct
from typing import Any

I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
U16 = struct.Struct(">H")
I32 = struct.Struct(">i")
U32 = struct.Struct(">I")
I64 = struct.Struct(">q")
F64 = struct.Struct(">d")

Buffer = bytes | bytearray | memoryview

# The longest string Kafka's generated readers take (0x7fff), compact strings included although their varint
# length could announce more.
MAX_STRING_LENGTH = 0x7FFF


class DecodeError(ValueError):
    """The bytes on the wire do not form a valid message for the declared API version."""


def read_uvarint(buf: Buffer, pos: int, max_shift: int = 28) -> tuple[int, int]:
    """Unsigned varint; max_shift 28 allows the protocol's 5 bytes (int32), 63 the records' 10 (int64)."""
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > max_shift:
            raise DecodeError(f"varint longer than {max_shift // 7 + 1} bytes")


def write_uvarint(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"unsigned varint cannot hold {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def uvarint_size(value: int) -> int:
    n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


def _take(buf: Buffer, pos: int, n: int, what: str) -> int:
    end = pos + n
    if n < 0 or end > len(buf):
        raise DecodeError(f"{what} length {n} exceeds the {len(buf) - pos} bytes left")
    return end


def _read_length(buf: Buffer, pos: int, compact: bool, classic: struct.Struct, nullable: bool,
                 what: str) -> tuple[int, int]:
    """A length or count prefix: unsigned varint of n+1 when compact, else a signed int16/int32.
    -1 (null) is returned only where the field is nullable; any other negative value is an error."""
    if compact:
        n, pos = read_uvarint(buf, pos)
        n -= 1
    else:
        (n,) = classic.unpack_from(buf, pos)
        pos += classic.size
    if n < 0 and not (n == -1 and nullable):
        raise DecodeError(f"invalid {what} length {n}")
    return n, pos


def read_string(buf: Buffer, pos: int, compact: bool, nullable: bool) -> tuple[str | None, int]:
    n, pos = _read_length(buf, pos, compact, I16, nullable, "string")
    if n < 0:
        return None, pos
    if n > MAX_STRING_LENGTH:
        raise DecodeError(f"string had invalid length {n}")
    end = _take(buf, pos, n, "string")
    try:
        return str(buf[pos:end], "utf-8"), end
    except UnicodeDecodeError as e:
        raise DecodeError(f"string is not valid UTF-8: {e}") from None


def read_bytes(buf: Buffer, pos: int, compact: bool, nullable: bool) -> tuple[bytes | None, int]:
    view, pos = read_bytes_view(buf, pos, compact, nullable)
    return (None if view is None else bytes(view)), pos


def read_bytes_view(buf: Buffer, pos: int, compact: bool, nullable: bool) -> tuple[memoryview | None, int]:
    """Like read_bytes but returns a zero-copy view: record sets are kept as slices of the frame."""
    n, pos = _read_length(buf, pos, compact, I32, nullable, "bytes")
    if n < 0:
        return None, pos
    end = _take(buf, pos, n, "bytes")
    return memoryview(buf)[pos:end], end


def read_array_len(buf: Buffer, pos: int, compact: bool, nullable: bool, min_item_size: int) -> tuple[int, int]:
    """Array count (-1: null), bounded by what the remaining bytes could possibly hold."""
    n, pos = _read_length(buf, pos, compact, I32, nullable, "array")
    if n * min_item_size > len(buf) - pos:
        raise DecodeError(f"array of {n} items cannot fit in {len(buf) - pos} bytes")
    return n, pos


def write_string(out: bytearray, value: str | None, compact: bool, nullable: bool) -> None:
    if value is None:
        _write_null(out, compact, I16, "string", nullable)
        return
    data = value.encode()
    _write_length(out, len(data), compact, I16)
    out += data


def _write_null(out: bytearray, compact: bool, classic: struct.Struct, what: str, nullable: bool) -> None:
    if not nullable:
        raise ValueError(f"null {what} in a non-nullable field")
    if compact:
        out.append(0)
    else:
        out += classic.pack(-1)


def _write_length(out: bytearray, n: int, compact: bool, classic: struct.Struct) -> None:
    """A length or count prefix: unsigned varint of n+1 when compact, else a signed int16/int32."""
    if compact:
        write_uvarint(out, n + 1)
    else:
        out += classic.pack(n)


def write_bytes(out: bytearray, value: Buffer | None, compact: bool, nullable: bool) -> None:
    if value is None:
        _write_null(out, compact, I32, "bytes", nullable)
        return
    _write_length(out, len(value), compact, I32)
    out += value


def write_records(out: bytearray, ext: list[tuple[int, Any]] | None, value: Any, compact: bool) -> None:
    """Records are bytes, or a file region (an object with `size`) that is sent with sendfile.

    A file region is not copied: its length prefix is written and (offset in out, region) is
    appended to `ext`, so the sender can splice the file bytes in at that point.
    """
    if value is None or isinstance(value, bytes | bytearray | memoryview):
        write_bytes(out, value, compact, True)
        return
    _write_length(out, value.size, compact, I32)
    if ext is None:
        out += value.read_bytes()
    else:
        ext.append((len(out), value))


def write_array_len(out: bytearray, value: list[Any] | None, compact: bool, nullable: bool) -> None:
    if value is None:
        _write_null(out, compact, I32, "array", nullable)
        return
    _write_length(out, len(value), compact, I32)

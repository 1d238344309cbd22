"""Message formats v0 and v1 (magic 0 and 1, Kafka 0.8-0.10) and their conversions to and from record batch v2.

The log stores record batch v2 only. Old producers (Produce v0-v2) send legacy message sets, which are converted
to one v2 batch on append (Kafka's LogValidator with toMagic 2); old consumers (Fetch v0-v3) get the log's batches
down-converted to their format (Kafka's RecordsUtil.downConvert / LazyDownConversionRecords).

A legacy message on the wire (one "shallow entry"):

    offset int64 | size int32 | crc uint32 | magic int8 | attributes int8 | [timestamp int64, v1] | key bytes | value bytes

The CRC-32 covers magic to the end. Attributes: bits 0-2 the codec, bit 3 (v1) LogAppendTime. A compressed
entry (a "wrapper") carries an inner message set as its compressed value; its offset is the absolute offset of the
last inner message. Inner offsets are absolute in v0 and relative (0, 1, ...) in v1. zstd does not exist below
magic 2. Everything here is pure and synchronous.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import lz4.block
import lz4.frame
from kbroker.protocol.records import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    BATCH_HEADER_SIZE,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    DEFAULT_MAX_DECOMPRESSED,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Buffer,
    CorruptRecordError,
    InvalidRecordError,
    Record,
    RecordError,
    RecordValidationError,
    build_batch,
    compress,
    decode_records,
    decompress,
    parse_batch_header,
)

__all__ = [
    "MAGIC_V0",
    "MAGIC_V1",
    "RECORD_OVERHEAD_V0",
    "RECORD_OVERHEAD_V1",
    "LegacyMessage",
    "MessageTooLargeError",
    "ShallowEntry",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "UnsupportedCompressionTypeError",
    "build_message_set",
    "convert_produced_set",
    "down_convert",
    "first_magic",
    "read_message_set",
    "scan_shallow_entries",
    "to_record_batch",
]

MAGIC_V0 = 0
MAGIC_V1 = 1
UNSUPPORTED_COMPRESSION_TYPE = 76

_OFFSET_SIZE = struct.Struct(">qi")
_CRC = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# crc, magic, attributes, key length, value length (+ timestamp in v1)
RECORD_OVERHEAD_V0 = 4 + 1 + 1 + 4 + 4
RECORD_OVERHEAD_V1 = RECORD_OVERHEAD_V0 + 8
_MAGIC_POS = LOG_OVERHEAD + 4  # the magic byte follows the offset, the size and the CRC


class MessageTooLargeError(ValueError):
    """A produced message (or compressed wrapper) larger than max.message.bytes (Kafka's RecordTooLargeException)."""

    error_code = 10  # MESSAGE_TOO_LARGE


class UnsupportedCompressionTypeError(ValueError):
    """Data an old client cannot be given: zstd below magic 2 (Kafka's UnsupportedCompressionTypeException)."""

    error_code = UNSUPPORTED_COMPRESSION_TYPE


@dataclass(slots=True)
class LegacyMessage:
    offset: int
    magic: int
    attributes: int
    timestamp: int  # NO_TIMESTAMP for magic 0
    key: bytes | None
    value: bytes | None

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        if self.magic > MAGIC_V0 and self.attributes & ATTR_TIMESTAMP_TYPE:
            return TIMESTAMP_LOG_APPEND_TIME
        return TIMESTAMP_CREATE_TIME


@dataclass(frozen=True, slots=True)
class ShallowEntry:
    """One message as it sits in a set: a plain message, or a wrapper of a compressed inner set."""

    position: int
    size: int  # LOG_OVERHEAD included
    magic: int
    attributes: int

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK


def first_magic(buf: Buffer) -> int:
    """The magic of the first entry of a record set (-1 when too short to say): legacy sets and v2 batches share
    the offset and size prefix, and both keep the magic at byte 16."""
    return buf[_MAGIC_POS] if len(buf) > _MAGIC_POS else -1


# ----------------------------------------------------------------------------------------------
# parsing


def _parse_message(view: memoryview, pos: int, size: int, offset: int, *, check_crc: bool = True) -> LegacyMessage:
    """The message whose CRC field starts at pos and whose body (CRC included) is size bytes."""
    end = pos + size
    if check_crc:
        crc = _CRC.unpack_from(view, pos)[0]
        computed = zlib.crc32(view[pos + 4 : end])
        if computed != crc:
            raise CorruptRecordError(f"Record is corrupt (stored crc = {crc}, computed crc = {computed})")
    magic = view[pos + 4]
    if magic not in (MAGIC_V0, MAGIC_V1):
        raise CorruptRecordError(f"Invalid magic {magic} of a legacy message")
    if size < (RECORD_OVERHEAD_V1 if magic else RECORD_OVERHEAD_V0):
        raise CorruptRecordError(f"Record size {size} is less than the minimum record overhead of magic {magic}")
    attributes = view[pos + 5]
    p = pos + 6
    timestamp = NO_TIMESTAMP
    if magic == MAGIC_V1:
        timestamp = _I64.unpack_from(view, p)[0]
        p += 8
    key, p = _read_bytes(view, p, end)
    value, p = _read_bytes(view, p, end)
    if p != end:
        raise CorruptRecordError(f"Record of size {size} has {end - p} trailing bytes")
    return LegacyMessage(offset, magic, attributes, timestamp, key, value)


def _read_bytes(view: memoryview, p: int, end: int) -> tuple[bytes | None, int]:
    if p + 4 > end:
        raise CorruptRecordError("Record is truncated")
    n = _I32.unpack_from(view, p)[0]
    p += 4
    if n < 0:
        return None, p
    if p + n > end:
        raise CorruptRecordError(f"Record claims {n} bytes of key or value past its end")
    return bytes(view[p : p + n]), p + n


def _iter_entries(view: memoryview, *, partial_ok: bool) -> Iterator[tuple[int, int, int]]:
    """(position, size including LOG_OVERHEAD, offset) of each entry; a trailing partial entry ends the set when
    partial_ok (fetched data is cut anywhere), else it is corrupt."""
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < LOG_OVERHEAD:
            if partial_ok:
                return
            raise CorruptRecordError(f"Truncated message at position {pos}: {end - pos} bytes left")
        offset, size = _OFFSET_SIZE.unpack_from(view, pos)
        if size < RECORD_OVERHEAD_V0:
            raise CorruptRecordError(f"Record size {size} is less than the minimum record overhead "
                                     f"({RECORD_OVERHEAD_V0})")
        if pos + LOG_OVERHEAD + size > end:
            if partial_ok:
                return
            raise CorruptRecordError(f"Message at position {pos} claims {size} bytes but only "
                                     f"{end - pos - LOG_OVERHEAD} remain")
        yield pos, LOG_OVERHEAD + size, offset
        pos += LOG_OVERHEAD + size


def scan_shallow_entries(buf: Buffer) -> list[ShallowEntry]:
    """The entries of a produced legacy set, framing and CRC checked (Kafka's analyzeAndValidateRecords): the
    caller checks each against max.message.bytes before anything is inflated."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if len(view) == 0:
        raise InvalidRecordError("record set is empty")
    entries: list[ShallowEntry] = []
    for pos, size, _offset in _iter_entries(view, partial_ok=False):
        start = pos + LOG_OVERHEAD
        magic = view[start + 4]
        if magic > 2:
            raise CorruptRecordError(f"Invalid magic {magic} in a legacy message set")
        if magic == 2 or (entries and magic != entries[0].magic):
            # Kafka's LogValidator.validateBatch: every batch of a request has the first one's magic.
            first = entries[0].magic if entries else MAGIC_V1
            raise InvalidRecordError(f"Batch magic {magic} is not the same as the first batch's magic byte {first}")
        crc = _CRC.unpack_from(view, start)[0]
        computed = zlib.crc32(view[start + 4 : pos + size])
        if computed != crc:
            raise CorruptRecordError(f"Record is corrupt (stored crc = {crc}, computed crc = {computed})")
        entries.append(ShallowEntry(pos, size, magic, view[start + 5]))
    return entries


def _inner_messages(view: memoryview, wrapper: LegacyMessage, max_decompressed: int) -> list[LegacyMessage]:
    codec = wrapper.compression
    if codec == COMPRESSION_ZSTD:
        # Kafka's legacy DeepRecordsIterator: zstd never existed below magic 2.
        raise InvalidRecordError(f"Invalid wrapper compressionType found in legacy deep record iterator "
                                 f"{wrapper.magic}")
    if codec > COMPRESSION_ZSTD:
        raise InvalidRecordError(f"Unknown compression type id {codec}")
    if wrapper.value is None:
        raise InvalidRecordError(f"Found invalid compressed record set with null value (magic = {wrapper.magic})")
    if codec == COMPRESSION_LZ4:
        data = decompress_lz4_legacy(wrapper.value, wrapper.magic, max_decompressed)
    else:
        data = decompress(codec, wrapper.value, max_decompressed)
    inner_view = memoryview(data)
    inner = [_parse_message(inner_view, pos + LOG_OVERHEAD, size - LOG_OVERHEAD, offset)
             for pos, size, offset in _iter_entries(inner_view, partial_ok=False)]
    if not inner:
        raise InvalidRecordError("Compressed message set is empty")
    return inner


def read_message_set(buf: Buffer, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> list[LegacyMessage]:
    """Every message of a legacy set with absolute offsets, as a consumer reads a fetched set: wrappers are opened
    (v1 inner offsets made absolute from the wrapper's), inner messages of a LogAppendTime wrapper take its
    timestamp, and a trailing partial message is dropped."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    out: list[LegacyMessage] = []
    for pos, size, offset in _iter_entries(view, partial_ok=True):
        msg = _parse_message(view, pos + LOG_OVERHEAD, size - LOG_OVERHEAD, offset)
        if msg.compression == COMPRESSION_NONE:
            out.append(msg)
            continue
        inner = _inner_messages(view, msg, max_decompressed)
        if msg.magic == MAGIC_V1:
            last_relative = inner[-1].offset
            for m in inner:
                m.offset = msg.offset - last_relative + m.offset
                if msg.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
                    m.timestamp = msg.timestamp
                    m.attributes |= ATTR_TIMESTAMP_TYPE
        out.extend(inner)
    return out


# ----------------------------------------------------------------------------------------------
# produce: legacy set -> one record batch v2


def to_record_batch(buf: Buffer, entries: list[ShallowEntry], *,
                    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """One v2 batch (base offset 0, offsets assigned by the log) holding every message of a produced legacy set,
    validated as Kafka's LogValidator does on the way to magic 2.

    Timestamps: a v1 message's CreateTime is kept, v0 messages get NO_TIMESTAMP (the log then stamps
    LogAppendTime when the topic says so). The batch is compressed with the producer's codec; the log recompresses
    it when the topic's compression.type names another. Refusals: CorruptRecordError (CORRUPT_MESSAGE) for bad
    CRCs and framing, InvalidRecordError (INVALID_RECORD) for several wrappers in one set, nested compression,
    mismatched magics or zstd, and RecordValidationError (INVALID_TIMESTAMP) naming each message that claims
    LogAppendTime.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    codec = COMPRESSION_NONE
    messages: list[LegacyMessage] = []
    # LogAppendTime claimed by the producer, per message index (Kafka's validateTimestamp looks at the "batch",
    # i.e. the message itself or its wrapper).
    claimed_log_append: list[bool] = []
    errors: list[RecordError] = []
    for entry in entries:
        # The CRC was checked by scan_shallow_entries.
        msg = _parse_message(view, entry.position + LOG_OVERHEAD, entry.size - LOG_OVERHEAD, 0, check_crc=False)
        if msg.compression == COMPRESSION_NONE:
            messages.append(msg)
            claimed_log_append.append(msg.timestamp_type == TIMESTAMP_LOG_APPEND_TIME)
            continue
        if len(entries) > 1:
            raise InvalidRecordError("Compressed outer record has more than one batch")
        codec = msg.compression
        for i, inner in enumerate(_inner_messages(view, msg, max_decompressed)):
            if inner.compression != COMPRESSION_NONE:
                errors.append(RecordError(i, "Compressed outer record should not have an inner record with a "
                                             "compression attribute set"))
            elif inner.magic != msg.magic:
                errors.append(RecordError(i, f"Record's magic {inner.magic} does not match outer magic "
                                             f"{msg.magic}"))
            messages.append(inner)
            claimed_log_append.append(msg.timestamp_type == TIMESTAMP_LOG_APPEND_TIME)
    if errors:
        shown = ", ".join(str(e) for e in errors[:3])
        raise RecordValidationError(InvalidRecordError.error_code,
                                    f"One or more records have been rejected due to {len(errors)} record errors in "
                                    f"total, and only showing the first three errors at most: [{shown}]", errors)
    refused = [RecordError(i, f"Invalid timestamp type in message with offset {i}. Producer should not set "
                              f"timestamp type to LogAppendTime.")
               for i, claimed in enumerate(claimed_log_append) if claimed]
    if refused:
        raise RecordValidationError(32, "One or more records have been rejected due to invalid timestamp", refused)
    return build_batch([(m.key, m.value, (), m.timestamp) for m in messages], compression=codec)


def convert_produced_set(buf: Buffer, *, max_message_bytes: int,
                         max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """A produced magic 0/1 set as the one v2 batch the log stores (to_record_batch); each message or wrapper as
    sent must fit max_message_bytes first, as Kafka checks every shallow entry before it converts."""
    entries = scan_shallow_entries(buf)
    for entry in entries:
        if entry.size > max_message_bytes:
            raise MessageTooLargeError(f"The message at position {entry.position} is {entry.size} bytes, larger "
                                       f"than max.message.bytes {max_message_bytes}")
    return to_record_batch(buf, entries, max_decompressed=max_decompressed)


# ----------------------------------------------------------------------------------------------
# fetch: record batches v2 -> legacy set


def down_convert(buf: Buffer, to_magic: int, first_offset: int, max_bytes: int, *, whole_first: bool = True,
                 max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """The v2 batches of buf (as read from the log) as a magic 0 or 1 message set for an old consumer.

    As Kafka's RecordsUtil.downConvert: control batches are dropped, headers too, records before first_offset are
    skipped, offsets are kept, an uncompressed batch becomes plain messages and a compressed one one wrapper of the
    same codec (zstd cannot be: UnsupportedCompressionTypeError). The result is cut to max_bytes, never below the
    first converted batch when whole_first: a message cut at the end is what old consumers expect from a
    size-bounded fetch.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    out = bytearray()
    pos = 0
    end = len(view)
    while end - pos >= BATCH_HEADER_SIZE:
        h = parse_batch_header(view, pos)
        size = h.size_in_bytes
        if pos + size > end:
            break
        if not h.attributes & ATTR_CONTROL and h.last_offset >= first_offset:
            if h.compression == COMPRESSION_ZSTD:
                raise UnsupportedCompressionTypeError(
                    f"Down-conversion of zstandard-compressed batches is not supported (offset {h.base_offset})")
            records = [r for r in decode_records(view, pos, max_size=max_decompressed) if r.offset >= first_offset]
            if records:
                log_append_time = h.max_timestamp if h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME else None
                converted = build_message_set(records, magic=to_magic, compression=h.compression,
                                              log_append_time=log_append_time)
                if (out or not whole_first) and len(out) + len(converted) > max_bytes:
                    out += converted[: max_bytes - len(out)]
                    break
                out += converted
                if len(out) >= max_bytes:
                    break
        pos += size
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# building


def _encode_message(out: bytearray, offset: int, magic: int, attributes: int, timestamp: int,
                    key: bytes | None, value: bytes | None) -> None:
    start = len(out)
    out += _OFFSET_SIZE.pack(offset, 0)
    out += b"\0\0\0\0"  # crc, filled below
    out.append(magic)
    out.append(attributes)
    if magic > MAGIC_V0:
        out += _I64.pack(timestamp)
    for field in (key, value):
        if field is None:
            out += _I32.pack(-1)
        else:
            out += _I32.pack(len(field))
            out += field
    _I32.pack_into(out, start + 8, len(out) - start - LOG_OVERHEAD)
    _CRC.pack_into(out, start + LOG_OVERHEAD, zlib.crc32(memoryview(out)[start + LOG_OVERHEAD + 4 :]))


def build_message_set(records: list[Record], *, magic: int, compression: int = COMPRESSION_NONE,
                      log_append_time: int | None = None) -> bytes:
    """A magic 0/1 message set of records (offsets kept): plain messages, or one wrapper when compressed (inner
    offsets absolute in v0, relative to the first record in v1; the wrapper's offset is the last record's).

    log_append_time stamps every message (and the wrapper) with that time and the LogAppendTime bit (v1).
    Magic 0 sets lose their timestamps. Headers cannot be carried and are dropped.
    """
    if magic not in (MAGIC_V0, MAGIC_V1):
        raise ValueError(f"not a legacy magic: {magic}")
    if compression == COMPRESSION_ZSTD:
        raise UnsupportedCompressionTypeError(f"zstd is not supported for magic {magic}")
    ts_attr = ATTR_TIMESTAMP_TYPE if magic > MAGIC_V0 and log_append_time is not None else 0

    def timestamp_of(r: Record) -> int:
        if magic == MAGIC_V0:
            return NO_TIMESTAMP
        return log_append_time if log_append_time is not None else r.timestamp

    if compression == COMPRESSION_NONE:
        out = bytearray()
        for r in records:
            _encode_message(out, r.offset, magic, ts_attr, timestamp_of(r), r.key, r.value)
        return bytes(out)
    if not records:
        return b""
    inner = bytearray()
    base = records[0].offset
    for r in records:
        _encode_message(inner, r.offset - base if magic > MAGIC_V0 else r.offset, magic, ts_attr, timestamp_of(r),
                        r.key, r.value)
    if compression == COMPRESSION_LZ4:
        payload = compress_lz4_legacy(bytes(inner), magic)
    else:
        payload = compress(compression, inner)
    wrapper_ts = max((timestamp_of(r) for r in records), default=NO_TIMESTAMP)
    out = bytearray()
    _encode_message(out, records[-1].offset, magic, ts_attr | compression, wrapper_ts, None, payload)
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# LZ4 as Kafka frames it below magic 2


_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_FLG_CONTENT_SIZE = 0x08
_LZ4_FLG_DICT_ID = 0x01
# FLG: version 01, independent blocks; BD: 64 KB blocks. Kafka's KafkaLZ4BlockOutputStream writes no content size
# and no checksums.
_KAFKA_LZ4_FLG = 0x60
_KAFKA_LZ4_BD = 0x40
_LZ4_BLOCK = 64 * 1024


def _header_checksum(descriptor: bytes) -> int:
    return (xxh32(descriptor) >> 8) & 0xFF


def compress_lz4_legacy(data: bytes, magic: int) -> bytes:
    """An LZ4 frame as Kafka writes it for magic 0 and 1. For magic 0 the header checksum covers the frame's
    magic number too (KafkaLZ4BlockOutputStream's useBrokenFlagDescriptorChecksum, kept for 0.8-0.9 clients)."""
    out = bytearray(_LZ4_MAGIC)
    out.append(_KAFKA_LZ4_FLG)
    out.append(_KAFKA_LZ4_BD)
    out.append(_header_checksum(bytes(out) if magic == MAGIC_V0 else bytes(out[4:])))
    for start in range(0, len(data), _LZ4_BLOCK):
        chunk = data[start : start + _LZ4_BLOCK]
        block = lz4.block.compress(chunk, store_size=False)
        if len(block) >= len(chunk):
            out += _I32LE.pack(len(chunk) | 0x80000000)
            out += chunk
        else:
            out += _I32LE.pack(len(block))
            out += block
    out += b"\0\0\0\0"  # end mark
    return bytes(out)


_I32LE = struct.Struct("<I")


def decompress_lz4_legacy(data: bytes, magic: int, max_size: int) -> bytes:
    """Inflate a magic 0/1 LZ4 wrapper value. Magic 0 frames from Kafka's own clients carry the broken header
    checksum and Kafka does not check it there (ignoreFlagDescriptorChecksum): the checksum is set right first."""
    if magic == MAGIC_V0 and data[:4] == _LZ4_MAGIC and len(data) >= 7:
        flg = data[4]
        end = 6 + (8 if flg & _LZ4_FLG_CONTENT_SIZE else 0) + (4 if flg & _LZ4_FLG_DICT_ID else 0)
        if len(data) > end:
            fixed = bytearray(data)
            fixed[end] = _header_checksum(bytes(data[4:end]))
            data = bytes(fixed)
    return decompress(COMPRESSION_LZ4, data, max_size)


_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32, for LZ4 frame header checksums (a few bytes: speed does not matter here)."""
    n = len(data)
    p = 0
    if n >= 16:
        v1, v2, v3, v4 = (seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed & _M32, (seed - _P1) & _M32
        while p + 16 <= n:
            lanes = struct.unpack_from("<4I", data, p)
            v1 = (_rotl((v1 + lanes[0] * _P2) & _M32, 13) * _P1) & _M32
            v2 = (_rotl((v2 + lanes[1] * _P2) & _M32, 13) * _P1) & _M32
            v3 = (_rotl((v3 + lanes[2] * _P2) & _M32, 13) * _P1) & _M32
            v4 = (_rotl((v4 + lanes[3] * _P2) & _M32, 13) * _P1) & _M32
            p += 16
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while p + 4 <= n:
        h = (_rotl((h + struct.unpack_from("<I", data, p)[0] * _P3) & _M32, 17) * _P4) & _M32
        p += 4
    while p < n:
        h = (_rotl((h + data[p] * _P5) & _M32, 11) * _P1) & _M32
        p += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h

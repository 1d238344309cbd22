"""Kafka record batch v2 (magic 2) codec.

Everything here is synchronous, allocation-light and thread-safe (no shared mutable state).
The produce path checks batch headers and walks every record's structure without building objects
(validate_batches, protocol.record_walk), then patches headers in place (set_*); decoding records into
objects (decode_records) is reserved for the cleaner, the coordinators and tests.
"""

from __future__ import annotations

import gzip
import io
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import crc32c as _crc32c
import lz4.frame
import snappy
import zstandard
from kbroker.protocol import accelerators, record_walk
from kbroker.protocol import primitives as _primitives
from kbroker.protocol.record_walk import WalkResult, walk_records, walk_records_py

__all__ = [
    "ATTR_COMPRESSION_MASK",
    "ATTR_CONTROL",
    "ATTR_DELETE_HORIZON",
    "ATTR_TIMESTAMP_TYPE",
    "ATTR_TRANSACTIONAL",
    "BATCH_HEADER_SIZE",
    "BATCH_OVERHEAD",
    "COMPRESSION_GZIP",
    "COMPRESSION_LZ4",
    "COMPRESSION_NONE",
    "COMPRESSION_SNAPPY",
    "COMPRESSION_ZSTD",
    "CORRUPT_MESSAGE",
    "DECOMPRESSION_RATIO_LIMIT",
    "DEFAULT_MAX_DECOMPRESSED",
    "INVALID_RECORD",
    "LOG_OVERHEAD",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NO_TIMESTAMP",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "BatchesSummary",
    "CorruptRecordError",
    "INVALID_TIMESTAMP",
    "InvalidRecordError",
    "Record",
    "RecordError",
    "RecordValidationError",
    "RecordBatchHeader",
    "build_batch",
    "compress",
    "compute_crc",
    "decode_records",
    "decompress",
    "iter_batch_headers",
    "max_decompressed_size",
    "parse_batch_header",
    "read_varint",
    "read_uvarint",
    "recompress_batch",
    "recompress_batches",
    "set_base_offset",
    "set_log_append_time",
    "set_partition_leader_epoch",
    "validate_batches",
    "write_uvarint",
    "write_varint",
]

# Kafka error codes for the exceptions raised here (the broker maps them onto responses).
CORRUPT_MESSAGE = 2
INVALID_TIMESTAMP = 32
INVALID_RECORD = 87

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
# KIP-534: when set, baseTimestamp holds the cleaner's delete horizon for tombstones/markers.
ATTR_DELETE_HORIZON = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = _HEADER.size  # 61
# baseOffset + batchLength precede the part counted by batchLength.
LOG_OVERHEAD = 12
# Smallest legal batchLength: the header minus the LOG_OVERHEAD prefix.
BATCH_OVERHEAD = BATCH_HEADER_SIZE - LOG_OVERHEAD  # 49

# Field offsets inside a batch, used by the in-place rewriters.
_OFF_BASE_OFFSET = 0
_OFF_LENGTH = 8
_OFF_LEADER_EPOCH = 12
_OFF_MAGIC = 16
_OFF_CRC = 17
_OFF_ATTRIBUTES = 21
_OFF_MAX_TIMESTAMP = 35
_CRC_START = _OFF_ATTRIBUTES

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")

_INT32_MAX = 2**31 - 1
# Decompression bound for one batch. A bomb is a batch of a few KB that inflates to hundreds of MB
# (zstd packs 200 MB of zeros into 6 KB, well under max.message.bytes), and inflating costs about
# three times the bound in memory (chunks, joined payload, record values), so the bound is a ratio
# over the largest batch a log accepts: DECOMPRESSION_RATIO_LIMIT x max.message.bytes, and never
# below DEFAULT_MAX_DECOMPRESSED (which is that ratio over Kafka's default message.max.bytes).
DECOMPRESSION_RATIO_LIMIT = 64
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024


def max_decompressed_size(max_message_bytes: int) -> int:
    """Bound on one batch's decompressed size in a log whose max.message.bytes is max_message_bytes."""
    return max(DEFAULT_MAX_DECOMPRESSED, DECOMPRESSION_RATIO_LIMIT * max_message_bytes)


class CorruptRecordError(ValueError):
    """Bytes that are not a well-formed batch (bad CRC, truncated, bad magic...)."""

    error_code = CORRUPT_MESSAGE


class InvalidRecordError(ValueError):
    """A well-formed batch the broker refuses (bad offsets/count, control batch from a client...)."""

    error_code = INVALID_RECORD


@dataclass(frozen=True, slots=True)
class RecordError:
    """One refused record: its index within its batch (Kafka's ProduceResponse.RecordError)."""

    batch_index: int
    message: str

    def __str__(self) -> str:
        return f"RecordError(batchIndex={self.batch_index}, message='{self.message}')"


class RecordValidationError(InvalidRecordError):
    """Records of a well-formed batch refused one by one (Kafka's RecordValidationException): the producer
    fails exactly these records. error_code is INVALID_RECORD, or INVALID_TIMESTAMP when a timestamp is out
    of range."""

    def __init__(self, error_code: int, message: str, record_errors: list[RecordError]) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.record_errors = record_errors


Buffer = bytes | bytearray | memoryview


# ----------------------------------------------------------------------------------------------
# varints (protobuf-style zigzag for signed values, as Kafka's ByteUtils)


def write_uvarint(value: int, out: bytearray) -> None:
    _primitives.write_uvarint(out, value)


def write_varint(value: int, out: bytearray) -> None:
    # Zigzag over 64 bits covers both Kafka varint and varlong.
    write_uvarint((value << 1) ^ (value >> 63), out)


def read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    # Record varints are Kafka varlongs: up to 10 bytes, and a bad one means a corrupt batch.
    try:
        return _primitives.read_uvarint(buf, pos, 63)
    except _primitives.DecodeError as e:
        raise CorruptRecordError(str(e)) from None


def read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    raw, pos = read_uvarint(buf, pos)
    return (raw >> 1) ^ -(raw & 1), pos


# ----------------------------------------------------------------------------------------------
# batch header


@dataclass(slots=True)
class RecordBatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return TIMESTAMP_LOG_APPEND_TIME if self.attributes & ATTR_TIMESTAMP_TYPE else TIMESTAMP_CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & ATTR_DELETE_HORIZON)

    @property
    def delete_horizon_ms(self) -> int:
        return self.base_timestamp if self.attributes & ATTR_DELETE_HORIZON else NO_TIMESTAMP

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        # Sequences wrap at int32 max like the Java client does.
        return (self.base_sequence + self.last_offset_delta) % (_INT32_MAX + 1)


def parse_batch_header(buf: Buffer, pos: int = 0) -> RecordBatchHeader:
    """Parse the 61-byte header at pos. Raises CorruptRecordError if fewer bytes are available."""
    if len(buf) - pos < BATCH_HEADER_SIZE:
        raise CorruptRecordError(f"need {BATCH_HEADER_SIZE} bytes for a batch header at {pos}, have {len(buf) - pos}")
    return RecordBatchHeader(*_HEADER.unpack_from(buf, pos))


def iter_batch_headers(buf: Buffer, pos: int = 0) -> Iterator[tuple[int, RecordBatchHeader]]:
    """Yield (position, header) of each complete batch; stop silently at a partial trailing batch.

    Fetch responses may legally end in a truncated batch, so this is not an error here.
    """
    end = len(buf)
    while end - pos >= BATCH_HEADER_SIZE:
        header = RecordBatchHeader(*_HEADER.unpack_from(buf, pos))
        size = header.batch_length + LOG_OVERHEAD
        if header.batch_length < BATCH_OVERHEAD or pos + size > end:
            return
        yield pos, header
        pos += size


def compute_crc(buf: Buffer, pos: int, size: int) -> int:
    """CRC-32C over attributes..end of the batch at pos (size = whole batch size)."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    return _crc32c.crc32c(view[pos + _CRC_START : pos + size])


@dataclass(slots=True)
class BatchesSummary:
    """Per-batch facts of a validated buffer, enough for the produce path without record parsing."""

    batches: list[tuple[int, RecordBatchHeader]] = field(default_factory=list)
    num_records: int = 0
    valid_bytes: int = 0
    first_timestamp: int = NO_TIMESTAMP
    last_timestamp: int = NO_TIMESTAMP
    max_timestamp: int = NO_TIMESTAMP
    # Index into batches of the (first) batch carrying max_timestamp, -1 when there is none.
    max_timestamp_batch: int = -1

    @property
    def num_batches(self) -> int:
        return len(self.batches)

    @property
    def producers(self) -> list[tuple[int, int, int, int]]:
        """(producer_id, producer_epoch, base_sequence, last_offset_delta) per batch."""
        return [(h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta) for _, h in self.batches]


def validate_batches(buf: Buffer, *, from_client: bool = True, topic_partition: str = "", compacted: bool = False,
                     timestamp_bounds: tuple[int, int] | None = None, log_append_time: bool = False,
                     max_decompressed: int = DEFAULT_MAX_DECOMPRESSED, replicated: bool = False) -> BatchesSummary:
    """Validate every batch of a produce payload: header, CRC, and the structure of every record.

    from_client=True applies Kafka's LogValidator rules for client produce: at least one
    record, lastOffsetDelta == recordsCount - 1, record offset deltas 0, 1, 2..., no control
    batches. Internal writers (coordinators, the cleaner, recovery) pass False, which allows
    empty batches and gaps in offset deltas that compaction leaves.

    Compressed batches are inflated (at most max_decompressed bytes) and their records walked
    too. Records are refused one by one (RecordValidationError with each record's index) when
    `compacted` and they have no key, or when timestamp_bounds = (low, high) is given and their
    CreateTime lies outside it; a client batch marked LogAppendTime is refused the same way.

    replicated=True (with from_client=False) is a follower's copy of its leader's batches, Kafka's
    AppendOrigin.REPLICATION: headers and CRCs are checked, records are not (the leader walked them, and the CRC
    shows these are the bytes it walked; nothing is inflated), and a partial batch at the end (a leader may cut
    its answer at replica.fetch.max.bytes) ends the batches instead of failing them: valid_bytes says where.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if len(view) == 0 and not replicated:
        raise InvalidRecordError("record set is empty")
    batches, num_records, valid_bytes, first_ts, last_ts, max_ts, max_ts_batch, fault = _scan(
        view, from_client, replicated)
    if not replicated:
        # The records of the batches before a header fault are walked first: the first failing batch decides the
        # answer, as in Kafka's one pass over the batches.
        for pos, header in batches:
            _walk_batch(view, pos, header, from_client, topic_partition, compacted, timestamp_bounds,
                        log_append_time, max_decompressed)
    if fault is not None:
        corrupt, message = fault
        raise (CorruptRecordError if corrupt else InvalidRecordError)(message)
    return BatchesSummary(batches, num_records, valid_bytes, first_ts, last_ts, max_ts, max_ts_batch)


ScanResult = tuple[list[tuple[int, "RecordBatchHeader"]], int, int, int, int, int, int, "tuple[bool, str] | None"]


def scan_batches_py(buf: Buffer, from_client: bool, replicated: bool) -> ScanResult:
    """The header pass of validate_batches: each batch's header, size, magic, CRC, counts and codec, in order.

    (batches, num_records, valid_bytes, first_timestamp, last_timestamp, max_timestamp, max_timestamp_batch, fault)
    where fault is None or (corrupt, message) for the first batch that fails; the batches before it are returned
    (the caller walks their records before it reports the fault). protocol/_batch_scan.c's scan is the compiled
    form; this is the reference (tests/protocol/test_batch_scan.py compares them) and the fallback.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    end = len(view)
    batches: list[tuple[int, RecordBatchHeader]] = []
    num_records = 0
    first_ts = last_ts = max_ts = NO_TIMESTAMP
    max_ts_batch = -1
    pos = 0
    crc_fn = _crc32c.crc32c
    fault: tuple[bool, str] | None = None
    while pos < end:
        remaining = end - pos
        if remaining < BATCH_HEADER_SIZE:
            if not replicated:
                fault = (True, f"truncated batch header at position {pos}: {remaining} bytes left")
            break
        header = RecordBatchHeader(*_HEADER.unpack_from(view, pos))
        if header.batch_length < BATCH_OVERHEAD:
            fault = (True, f"batch at position {pos} has batchLength {header.batch_length} < {BATCH_OVERHEAD}")
            break
        size = header.batch_length + LOG_OVERHEAD
        if size > remaining:
            if not replicated:
                fault = (True, f"batch at position {pos} claims {size} bytes but only {remaining} remain")
            break
        if header.magic != 2:
            fault = (True, f"batch at position {pos} has unsupported magic {header.magic}")
            break
        actual = crc_fn(view[pos + _CRC_START : pos + size])
        if actual != header.crc:
            fault = (True, f"batch at position {pos} has CRC {header.crc:#010x}, computed {actual:#010x}")
            break
        count = header.records_count
        lod = header.last_offset_delta
        if count < 0:
            fault = (False, f"batch at position {pos} has negative recordsCount {count}")
            break
        if lod < 0:
            fault = (False, f"batch at position {pos} has negative lastOffsetDelta {lod}")
            break
        if from_client:
            if count == 0:
                fault = (False, f"batch at position {pos} has no records")
                break
            if lod != count - 1:
                fault = (False, f"batch at position {pos} has lastOffsetDelta {lod} inconsistent with recordsCount "
                                f"{count}")
                break
            if header.attributes & ATTR_CONTROL:
                fault = (False, "clients are not allowed to write control records")
                break
        elif count > lod + 1:
            fault = (False, f"batch at position {pos} has {count} records for lastOffsetDelta {lod}")
            break
        codec = header.attributes & ATTR_COMPRESSION_MASK
        if codec > COMPRESSION_ZSTD:
            fault = (False, f"batch at position {pos} uses unknown compression codec {codec}")
            break
        batches.append((pos, header))
        num_records += count
        if first_ts == NO_TIMESTAMP:
            first_ts = header.base_timestamp
        last_ts = header.max_timestamp
        if header.max_timestamp > max_ts:
            max_ts = header.max_timestamp
            max_ts_batch = len(batches) - 1
        pos += size
    return batches, num_records, pos, first_ts, last_ts, max_ts, max_ts_batch, fault


_scan_compiled = accelerators.load("_batch_scan")
if _scan_compiled is not None:
    _scan_compiled.configure(RecordBatchHeader)
_scan: Callable[[Buffer, bool, bool], ScanResult] = (
    _scan_compiled.scan if _scan_compiled is not None else scan_batches_py
)
SCAN_COMPILED = _scan_compiled is not None
SCAN_IMPLEMENTATION = accelerators.describe("_batch_scan", _scan_compiled)


def plain_client_batch_py(buf: Buffer, compacted: bool, timestamp_bounds: tuple[int, int] | None
                          ) -> RecordBatchHeader | None:
    """The header of buf when it is exactly one uncompressed, CreateTime client batch (transactional or not: the
    caller judges the producer's transaction) that validate_batches(buf, from_client=True, ...) passes with nothing
    to refuse; None for anything else (the caller then takes validate_batches, which gives the answer or the error).
    The leader's append fast path; the reference for protocol/_batch_scan.c's plain (tests/protocol/
    test_batch_scan.py compares them)."""
    batches, _, valid_bytes, _, _, _, _, fault = scan_batches_py(buf, True, False)
    if fault is not None or len(batches) != 1:
        return None
    h = batches[0][1]
    if h.attributes & (ATTR_COMPRESSION_MASK | ATTR_TIMESTAMP_TYPE):
        return None
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    found = walk_records_py(view[BATCH_HEADER_SIZE:valid_bytes], h.records_count, consecutive=True,
                         last_offset_delta=h.last_offset_delta, need_keys=compacted,
                         base_timestamp=h.base_timestamp, ts_bounds=timestamp_bounds)
    if isinstance(found, str) or found.keyless or found.bad_timestamps:
        return None
    return h


def _plain_compiled(buf: Buffer, compacted: bool, timestamp_bounds: tuple[int, int] | None
                    ) -> RecordBatchHeader | None:
    low, high = timestamp_bounds if timestamp_bounds is not None else (0, 0)
    return _scan_compiled.plain(buf, _walk_compiled, compacted, timestamp_bounds is not None, low,  # type: ignore[no-any-return,union-attr]
                                high)


_walk_compiled = record_walk.compiled_walk()
plain_client_batch: Callable[[Buffer, bool, tuple[int, int] | None], RecordBatchHeader | None] = (
    _plain_compiled if _scan_compiled is not None and _walk_compiled is not None else plain_client_batch_py)


def one_replicated_batch(buf: Buffer) -> RecordBatchHeader | None:
    """The header of buf when it is exactly one whole batch that passes validate_batches(replicated=True) (header,
    magic, CRC, counts: the checks a follower makes on its leader's batches), else None: a partial or several
    batches, or a fault, which validate_batches then reports. A follower's usual fetch answer per partition, one
    batch, taken without the summary's objects (storage/log_replica.py's append_fetched)."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    size = len(view)
    if size < BATCH_HEADER_SIZE or _I32.unpack_from(view, 8)[0] + LOG_OVERHEAD != size:
        return None
    batches, _, valid_bytes, _, _, _, _, fault = _scan(view, False, True)
    if fault is not None or valid_bytes != size or len(batches) != 1:
        return None
    return batches[0][1]


def _walk_batch(view: memoryview, pos: int, header: RecordBatchHeader, from_client: bool, topic_partition: str,
                compacted: bool, timestamp_bounds: tuple[int, int] | None, log_append_time: bool,
                max_decompressed: int) -> None:
    """Kafka's LogValidator over the records of one batch whose header passed (a compressed one inflated)."""
    body: Buffer = view[pos + BATCH_HEADER_SIZE : pos + header.batch_length + LOG_OVERHEAD]
    codec = header.attributes & ATTR_COMPRESSION_MASK
    if codec:
        body = decompress(codec, body, max_decompressed)
    appended_time = from_client and header.attributes & ATTR_TIMESTAMP_TYPE
    plain_records = not header.attributes & ATTR_CONTROL
    found = walk_records(
        body, header.records_count, consecutive=from_client, last_offset_delta=header.last_offset_delta,
        need_keys=compacted and plain_records, base_timestamp=header.base_timestamp,
        ts_bounds=timestamp_bounds if plain_records and not log_append_time and not appended_time else None)
    if isinstance(found, str):
        raise InvalidRecordError(f"{found} (batch at position {pos} of {topic_partition or 'the request'})")
    if found.keyless or found.bad_timestamps or appended_time:
        _refuse_records(header, found, appended_time=bool(appended_time), log_append_time=log_append_time,
                        timestamp_bounds=timestamp_bounds, topic_partition=topic_partition)


def _refuse_records(header: RecordBatchHeader, found: WalkResult, *, appended_time: bool, log_append_time: bool,
                    timestamp_bounds: tuple[int, int] | None, topic_partition: str) -> None:
    """Raise RecordValidationError naming each refused record, with Kafka's messages (LogValidator.validateRecord:
    a missing key first, then the timestamp; at most one error per record)."""
    errors: dict[int, RecordError] = {}
    timestamp_error = False
    lo, hi = timestamp_bounds if timestamp_bounds is not None else (NO_TIMESTAMP, NO_TIMESTAMP)
    for i in found.keyless:
        errors[i] = RecordError(i, f"Compacted topic cannot accept message without key in topic partition "
                                   f"{topic_partition}")
    if appended_time:
        # A client may not claim LogAppendTime; Kafka still lets it pass on a CreateTime topic when the
        # batch's (max) timestamp is in range.
        ts = header.max_timestamp
        in_range = timestamp_bounds is None or lo <= ts <= hi
        if log_append_time or ts == NO_TIMESTAMP or not in_range:
            for i in range(header.records_count):
                if i in errors:
                    continue
                timestamp_error = True
                if log_append_time or ts == NO_TIMESTAMP:
                    errors[i] = RecordError(i, f"Invalid timestamp type in message with offset "
                                               f"{header.base_offset + i}. Producer should not set timestamp "
                                               f"type to LogAppendTime.")
                else:
                    errors[i] = RecordError(i, _timestamp_message(ts, header.base_offset + i, lo, hi))
    for i, ts in found.bad_timestamps:
        if i not in errors:
            timestamp_error = True
            errors[i] = RecordError(i, _timestamp_message(ts, header.base_offset + i, lo, hi))
    if not errors:
        return
    ordered = [errors[i] for i in sorted(errors)]
    if timestamp_error:
        raise RecordValidationError(INVALID_TIMESTAMP, "One or more records have been rejected due to invalid "
                                                       "timestamp", ordered)
    shown = ", ".join(str(e) for e in ordered[:3])
    raise RecordValidationError(INVALID_RECORD, f"One or more records have been rejected due to {len(ordered)} "
                                                f"record errors in total, and only showing the first three errors "
                                                f"at most: [{shown}]", ordered)


def _timestamp_message(ts: int, offset: int, lo: int, hi: int) -> str:
    return (f"Timestamp {ts} of message with offset {offset} is out of range. The timestamp should be within "
            f"[{lo}, {hi}]")


# ----------------------------------------------------------------------------------------------
# in-place rewriting


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    # baseOffset is not covered by the CRC, so no recompute.
    _I64.pack_into(buf, pos + _OFF_BASE_OFFSET, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    # Also outside the CRC (which starts at attributes).
    _I32.pack_into(buf, pos + _OFF_LEADER_EPOCH, epoch)


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp: int) -> None:
    """Mark the batch LogAppendTime with maxTimestamp=timestamp; recompute the CRC."""
    (attributes,) = _I16.unpack_from(buf, pos + _OFF_ATTRIBUTES)
    _I16.pack_into(buf, pos + _OFF_ATTRIBUTES, attributes | ATTR_TIMESTAMP_TYPE)
    _I64.pack_into(buf, pos + _OFF_MAX_TIMESTAMP, timestamp)
    (length,) = _I32.unpack_from(buf, pos + _OFF_LENGTH)
    _U32.pack_into(buf, pos + _OFF_CRC, compute_crc(buf, pos, length + LOG_OVERHEAD))


# ----------------------------------------------------------------------------------------------
# compression

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
# xerial's default block size; the Java client decodes any block size.
_XERIAL_BLOCK = 32 * 1024


# Kafka's default levels (KIP-390): gzip -1 is the JDK Deflater's default, which is zlib's 6.
GZIP_DEFAULT_LEVEL = -1
LZ4_DEFAULT_LEVEL = 9
ZSTD_DEFAULT_LEVEL = 3


def compress(codec: int, data: Buffer, level: int | None = None) -> bytes:
    """Compress a batch body; level None is the codec's default (Kafka's level numbers otherwise)."""
    if codec == COMPRESSION_NONE:
        return bytes(data)
    if codec == COMPRESSION_GZIP:
        gz_level = 6 if level is None or level == GZIP_DEFAULT_LEVEL else level
        return gzip.compress(bytes(data), compresslevel=gz_level, mtime=0)
    if codec == COMPRESSION_SNAPPY:
        # Java clients (SnappyInputStream) and librdkafka expect xerial framing.
        out = bytearray(_XERIAL_HEADER)
        view = memoryview(data)
        for start in range(0, len(view), _XERIAL_BLOCK):
            block = snappy.compress(bytes(view[start : start + _XERIAL_BLOCK]))
            out += _I32.pack(len(block))
            out += block
        return bytes(out)
    if codec == COMPRESSION_LZ4:
        # Independent blocks: the Java client's KafkaLZ4BlockInputStream decodes each block on its own.
        # lz4.frame's levels stop at 16 (above 12 they all mean LZ4HC max), Kafka's at 17.
        kwargs = {} if level is None else {"compression_level": min(level, 16)}
        return bytes(lz4.frame.compress(bytes(data), block_linked=False, **kwargs))
    if codec == COMPRESSION_ZSTD:
        return bytes(zstandard.ZstdCompressor(level=ZSTD_DEFAULT_LEVEL if level is None else level)
                     .compress(bytes(data)))
    raise InvalidRecordError(f"unknown compression codec {codec}")


def _too_big(codec: int, max_size: int) -> CorruptRecordError:
    return CorruptRecordError(f"decompressed data (codec {codec}) exceeds {max_size} bytes")


def decompress(codec: int, data: Buffer, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """Decompress, never producing more than max_size bytes (decompression bombs -> CorruptRecordError)."""
    try:
        if codec == COMPRESSION_NONE:
            if len(data) > max_size:
                raise _too_big(codec, max_size)
            return bytes(data)
        if codec == COMPRESSION_GZIP:
            return _gunzip(bytes(data), max_size)
        if codec == COMPRESSION_SNAPPY:
            return _unsnappy(bytes(data), max_size)
        if codec == COMPRESSION_LZ4:
            return _unlz4(bytes(data), max_size)
        if codec == COMPRESSION_ZSTD:
            return _unzstd(bytes(data), max_size)
    except CorruptRecordError:
        raise
    except Exception as e:  # codec libraries raise assorted types on garbage input
        raise CorruptRecordError(f"failed to decompress (codec {codec}): {e}") from e
    raise InvalidRecordError(f"unknown compression codec {codec}")


# Produce inflates every compressed batch to walk its records, so decompression is on the hot path: output
# buffers are sized from the frame's content size when it has one (allocating the whole bound up front costs
# more than inflating a 16 KB batch), and zstd contexts, slow to create, are kept per thread.
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_CONTENT_SIZE_FLAG = 0x08
_zstd_local = threading.local()


def _unlz4(data: bytes, max_size: int) -> bytes:
    dec = lz4.frame.LZ4FrameDecompressor()
    first = min(max_size + 1, max(len(data) * 4, 1 << 16))
    if data[:4] == _LZ4_MAGIC and len(data) >= 14 and data[4] & _LZ4_CONTENT_SIZE_FLAG:
        # The declared size may lie: it only sizes the first buffer, the bound still holds.
        first = min(max_size + 1, int.from_bytes(data[6:14], "little") + 1)
    out = dec.decompress(data, max_length=first)
    if dec.eof:
        if len(out) > max_size:
            raise _too_big(COMPRESSION_LZ4, max_size)
        return bytes(out)
    chunks = [out]
    total = len(out)
    while not dec.eof:
        if total > max_size:
            raise _too_big(COMPRESSION_LZ4, max_size)
        if dec.needs_input:
            raise CorruptRecordError("truncated lz4 frame")
        chunk = dec.decompress(b"", max_length=min(max_size + 1 - total, 1 << 20))
        chunks.append(chunk)
        total += len(chunk)
    if total > max_size:
        raise _too_big(COMPRESSION_LZ4, max_size)
    return b"".join(chunks)


def _unzstd(data: bytes, max_size: int) -> bytes:
    dctx = getattr(_zstd_local, "dctx", None)
    if dctx is None:
        dctx = _zstd_local.dctx = zstandard.ZstdDecompressor()
    size = zstandard.frame_content_size(data)
    if 0 <= size <= max_size:
        try:
            # One frame whose header gives its size (extra frames or a wrong size: the bounded reader below).
            out = dctx.decompress(data, allow_extra_data=False)
            if len(out) == size:
                return bytes(out)
        except zstandard.ZstdError:
            pass
    elif size > max_size:
        raise _too_big(COMPRESSION_ZSTD, max_size)
    # Frames written by streaming encoders carry no content size: read them in bounded chunks.
    reader = dctx.stream_reader(io.BytesIO(data), read_across_frames=True)
    chunks = []
    total = 0
    while True:
        chunk = reader.read(min(1 << 20, max_size + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > max_size:
            raise _too_big(COMPRESSION_ZSTD, max_size)
    return b"".join(chunks)


def _gunzip(data: bytes, max_size: int) -> bytes:
    out = bytearray()
    while data:
        dec = zlib.decompressobj(wbits=31)
        out += dec.decompress(data, max_size + 1 - len(out))
        if len(out) > max_size or dec.unconsumed_tail:
            raise _too_big(COMPRESSION_GZIP, max_size)
        if not dec.eof:
            raise CorruptRecordError("truncated gzip stream")
        # Concatenated gzip members are legal.
        data = dec.unused_data
    return bytes(out)


def _unsnappy(data: bytes, max_size: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, max_size)
    out = bytearray()
    pos = len(_XERIAL_HEADER)
    end = len(data)
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError("truncated xerial snappy block length")
        (n,) = _I32.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > end:
            raise CorruptRecordError("truncated xerial snappy block")
        out += _snappy_block(data[pos : pos + n], max_size - len(out))
        pos += n
    return bytes(out)


def _snappy_block(block: bytes, max_size: int) -> bytes:
    # The uncompressed length is a varint preamble: check it before allocating.
    n, _ = read_uvarint(block, 0)
    if n > max_size:
        raise _too_big(COMPRESSION_SNAPPY, max_size)
    return bytes(snappy.decompress(block))


# ----------------------------------------------------------------------------------------------
# records


@dataclass(slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    attributes: int = 0


def decode_records(buf: Buffer, pos: int = 0, *, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> list[Record]:
    """Decode the records of the single batch at pos with absolute offsets and timestamps."""
    header = parse_batch_header(buf, pos)
    size = header.size_in_bytes
    if header.batch_length < BATCH_OVERHEAD or pos + size > len(buf):
        raise CorruptRecordError(f"batch at position {pos} is truncated")
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    body: Buffer = view[pos + BATCH_HEADER_SIZE : pos + size]
    if header.compression != COMPRESSION_NONE:
        body = decompress(header.compression, body, max_size)
    log_append = header.attributes & ATTR_TIMESTAMP_TYPE
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    records: list[Record] = []
    p = 0
    end = len(body)
    try:
        for _ in range(header.records_count):
            length, p = read_varint(body, p)
            rec_end = p + length
            if length < 0 or rec_end > end:
                raise CorruptRecordError("record length exceeds batch")
            attributes = body[p]
            p += 1
            ts_delta, p = read_varint(body, p)
            off_delta, p = read_varint(body, p)
            key_len, p = read_varint(body, p)
            key: bytes | None = None
            if key_len >= 0:
                key = bytes(body[p : p + key_len])
                p += key_len
            value_len, p = read_varint(body, p)
            value: bytes | None = None
            if value_len >= 0:
                value = bytes(body[p : p + value_len])
                p += value_len
            n_headers, p = read_varint(body, p)
            headers: list[tuple[str, bytes | None]] = []
            for _h in range(n_headers):
                hk_len, p = read_varint(body, p)
                if hk_len < 0:
                    raise CorruptRecordError("null header key")
                # Kafka does not require UTF-8 here (Java decodes leniently): keep undecodable bytes as they are.
                hkey = bytes(body[p : p + hk_len]).decode("utf-8", "surrogateescape")
                p += hk_len
                hv_len, p = read_varint(body, p)
                hval: bytes | None = None
                if hv_len >= 0:
                    hval = bytes(body[p : p + hv_len])
                    p += hv_len
                headers.append((hkey, hval))
            if p != rec_end:
                raise CorruptRecordError("record length does not match its content")
            ts = header.max_timestamp if log_append else base_ts + ts_delta
            if not _INT64_MIN <= ts <= _INT64_MAX:
                ts = _wrap_int64(ts)
            records.append(Record(base_offset + off_delta, ts, key, value, headers, attributes))
    except IndexError as e:
        raise CorruptRecordError(f"malformed record in batch at offset {base_offset}: {e}") from e
    return records


def _encode_record(out: bytearray, offset_delta: int, ts_delta: int, key: bytes | None, value: bytes | None,
                   headers: Sequence[tuple[str, bytes | None]], attributes: int = 0) -> None:
    body = bytearray()
    body.append(attributes & 0xFF)
    write_varint(ts_delta if _INT64_MIN <= ts_delta <= _INT64_MAX else _wrap_int64(ts_delta), body)
    write_varint(offset_delta, body)
    if key is None:
        write_varint(-1, body)
    else:
        write_varint(len(key), body)
        body += key
    if value is None:
        write_varint(-1, body)
    else:
        write_varint(len(value), body)
        body += value
    write_varint(len(headers), body)
    for hkey, hval in headers:
        kb = hkey.encode("utf-8", "surrogateescape")
        write_varint(len(kb), body)
        body += kb
        if hval is None:
            write_varint(-1, body)
        else:
            write_varint(len(hval), body)
            body += hval
    write_varint(len(body), out)
    out += body


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _wrap_int64(value: int) -> int:
    """Java's long arithmetic: a timestamp delta or base + delta past the int64 range wraps around, so a batch
    whose base timestamp was replaced by a delete horizon (KIP-534) still gives back its records' timestamps."""
    return ((value - _INT64_MIN) & 0xFFFF_FFFF_FFFF_FFFF) + _INT64_MIN


RecordLike = Record | tuple[Any, ...]


def build_batch(
    records: Iterable[RecordLike],
    *,
    base_offset: int = 0,
    compression: int = COMPRESSION_NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    timestamp_type: int = TIMESTAMP_CREATE_TIME,
    partition_leader_epoch: int = -1,
    last_offset_delta: int | None = None,
    max_timestamp: int | None = None,
    delete_horizon_ms: int | None = None,
) -> bytes:
    """Encode one v2 batch with a correct CRC.

    records are Record objects (offset deltas taken from record.offset - base_offset, so the
    cleaner can keep original offsets) or (key, value, headers, timestamp) tuples (consecutive
    offsets). last_offset_delta overrides the computed one (compaction keeps the original last
    offset even when the last record was removed; an empty batch needs it). max_timestamp
    overrides the computed one (LogAppendTime batches, empty batches). delete_horizon_ms sets
    the KIP-534 delete horizon as baseTimestamp.
    """
    entries: list[tuple[int, int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]] = []
    for i, rec in enumerate(records):
        if isinstance(rec, Record):
            entries.append((rec.offset - base_offset, rec.timestamp, rec.key, rec.value, rec.headers, rec.attributes))
        else:
            key, value, headers, ts = rec
            entries.append((i, ts, key, value, headers or (), 0))
    timestamps = [e[1] for e in entries]
    if delete_horizon_ms is not None:
        base_ts = delete_horizon_ms
    elif entries:
        base_ts = timestamps[0]
    else:
        base_ts = NO_TIMESTAMP  # Kafka's writeEmptyHeader: an empty batch has no base timestamp
    if max_timestamp is None:
        max_timestamp = max(timestamps) if timestamps else NO_TIMESTAMP
    if last_offset_delta is None:
        last_offset_delta = entries[-1][0] if entries else 0
    body = bytearray()
    for off_delta, ts, key, value, headers, rec_attrs in entries:
        if off_delta < 0 or off_delta > last_offset_delta:
            raise ValueError(f"record offset delta {off_delta} outside batch range 0..{last_offset_delta}")
        _encode_record(body, off_delta, ts - base_ts, key, value, headers, rec_attrs)
    payload = compress(compression, body) if compression != COMPRESSION_NONE else bytes(body)
    attributes = compression & ATTR_COMPRESSION_MASK
    if timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
        attributes |= ATTR_TIMESTAMP_TYPE
    if is_transactional:
        attributes |= ATTR_TRANSACTIONAL
    if is_control:
        attributes |= ATTR_CONTROL
    if delete_horizon_ms is not None:
        attributes |= ATTR_DELETE_HORIZON
    out = bytearray(BATCH_HEADER_SIZE + len(payload))
    _HEADER.pack_into(
        out, 0, base_offset, BATCH_OVERHEAD + len(payload), partition_leader_epoch, 2, 0, attributes,
        last_offset_delta, base_ts, max_timestamp, producer_id, producer_epoch, base_sequence, len(entries),
    )
    out[BATCH_HEADER_SIZE:] = payload
    _U32.pack_into(out, _OFF_CRC, compute_crc(out, 0, len(out)))
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# recompression (topic compression.type)


def recompress_batch(buf: Buffer, pos: int, codec: int, level: int | None = None, *,
                     max_size: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """The batch at pos with its records compressed with codec instead (Kafka's LogValidator rebuild).

    Records are carried over byte for byte (offset and timestamp deltas, keys, values, headers), and so
    is every header field but the codec bits, the length and the CRC: base offset, timestamps, producer
    id, epoch and base sequence, transactional flag, leader epoch.
    """
    header = parse_batch_header(buf, pos)
    size = header.size_in_bytes
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    body: Buffer = view[pos + BATCH_HEADER_SIZE : pos + size]
    if header.compression != COMPRESSION_NONE:
        body = decompress(header.compression, body, max_size)
    payload = compress(codec, body, level)
    out = bytearray(BATCH_HEADER_SIZE + len(payload))
    out[:BATCH_HEADER_SIZE] = view[pos : pos + BATCH_HEADER_SIZE]
    out[BATCH_HEADER_SIZE:] = payload
    _I32.pack_into(out, _OFF_LENGTH, BATCH_OVERHEAD + len(payload))
    attributes = (header.attributes & ~ATTR_COMPRESSION_MASK) | (codec & ATTR_COMPRESSION_MASK)
    _I16.pack_into(out, _OFF_ATTRIBUTES, attributes)
    _U32.pack_into(out, _OFF_CRC, compute_crc(out, 0, len(out)))
    return bytes(out)


def recompress_batches(buf: Buffer, summary: BatchesSummary, codec: int, level: int | None = None, *,
                       max_size: int = DEFAULT_MAX_DECOMPRESSED) -> bytearray | None:
    """The validated batches of buf with every batch of another codec recompressed (control batches are
    never touched), or None when nothing needs rebuilding."""
    if all(h.compression == codec or h.is_control for _, h in summary.batches):
        return None
    out = bytearray()
    for pos, h in summary.batches:
        if h.compression == codec or h.is_control:
            out += buf[pos : pos + h.size_in_bytes]
        else:
            out += recompress_batch(buf, pos, codec, level, max_size=max_size)
    return out

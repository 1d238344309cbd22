"""Kafka's per-partition checks of a Produce request's records before any is appended (ProduceRequest.validateRecords).

Kafka walks the record set with its batch iterator (ByteBufferLogInputStream): a set too short for a batch, or whose
first batch runs past its end, has no batch at all; a size under 14 bytes or a magic outside 0-2 is corrupt. From
Produce v3 a partition carries exactly one v2 batch, and zstd needs v7 (KIP-110). Produce v0-v2 are not checked
here, as in Kafka (clients of that age sent what they liked); their batches are still all validated by the log.
"""

from __future__ import annotations

import struct

from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.records import ATTR_COMPRESSION_MASK, COMPRESSION_ZSTD, LOG_OVERHEAD

# Produce versions from which the record set must be one magic-2 batch, and zstd is allowed.
ONE_BATCH_VERSION = 3
ZSTD_VERSION = 7

_SIZE = struct.Struct(">i")
_SIZE_OFFSET = 8
_MAGIC_OFFSET = 16
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_OFFSET = 21
_HEADER_SIZE_UP_TO_MAGIC = _MAGIC_OFFSET + 1
_RECORD_OVERHEAD_V0 = 14  # Kafka's LegacyRecord.RECORD_OVERHEAD_V0: the smallest size any entry can claim
_CURRENT_MAGIC = 2

Refusal = tuple[ErrorCode, str]


class _Corrupt(Exception):
    pass


def _next_batch_size(records: bytes | bytearray | memoryview, pos: int) -> int | None:
    """Kafka's ByteBufferLogInputStream.nextBatchSize: the whole size of the entry at pos, None when the rest is
    too short to hold one."""
    remaining = len(records) - pos
    if remaining < LOG_OVERHEAD:
        return None
    (size,) = _SIZE.unpack_from(records, pos + _SIZE_OFFSET)
    if size < _RECORD_OVERHEAD_V0:
        raise _Corrupt(f"Record size {size} is less than the minimum record overhead ({_RECORD_OVERHEAD_V0})")
    if remaining < _HEADER_SIZE_UP_TO_MAGIC:
        return None
    magic = struct.unpack_from(">b", records, pos + _MAGIC_OFFSET)[0]
    if not 0 <= magic <= _CURRENT_MAGIC:
        raise _Corrupt(f"Invalid magic found in record: {magic}")
    whole = size + LOG_OVERHEAD
    return whole if whole <= remaining else None


def validate_records(version: int, records: bytes | bytearray | memoryview | None) -> Refusal | None:
    """Kafka's answer for a partition's records in a Produce of `version`, or None when they may go to the log.
    A null record set counts as empty (Kafka would fail the whole request on it with an internal error)."""
    if version < ONE_BATCH_VERSION:
        return None
    data = records if records is not None else b""
    try:
        first = _next_batch_size(data, 0)
        if first is None:
            return (
                ErrorCode.INVALID_RECORD,
                f"Produce requests with version {version} must have at least one record batch per partition",
            )
        if data[_MAGIC_OFFSET] != _CURRENT_MAGIC:
            return (
                ErrorCode.INVALID_RECORD,
                f"Produce requests with version {version} are only allowed to contain "
                f"record batches with magic version 2",
            )
        codec = _ATTRIBUTES.unpack_from(data, _ATTRIBUTES_OFFSET)[0] & ATTR_COMPRESSION_MASK
        if version < ZSTD_VERSION and codec == COMPRESSION_ZSTD:
            return (
                ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                f"Produce requests with version {version} are not allowed to use ZStandard compression",
            )
        if _next_batch_size(data, first) is not None:
            return (
                ErrorCode.INVALID_RECORD,
                f"Produce requests with version {version} are only allowed to contain "
                f"exactly one record batch per partition",
            )
    except _Corrupt as e:
        return ErrorCode.CORRUPT_MESSAGE, str(e)
    return None


# Kafka's DefaultRecordBatch reads the producer id at offset 43 of the batch whatever the batch's stated size: a
# magic-2 entry shorter than that makes its request handler fail (IndexOutOfBoundsException, UNKNOWN_SERVER_ERROR).
SHORTEST_PRODUCER_BATCH = 51


def first_entry_corrupt(records: bytes | bytearray | memoryview | None) -> str | None:
    """Why Kafka's batch iterator fails on the first entry of a partition's records (RequestUtils.flag reads it
    before anything else is checked), or None."""
    if not records:
        return None
    try:
        _next_batch_size(records, 0)
    except _Corrupt as e:
        return str(e)
    return None


def scan_entries(records: bytes | bytearray | memoryview) -> ErrorCode | None:
    """Kafka's ReplicaManager.handleProduceAppend walks every entry of each partition to be appended (looking for
    transactional batches) before it appends anything: a corrupt entry fails the whole request with
    CORRUPT_MESSAGE, a magic-2 entry too short to hold a producer id with UNKNOWN_SERVER_ERROR."""
    pos = 0
    try:
        while True:
            size = _next_batch_size(records, pos)
            if size is None:
                return None
            if records[pos + _MAGIC_OFFSET] == _CURRENT_MAGIC and size < SHORTEST_PRODUCER_BATCH:
                return ErrorCode.UNKNOWN_SERVER_ERROR
            pos += size
    except _Corrupt:
        return ErrorCode.CORRUPT_MESSAGE

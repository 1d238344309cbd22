"""Structural walk over the records of one v2 batch body (Kafka's DefaultRecord.readFrom without the objects).

Kafka's LogValidator reads every record of every produced batch; a batch whose records are garbage under a
valid CRC must never reach a consumer (librdkafka stops at such an offset for good). This walk checks what a
reader relies on: record-length varints that stay inside the body, varints no longer than Kafka reads them
(ByteUtils.readVarint: 5 bytes; only the timestamp delta is a 10-byte varlong), every field inside its record, key and
value lengths >= -1, header counts >= 0, non-null header keys, offset deltas, and exactly recordsCount records
filling the body. It allocates nothing per record: on the produce path it is the only per-record work.

The module stands alone (protocol.records imports it) and reports problems as return values, not exceptions,
so one call per batch is all the produce path pays for. In Python the walk costs ~0.7-1 us per record, several
times what the broker spends on a produced message otherwise; protocol/_record_walk.c does the same in a few ns
and is used when built (setup.py, optional: `python setup.py build_ext --inplace`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kbroker.protocol import accelerators
from kbroker.protocol.primitives import DecodeError, read_uvarint

__all__ = ["COMPILED", "IMPLEMENTATION", "WalkResult", "walk_records", "walk_records_py"]

_compiled = accelerators.load("_record_walk")
COMPILED = _compiled is not None
IMPLEMENTATION = accelerators.describe("_record_walk", _compiled)

Buffer = bytes | bytearray | memoryview


class WalkResult:
    """Per-record findings of a walk that found the structure sound (record indexes within the batch)."""

    __slots__ = ("keyless", "bad_timestamps")

    def __init__(self) -> None:
        self.keyless: list[int] = []
        # (index, absolute timestamp) of records outside the allowed timestamp range.
        self.bad_timestamps: list[tuple[int, int]] = []


_U64_MAX = 2**64 - 1
_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1

_OK = WalkResult()  # shared, never mutated: returned when no record needs reporting
_U32_MAX = 2**32 - 1


def _read_varint32(buf: Buffer, pos: int) -> tuple[int, int]:
    """A record field Kafka reads with ByteUtils.readVarint: at most 5 bytes. Java keeps the low 32 bits of a
    fifth byte's 35; such a value is refused here instead, as no writer produces it and the cleaner and this
    broker's readers would see a different number than a Java consumer."""
    raw, pos = read_uvarint(buf, pos, 28)
    if raw > _U32_MAX:
        raise DecodeError("varint does not fit 32 bits")
    return raw, pos


def compiled_walk() -> Callable[..., Any] | None:
    """protocol/_record_walk.c's walk itself (None when it is not built or KBROKER_PURE_PYTHON is set), for compiled
    callers that walk a batch without the Python wrapper (protocol/_batch_scan.c's plain)."""
    return _compiled.walk if _compiled is not None else None


def walk_records(body: Buffer, count: int, *, consecutive: bool, last_offset_delta: int, need_keys: bool,
                 base_timestamp: int, ts_bounds: tuple[int, int] | None) -> WalkResult | str:
    """Walk `count` records filling `body`; a Kafka-style message for the first structural fault, else findings.

    consecutive: offset deltas must be 0, 1, 2... (client batches); otherwise strictly increasing and at most
    last_offset_delta (batches the cleaner rewrote). need_keys: collect records without a key (compacted
    topics). ts_bounds: absolute [low, high] CreateTime range; records outside it are collected (NO_TIMESTAMP
    records are exempt, as in Kafka).
    """
    if _compiled is None:
        return walk_records_py(body, count, consecutive=consecutive, last_offset_delta=last_offset_delta,
                               need_keys=need_keys, base_timestamp=base_timestamp, ts_bounds=ts_bounds)
    low, high = ts_bounds if ts_bounds is not None else (0, 0)
    found = _compiled.walk(body, count, consecutive, last_offset_delta, need_keys, base_timestamp,
                           ts_bounds is not None, low, high)
    if found is None:
        return _OK
    if isinstance(found, str):
        return found
    result = WalkResult()
    result.keyless, result.bad_timestamps = found
    return result


def walk_records_py(body: Buffer, count: int, *, consecutive: bool, last_offset_delta: int, need_keys: bool,
                    base_timestamp: int, ts_bounds: tuple[int, int] | None) -> WalkResult | str:
    """walk_records in Python: the reference for protocol/_record_walk.c, and the fallback without it."""
    end = len(body)
    p = 0
    result = _OK
    check_ts = ts_bounds is not None
    if check_ts:
        assert ts_bounds is not None
        lo = ts_bounds[0] - base_timestamp
        hi = ts_bounds[1] - base_timestamp
        no_ts = -1 - base_timestamp
    prev_delta = -1
    i = 0
    _read = read_uvarint
    _read32 = _read_varint32
    try:
        while i < count:
            # Varints are zigzag: the raw value's low bit is the sign, raw >> 1 the magnitude. One- and two-byte
            # varints (every length below 8 KB) are decoded inline; longer ones by the shared reader.
            b = body[p]
            if b < 0x80:
                raw = b
                p += 1
            else:
                c = body[p + 1]
                if c < 0x80:
                    raw = (b & 0x7F) | (c << 7)
                    p += 2
                else:
                    raw, p = _read32(body, p)
            start = p
            rec_end = p + (raw >> 1)
            if raw & 1 or rec_end > end:
                size = (raw >> 1) ^ -(raw & 1)
                return (f"Invalid record size: expected {size} bytes in record payload, but instead the buffer "
                        f"has only {end - p} remaining bytes.")
            # attributes (ignored, as in Kafka), then the timestamp delta
            if not check_ts and body[p + 1] < 0x80:
                p += 2
            elif not check_ts and body[p + 2] < 0x80:
                p += 3
            else:
                raw, p = _read(body, p + 1, 63)
                delta = (raw >> 1) ^ -(raw & 1)
                if raw > _U64_MAX or not _I64_MIN <= base_timestamp + delta <= _I64_MAX:
                    # A ten-byte varint can hold more than 64 bits; Java would wrap it, the cleaner could not
                    # write it back.
                    return f"Record {i} has timestamp delta {delta} outside the 64-bit range"
                if check_ts:
                    if (delta < lo or delta > hi) and delta != no_ts:
                        if result is _OK:
                            result = WalkResult()
                        result.bad_timestamps.append((i, base_timestamp + delta))
            b = body[p]
            if b < 0x80:
                raw = b
                p += 1
            else:
                c = body[p + 1]
                if c < 0x80:
                    raw = (b & 0x7F) | (c << 7)
                    p += 2
                else:
                    raw, p = _read32(body, p)
            if consecutive:
                if raw != i << 1:
                    delta = (raw >> 1) ^ -(raw & 1)
                    return f"Record {i} has offset delta {delta}: a batch's records must have deltas 0, 1, 2..."
            else:
                delta = (raw >> 1) ^ -(raw & 1)
                if delta <= prev_delta or delta > last_offset_delta:
                    return f"Record {i} has offset delta {delta} after {prev_delta}, batch ends at {last_offset_delta}"
                prev_delta = delta
            # key
            b = body[p]
            if b < 0x80:
                raw = b
                p += 1
            else:
                c = body[p + 1]
                if c < 0x80:
                    raw = (b & 0x7F) | (c << 7)
                    p += 2
                else:
                    raw, p = _read32(body, p)
            if raw & 1:
                if raw != 1:
                    return f"Record {i} has key size {(raw >> 1) ^ -1}"
                if need_keys:
                    if result is _OK:
                        result = WalkResult()
                    result.keyless.append(i)
            else:
                p += raw >> 1
            # value
            b = body[p]
            if b < 0x80:
                raw = b
                p += 1
            else:
                c = body[p + 1]
                if c < 0x80:
                    raw = (b & 0x7F) | (c << 7)
                    p += 2
                else:
                    raw, p = _read32(body, p)
            if raw & 1:
                if raw != 1:
                    return f"Record {i} has value size {(raw >> 1) ^ -1}"
            else:
                p += raw >> 1
            # headers
            b = body[p]
            p += 1
            if b:
                if b & 1 or b >= 0x80:
                    raw, p = _read32(body, p - 1)
                    if raw & 1:
                        return f"Found invalid number of record headers {(raw >> 1) ^ -1}"
                    n_headers = raw >> 1
                else:
                    n_headers = b >> 1
                # Each header takes at least two bytes: a lying count cannot make this loop long.
                if n_headers > (rec_end - p) // 2:
                    return f"Record {i} claims {n_headers} headers in {rec_end - p} bytes"
                for _ in range(n_headers):
                    raw, p = _read32(body, p)
                    if raw & 1:
                        return "Invalid negative header key size"
                    p += raw >> 1
                    raw, p = _read32(body, p)
                    if raw & 1:
                        if raw != 1:
                            return f"Invalid header value size {(raw >> 1) ^ -1}"
                    else:
                        p += raw >> 1
                    if p > rec_end:
                        break
            # Every read moves p forward, so a field that ran past the record shows up here.
            if p != rec_end:
                return (f"Invalid record size: expected to read {rec_end - start} bytes in record payload, "
                        f"but instead read {p - start}")
            i += 1
    except IndexError:
        return "Incorrect declared batch size, premature EOF reached"
    except DecodeError:
        return "Found invalid record structure"
    if p != end:
        return "Incorrect declared batch size, records still remaining in file"
    return result

"""Segment recovery after an unclean shutdown: validate every batch, cut at the first bad byte, rebuild indexes.

The transaction index is emptied here; it needs the producer state before the segment, so the Log
rebuilds it while it replays the producer state (Log._load_producer_state).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import crc32c
from kbroker.protocol.records import BATCH_HEADER_SIZE, BATCH_OVERHEAD, LOG_OVERHEAD, parse_batch_header
from kbroker.storage.segment import LogSegment

logger = logging.getLogger("kbroker.storage")

# Recovery reads big sequential chunks; it only runs on the unflushed tail.
_CHUNK = 1 << 20
_CRC_START = 21


@dataclass(slots=True)
class SegmentRecoveryResult:
    valid_bytes: int
    truncated_bytes: int
    next_offset: int
    reason: str | None = None


def recover_segment(segment: LogSegment, min_offset: int,
                    epochs: list[tuple[int, int]] | None = None) -> SegmentRecoveryResult:
    """Rebuild the offset and time indexes of segment from its data (empty its transaction index) and
    truncate at the first invalid batch; epochs, when given, collects (leader epoch, base offset) where the valid
    batches' epoch changes.

    A batch is valid when it fits the file, has magic 2, a matching CRC, sane counts and a
    base offset >= min_offset / the previous batch's next offset (offsets never go backwards).
    """
    segment.reset_indexes()
    reader = segment.reader()  # held while fd is in use
    fd = reader.fd
    size = os.fstat(fd).st_size
    pos = 0
    next_offset = max(min_offset, segment.base_offset)
    reason: str | None = None
    buf = b""
    buf_start = 0
    while pos < size:
        remaining = size - pos
        if remaining < BATCH_HEADER_SIZE:
            reason = f"torn batch header ({remaining} bytes)"
            break
        off = pos - buf_start
        if off + BATCH_HEADER_SIZE > len(buf):
            buf = os.pread(fd, min(_CHUNK, remaining), pos)
            buf_start, off = pos, 0
        header = parse_batch_header(buf, off)
        if header.batch_length < BATCH_OVERHEAD:
            reason = f"invalid batchLength {header.batch_length}"
            break
        batch_size = header.batch_length + LOG_OVERHEAD
        if batch_size > remaining:
            reason = f"torn batch (needs {batch_size} bytes, {remaining} left)"
            break
        if header.magic != 2:
            reason = f"invalid magic {header.magic}"
            break
        if off + batch_size > len(buf):
            buf = os.pread(fd, max(batch_size, min(_CHUNK, remaining)), pos)
            buf_start, off = pos, 0
        view = memoryview(buf)
        if crc32c.crc32c(view[off + _CRC_START : off + batch_size]) != header.crc:
            reason = "CRC mismatch"
            break
        if header.last_offset_delta < 0 or header.records_count < 0 or \
                header.records_count > header.last_offset_delta + 1:
            reason = "inconsistent record count"
            break
        if header.base_offset < next_offset:
            reason = f"offset {header.base_offset} below expected {next_offset}"
            break
        if not segment.can_convert_to_relative_offset(header.last_offset):
            reason = f"offset {header.last_offset} out of range for segment"
            break
        segment._index_batch(pos, header)
        epoch = header.partition_leader_epoch
        if epochs is not None and epoch >= 0 and (not epochs or epochs[-1][0] != epoch):
            epochs.append((epoch, header.base_offset))
        next_offset = header.next_offset
        pos += batch_size
    truncated = segment.truncate_to_position(pos) if pos < size else 0
    return SegmentRecoveryResult(pos, truncated, next_offset, reason)


def next_offset_of_segment_file(path: Path) -> int:
    """Offset after the last whole batch of a segment file, read header by header; -1 for an empty file."""
    end = -1
    with open(path, "rb") as f:
        pos = 0
        while True:
            f.seek(pos)
            head = f.read(BATCH_HEADER_SIZE)
            if len(head) < BATCH_HEADER_SIZE:
                return end
            h = parse_batch_header(head)
            if h.batch_length < BATCH_OVERHEAD:
                return end
            end = h.next_offset
            pos += h.size_in_bytes

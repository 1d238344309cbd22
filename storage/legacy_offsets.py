"""ListOffsets v0's answer (Kafka's UnifiedLog.legacyFetchOffsetsBefore): offsets of segment starts, not of records.

Before KIP-79 a log was searched by time through its segment files: for a timestamp the answer is the base offsets
of the segments last modified at or before it (newest first, at most max_num_offsets of them), for latest the log
end offset (and the segment bases below it), for earliest the log start offset. Reads a snapshot of the segment
list; the files' mtimes are only looked at for a real timestamp.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kbroker.storage.log import Log

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


def legacy_offsets_before(log: Log, timestamp: int, max_num_offsets: int, *, from_consumer: bool) -> list[int]:
    segments = log.segments
    start = log.log_start_offset
    bases = [max(seg.base_offset, start) for seg in segments]
    last_has_data = segments[-1].size > 0
    if last_has_data:
        bases.append(log.log_end_offset)
    if timestamp == LATEST_TIMESTAMP:
        index = len(bases) - 1
    elif timestamp == EARLIEST_TIMESTAMP:
        index = 0
    else:
        modified = [_last_modified_ms(seg.log_path) for seg in segments]
        if last_has_data:
            modified.append(int(time.time() * 1000))
        index = len(bases) - 1
        while index >= 0 and modified[index] > timestamp:
            index -= 1
    count = max(0, min(max_num_offsets, index + 1))
    offsets = sorted((bases[index - j] for j in range(count)), reverse=True)
    if not from_consumer:
        return offsets
    # A consumer is never pointed past the high watermark (Kafka's Partition.legacyFetchOffsetsForTimestamp).
    hw = log.high_watermark
    if any(o > hw for o in offsets):
        return [hw, *(o for o in offsets if o <= hw)]
    return offsets


def _last_modified_ms(path: os.PathLike[str] | str) -> int:
    try:
        return int(os.stat(path).st_mtime * 1000)
    except FileNotFoundError:  # deleted by retention meanwhile: as old as can be
        return 0

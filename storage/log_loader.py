"""Opening a log directory (Kafka's LogLoader): leftover files of interrupted operations, unclean recovery."""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from kbroker.protocol.control_records import EndTxnMarker, parse_end_txn_marker
from kbroker.protocol.records import RecordBatchHeader
from kbroker.storage.recovery import next_offset_of_segment_file, recover_segment
from kbroker.storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    BatchLocation,
    LogSegment,
)
from kbroker.storage.transaction_index import TXN_INDEX_SUFFIX

logger = logging.getLogger("kbroker.storage")

INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


def segment_bases(dir: Path) -> list[int]:
    bases = []
    for p in dir.iterdir():
        name = p.name
        if name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit():
            bases.append(int(name[: -len(LOG_SUFFIX)]))
    return bases


def _drop_segments_merged_into(dir: Path, base: int, swap_log: Path) -> None:
    # The cleaner merges groups of segments into one: a swap covering other segments' offsets replaces them
    # all (Kafka's LogLoader deletes the segments inside the swap segment's offset range).
    end = next_offset_of_segment_file(swap_log)
    for other in segment_bases(dir):
        if base < other < end:
            logger.info("Deleting segment %d of %s: merged into the cleaned segment %d", other, dir.name, base)
            for suffix in (LOG_SUFFIX, *INDEX_SUFFIXES):
                (dir / f"{other:020d}{suffix}").unlink(missing_ok=True)


def cleanup_leftover_files(dir: Path) -> set[int]:
    """Finish or undo interrupted deletes/cleanings; returns segment bases whose indexes need a rebuild.

    .cleaned files are an unfinished cleaning (discard). A .swap log means the cleaned copy was
    complete: it replaces the original, and all its indexes (the transaction index too) are rebuilt.
    A .swap index beside a log already swapped in (a crash amid the renames) also asks for a rebuild.
    .deleted files were already out of the log.
    """
    rebuild: set[int] = set()
    for p in list(dir.iterdir()):
        name = p.name
        if name.endswith(DELETED_SUFFIX) or name.endswith(CLEANED_SUFFIX):
            p.unlink(missing_ok=True)
    for p in list(dir.iterdir()):
        name = p.name
        if not name.endswith(SWAP_SUFFIX):
            continue
        base_name = name[: -len(SWAP_SUFFIX)]
        if base_name.endswith(LOG_SUFFIX):
            stem = base_name[: -len(LOG_SUFFIX)]
            if stem.isdigit():
                _drop_segments_merged_into(dir, int(stem), p)
            os.replace(p, dir / base_name)
            if stem.isdigit():
                rebuild.add(int(stem))
                for suffix in INDEX_SUFFIXES:
                    (dir / f"{stem}{suffix}").unlink(missing_ok=True)
        else:
            p.unlink(missing_ok=True)
            for suffix in INDEX_SUFFIXES:
                stem = base_name[: -len(suffix)]
                if base_name.endswith(suffix) and stem.isdigit():
                    rebuild.add(int(stem))
    for p in list(dir.iterdir()):
        name = p.name
        for suffix in INDEX_SUFFIXES:
            if name.endswith(suffix):
                stem = name[: -len(suffix)]
                if stem.isdigit() and not (dir / f"{stem}{LOG_SUFFIX}").exists():
                    p.unlink(missing_ok=True)
    return {b for b in rebuild if (dir / f"{b:020d}{LOG_SUFFIX}").exists()}


def recover_segments(tp: str, segments: list[LogSegment], recovery_point: int, rebuild: set[int],
                     epochs: list[tuple[int, int]] | None = None) -> tuple[list[LogSegment], set[int]]:
    """Unclean start: trust segments wholly below the recovery point (index sanity only), recover the rest.

    Returns the segments left and the bases of those recovered (their transaction indexes are empty now:
    the caller rebuilds them from the producer state); epochs collects (leader epoch, base offset) of the
    recovered batches.
    """
    bases = [s.base_offset for s in segments]
    first_unflushed = max(0, bisect.bisect_right(bases, recovery_point) - 1)
    next_offset = segments[0].base_offset
    recovered: set[int] = set()
    for i, seg in enumerate(segments):
        if i < first_unflushed and seg.base_offset not in rebuild and _index_sane(seg):
            next_offset = segments[i + 1].base_offset
            continue
        result = recover_segment(seg, next_offset if i else seg.base_offset, epochs)
        recovered.add(seg.base_offset)
        next_offset = result.next_offset
        if result.truncated_bytes:
            logger.warning(
                "Truncated %s segment %d at position %d (next offset %d): removed %d bytes (%s)",
                tp, seg.base_offset, result.valid_bytes, result.next_offset, result.truncated_bytes, result.reason)
            for later in segments[i + 1:]:
                logger.warning("Deleted %s segment %d (%d bytes) after truncation at offset %d",
                               tp, later.base_offset, later.size, result.next_offset)
                later.delete_files()
            return segments[: i + 1], recovered
    return segments, recovered


def _index_sane(seg: LogSegment) -> bool:
    try:
        seg.index.sanity_check()
        seg.time_index.sanity_check()
        seg.txn_index.sanity_check()
    except Exception:
        return False
    offset, position = seg.index.last_entry()
    return position < max(seg.size, 1) and offset >= seg.base_offset


def batches_with_markers(segments: Sequence[LogSegment], start: int, end: int,
                         max_size: int) -> Iterator[tuple[RecordBatchHeader, EndTxnMarker | None]]:
    """Headers of the batches holding offsets in [start, end), with the markers of control batches
    (the only batches whose records a producer state replay reads)."""
    for seg, loc in batch_locations(segments, start, end):
        h = loc.header
        marker = None
        if h.is_control and h.producer_id >= 0:
            marker = parse_end_txn_marker(seg.read_batch_bytes(loc), max_size=max_size)
        yield h, marker


def batch_locations(segments: Sequence[LogSegment], start: int, end: int) -> Iterator[tuple[LogSegment, BatchLocation]]:
    """The batches holding offsets in [start, end), from the segment files."""
    for i, seg in enumerate(segments):
        seg_end = segments[i + 1].base_offset if i + 1 < len(segments) else end
        if seg_end <= start or seg.size == 0:
            continue
        if seg.base_offset >= end:
            return
        position = 0
        if start > seg.base_offset:
            first = seg.translate_offset(start)
            if first is None:
                continue
            position = first.position
        for loc in seg.iter_batches(position):
            h = loc.header
            if h.base_offset >= end:
                return
            if h.next_offset > start:
                yield seg, loc

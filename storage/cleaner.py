"""LogCleaner: key-based compaction for logs with cleanup.policy containing "compact".

One pass over a log:
1. the cleanable range ends at the active segment, the high watermark and the first segment
   holding records younger than min.compaction.lag.ms; only whole segments are cleaned;
2. an offset map (key -> latest offset) is built from the dirty part (offsets >= the cleaner
   checkpoint);
3. every cleanable segment is copied into `<base>.log.cleaned` keeping, per batch, the records
   that are the latest for their key; then renamed to `.swap` and swapped in under the log lock.
   Readers holding the old segment's fd keep reading the old file (closed after
   file.delete.delay.ms).

Batches keep baseOffset, lastOffsetDelta, producer id/epoch/base sequence and compression. A
batch emptied of records is dropped, except the last batch of a producer the log still tracks
(Kafka's RETAIN_EMPTY: it holds that producer's sequence and epoch), which is kept as an empty
batch written without compression, as Kafka's writeEmptyHeader does: an empty compressed batch
(an lz4 frame of nothing with recordsCount 0) makes librdkafka abort. Such batches left by older
versions are rewritten by the next pass and when a log is loaded (rewrite_empty_compressed_batches).
Consecutive segments are cleaned into one, grouped as Kafka's groupSegmentsBySize does. Tombstones get a delete horizon (KIP-534: attribute bit 6 and
baseTimestamp) of now + delete.retention.ms the first time the cleaner sees them and are
dropped by the first pass after it. Transactions follow Kafka's rules (storage/cleaner_transactions.py):
aborted data goes, markers stay until their transaction's data is gone and delete.retention.ms passed,
nothing at or after the last stable offset is cleaned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kbroker.protocol.control_records import parse_end_txn_marker
from kbroker.protocol.records import (
    COMPRESSION_NONE,
    DEFAULT_MAX_DECOMPRESSED,
    TIMESTAMP_LOG_APPEND_TIME,
    Record,
    RecordBatchHeader,
    build_batch,
    decode_records,
    max_decompressed_size,
    parse_batch_header,
)
from kbroker.storage.cleaner_transactions import (
    CleanedTransactionMetadata,
    LastRecord,
    empty_batch,
    filter_aborted_batch,
    filter_control_batch,
    is_last_batch_of_producer,
    last_records_of_producers,
)
from kbroker.storage.index import OffsetIndex, TimeIndex
from kbroker.storage.log import Log
from kbroker.storage.segment import CLEANED_SUFFIX, SWAP_SUFFIX, LogSegment, segment_file_name

logger = logging.getLogger("kbroker.storage")

_INT32_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class CleanerStats:
    segments_cleaned: int = 0
    segments_rewritten: int = 0
    segments_merged: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    end_offset: int = 0


@dataclass(slots=True)
class _CleanableRange:
    segments: list[LogSegment]
    first_dirty: int
    end_offset: int
    clean_bytes: int
    dirty_bytes: int

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def cleanable_range(log: Log, now_ms: int) -> _CleanableRange | None:
    segments = log.segments
    if len(segments) < 2:
        return None
    cfg = log.config
    first_dirty = max(log.cleaner_checkpoint, log.log_start_offset)
    # Open transactions are never cleaned: the range ends at the last stable offset.
    uncleanable = min(segments[-1].base_offset, log.last_stable_offset)
    if cfg.min_compaction_lag_ms > 0:
        for i, seg in enumerate(segments[:-1]):
            seg_end = segments[i + 1].base_offset
            if seg_end > first_dirty and seg.max_timestamp > now_ms - cfg.min_compaction_lag_ms:
                uncleanable = min(uncleanable, seg.base_offset)
                break
    chosen: list[LogSegment] = []
    clean_bytes = dirty_bytes = 0
    end_offset = segments[0].base_offset
    for i, seg in enumerate(segments[:-1]):
        seg_end = segments[i + 1].base_offset
        if seg_end > uncleanable:
            break
        chosen.append(seg)
        end_offset = seg_end
        if seg_end <= first_dirty:
            clean_bytes += seg.size
        else:
            dirty_bytes += seg.size
    if not chosen:
        return None
    return _CleanableRange(chosen, first_dirty, end_offset, clean_bytes, dirty_bytes)


def max_compaction_delay(log: Log, now_ms: int) -> int:
    """Kafka's LogCleanerManager.maxCompactionDelay (KIP-354): how far past max.compaction.lag.ms the oldest
    dirty record of a non-active segment is (by its segment's first batch timestamp); > 0 means clean now,
    whatever the dirty ratio."""
    lag = log.config.max_compaction_lag_ms
    if lag >= _LONG_MAX:
        return 0
    segments = log.segments
    first_dirty = max(log.cleaner_checkpoint, log.log_start_offset)
    earliest = _LONG_MAX
    for i, seg in enumerate(segments[:-1]):
        if segments[i + 1].base_offset <= first_dirty:
            continue
        ts = seg.rolling_base_ms()
        if ts is not None and 0 < ts < earliest:
            earliest = ts
    clean_until = now_ms - lag
    return clean_until - earliest if earliest < clean_until else 0


def clean_log(log: Log, now_ms: int | None = None, *, force: bool = False) -> CleanerStats | None:
    """One compaction pass; None if there was nothing (worth) cleaning."""
    now_ms = _now_ms() if now_ms is None else now_ms
    cfg = log.config
    if not cfg.compact or log.closed:
        return None
    rng = cleanable_range(log, now_ms)
    if rng is None:
        return None
    horizon_due = log.tombstone_horizon_ms is not None and log.tombstone_horizon_ms <= now_ms
    # Kafka's grabFilthiestCompactedLog: a ratio strictly above min.cleanable.dirty.ratio (so 1.0 never), or
    # dirty records past max.compaction.lag.ms.
    overdue = rng.dirty_bytes > 0 and max_compaction_delay(log, now_ms) > 0
    if not force and not horizon_due and not overdue and (
        rng.dirty_bytes == 0 or rng.dirty_ratio <= cfg.min_cleanable_dirty_ratio
    ):
        return None
    stats = CleanerStats(end_offset=rng.end_offset)
    # Decompression bomb guard: the produce path bounds batches by the same ratio over max.message.bytes.
    max_size = max_decompressed_size(cfg.max_message_bytes)
    aborted = log.collect_aborted_transactions(rng.segments[0].base_offset, rng.end_offset)
    offset_map = _build_offset_map(rng.segments, rng.first_dirty, rng.end_offset, stats, max_size,
                                   CleanedTransactionMetadata(aborted))
    txn = CleanedTransactionMetadata(aborted)
    last_records = last_records_of_producers(log.producer_states())
    next_horizon: int | None = None

    def keep(h: RecordBatchHeader, raw: bytes) -> tuple[bytes | None, int | None]:
        if h.is_control:
            return filter_control_batch(h, raw, txn, last_records, now_ms, cfg.delete_retention_ms, max_size)
        if h.is_transactional and txn.on_batch_read(h):
            stats.records_removed += h.records_count
            return filter_aborted_batch(h, raw, last_records), None
        return _filter_batch(h, raw, offset_map, last_records, now_ms, cfg.delete_retention_ms, stats, max_size)

    for group in group_segments_by_size(log, rng.segments, rng.end_offset):
        new, horizon = _clean_segments(log, group, keep, stats, txn)
        if horizon is not None:
            next_horizon = horizon if next_horizon is None else min(next_horizon, horizon)
        stats.segments_cleaned += len(group)
        if new is None:
            continue
        if log.replace_segments(group, new):
            stats.segments_rewritten += len(group)
            stats.segments_merged += len(group) - 1
        else:
            new.delete_files()
    log.cleaner_checkpoint = max(log.cleaner_checkpoint, rng.end_offset)
    log.tombstone_horizon_ms = next_horizon
    logger.info(
        "Cleaned %s up to offset %d: %d segments (%d rewritten, %d merged away), %d -> %d bytes, removed %d "
        "records (%d tombstones)", log.name, rng.end_offset, stats.segments_cleaned, stats.segments_rewritten,
        stats.segments_merged, stats.bytes_read, stats.bytes_written, stats.records_removed, stats.tombstones_removed)
    return stats


def _build_offset_map(segments: list[LogSegment], first_dirty: int, end_offset: int,
                      stats: CleanerStats, max_size: int, txn: CleanedTransactionMetadata) -> dict[bytes, int]:
    """key -> latest offset in [first_dirty, end_offset); records of aborted transactions never count."""
    offset_map: dict[bytes, int] = {}
    for seg in segments:
        for loc in seg.iter_batches():
            h = loc.header
            if h.base_offset >= end_offset:
                break
            if h.is_control:
                # Markers are fed in order even below first_dirty: they end the producer's aborted transaction.
                marker = parse_end_txn_marker(seg.read_batch_bytes(loc), max_size=max_size) if h.records_count else None
                txn.on_control_batch_read(h, marker)
                continue
            if h.is_transactional and txn.on_batch_read(h):
                continue
            if h.last_offset < first_dirty or h.records_count == 0:
                continue
            for rec in decode_records(seg.read_batch_bytes(loc), max_size=max_size):
                if rec.key is not None and first_dirty <= rec.offset < end_offset:
                    offset_map[rec.key] = rec.offset
    return offset_map


def group_segments_by_size(log: Log, segments: list[LogSegment], end_offset: int) -> list[list[LogSegment]]:
    """Consecutive segments cleaned into one (Kafka's groupSegmentsBySize): a group stays within segment.bytes
    and segment.index.bytes (offset and time index) as the segments are now, and its offsets within the int32
    range of relative offsets. Without it every roll leaves one more segment, most of them empty after a few
    passes, each holding open files."""
    cfg = log.config
    ends = [seg.base_offset for seg in segments[1:]] + [end_offset]
    groups: list[list[LogSegment]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        size, index_size, time_index_size = (segments[i].size, _index_bytes(segments[i].index),
                                             _index_bytes(segments[i].time_index))
        i += 1
        while i < len(segments):
            seg = segments[i]
            if (size + seg.size > cfg.segment_bytes
                    or index_size + _index_bytes(seg.index) > cfg.segment_index_bytes
                    or time_index_size + _index_bytes(seg.time_index) > cfg.segment_index_bytes
                    or (seg.size > 0 and ends[i] - 1 - group[0].base_offset > _INT32_MAX)):
                break
            group.append(seg)
            size += seg.size
            index_size += _index_bytes(seg.index)
            time_index_size += _index_bytes(seg.time_index)
            i += 1
        groups.append(group)
    return groups


def _index_bytes(index: OffsetIndex | TimeIndex) -> int:
    return index.entries * index.entry_size


BatchTransform = Callable[[RecordBatchHeader, bytes], "tuple[bytes | None, int | None]"]


def _clean_segments(log: Log, group: list[LogSegment], keep: BatchTransform, stats: CleanerStats,
                    txn: CleanedTransactionMetadata | None = None) -> tuple[LogSegment | None, int | None]:
    """Copy the retained batches of a group of segments into one .cleaned segment at the group's base offset,
    renamed .swap when complete; (None, horizon) when a lone segment would not change."""
    cfg = log.config
    first = group[0]
    for suffix in (".log", ".index", ".timeindex", ".txnindex"):
        (first.dir / (segment_file_name(first.base_offset, suffix) + CLEANED_SUFFIX)).unlink(missing_ok=True)
    new = LogSegment(first.dir, first.base_offset, index_interval_bytes=cfg.index_interval_bytes,
                     max_index_size=cfg.segment_index_bytes, suffix=CLEANED_SUFFIX, create=True)
    changed = len(group) > 1
    min_horizon: int | None = None
    if txn is not None:
        txn.cleaned_index = new.txn_index
    try:
        for seg in group:
            for loc in seg.iter_batches():
                raw = seg.read_batch_bytes(loc)
                stats.bytes_read += len(raw)
                out, horizon = keep(loc.header, raw)
                if horizon is not None:
                    min_horizon = horizon if min_horizon is None else min(min_horizon, horizon)
                if out is not raw:
                    changed = True
                if out is None:
                    continue
                new.append(out, [(0, parse_batch_header(out))])
                stats.bytes_written += len(out)
        if not changed:
            new.delete_files()
            return None, min_horizon
        new.on_become_inactive()
        new.flush()
        new.close_writers()
        new.change_file_suffix(SWAP_SUFFIX)
        return new, min_horizon
    except BaseException:
        new.delete_files()
        raise
    finally:
        if txn is not None:
            txn.cleaned_index = None


def _is_old_empty_compressed(h: RecordBatchHeader) -> bool:
    return h.records_count == 0 and h.compression != COMPRESSION_NONE and not h.is_control


def rewrite_empty_compressed_batches(log: Log, end_offset: int) -> int:
    """Rewrite the segments below end_offset (the cleaned part) that hold an empty compressed batch an older
    cleaner wrote, before any fetch can hand one to a client; returns how many batches were rewritten.

    Only the headers are read. Run when a log is loaded, before the broker serves it."""
    found = 0
    stats = CleanerStats()
    last_records = last_records_of_producers(log.producer_states())

    def fix(h: RecordBatchHeader, raw: bytes) -> tuple[bytes | None, int | None]:
        return (_emptied(h, last_records) if _is_old_empty_compressed(h) else raw), None

    for seg in log.segments[:-1]:
        if seg.base_offset >= end_offset:
            break
        bad = sum(1 for loc in seg.iter_batches() if _is_old_empty_compressed(loc.header))
        if not bad:
            continue
        new, _ = _clean_segments(log, [seg], fix, stats)
        if new is not None and log.replace_segments([seg], new):
            found += bad
            logger.info("Rewrote %d empty compressed batches in segment %d of %s", bad, seg.base_offset, log.name)
        elif new is not None:
            new.delete_files()
    return found


def _emptied(h: RecordBatchHeader, last_records: dict[int, LastRecord]) -> bytes | None:
    """What is left of a data batch with no records: nothing, or for a producer's last batch its header alone,
    uncompressed (Kafka's BatchRetention.RETAIN_EMPTY and DefaultRecordBatch.writeEmptyHeader)."""
    if h.producer_id >= 0 and is_last_batch_of_producer(h, last_records):
        return empty_batch(h)
    return None


def _filter_batch(h: RecordBatchHeader, raw: bytes, offset_map: dict[bytes, int],
                  last_records: dict[int, LastRecord], now_ms: int, delete_retention_ms: int, stats: CleanerStats,
                  max_size: int = DEFAULT_MAX_DECOMPRESSED) -> tuple[bytes | None, int | None]:
    """Returns (batch bytes to keep — `raw` itself when unchanged — or None, tombstone horizon)."""
    if _is_old_empty_compressed(h):
        return _emptied(h, last_records), None  # left by an older cleaner: see the module docstring
    if h.is_control or h.records_count == 0:
        return raw, None
    records = decode_records(raw, max_size=max_size)
    stats.records_read += len(records)
    if any(not h.base_offset <= r.offset <= h.last_offset for r in records):
        # Records whose offsets lie outside their batch cannot be rewritten faithfully: keep the batch as it is.
        logger.warning("Keeping a batch at offset %d uncleaned: its records' offsets lie outside the batch",
                       h.base_offset)
        return raw, None
    horizon = h.delete_horizon_ms if h.has_delete_horizon else None
    retained: list[Record] = []
    tombstones_kept = False
    for rec in records:
        if rec.key is None:
            continue  # cannot be compacted; Kafka's cleaner drops these too
        latest = offset_map.get(rec.key)
        if latest is not None and rec.offset < latest:
            continue
        if rec.value is None:
            if horizon is not None and now_ms >= horizon:
                stats.tombstones_removed += 1
                continue
            tombstones_kept = True
        retained.append(rec)
    stats.records_removed += len(records) - len(retained)
    new_horizon = horizon
    if tombstones_kept and horizon is None:
        new_horizon = now_ms + delete_retention_ms
    if len(retained) == len(records) and new_horizon == horizon:
        return raw, (new_horizon if tombstones_kept else None)
    if not retained:
        return _emptied(h, last_records), None
    log_append = h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    out = build_batch(
        retained, base_offset=h.base_offset, compression=h.compression, producer_id=h.producer_id,
        producer_epoch=h.producer_epoch, base_sequence=h.base_sequence, is_transactional=h.is_transactional,
        timestamp_type=h.timestamp_type, partition_leader_epoch=h.partition_leader_epoch,
        last_offset_delta=h.last_offset_delta, max_timestamp=h.max_timestamp if log_append else None,
        delete_horizon_ms=new_horizon if tombstones_kept else None)
    return out, (new_horizon if tombstones_kept else None)


class LogCleaner:
    """Background thread compacting the logs returned by `logs` every backoff_ms (or sooner when busy)."""

    def __init__(self, logs: Callable[[], Iterable[Log]], *, backoff_ms: int = 15000,
                 on_cleaned: Callable[[Log], None] | None = None) -> None:
        self._logs = logs
        self.backoff_ms = backoff_ms
        self._on_cleaned = on_cleaned
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: set[int] = set()

    def clean_once(self, now_ms: int | None = None) -> int:
        cleaned = 0
        for log in list(self._logs()):
            if self._stop.is_set():
                break
            if id(log) in self._failed or not log.config.compact or log.closed:
                continue
            try:
                if clean_log(log, now_ms) is not None:
                    cleaned += 1
                    if self._on_cleaned is not None:
                        self._on_cleaned(log)
            except Exception:
                if log.closed:
                    continue  # deleted or shut down under us
                # Kafka marks such a partition uncleanable rather than retrying forever.
                logger.exception("Cleaner failed on %s; marking it uncleanable", log.name)
                self._failed.add(id(log))
        return cleaned

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kbroker-log-cleaner", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.clean_once()
            except Exception:
                logger.exception("Log cleaner pass failed")
                busy = 0
            if not busy:
                self._stop.wait(self.backoff_ms / 1000)

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

"""Log: one topic-partition's segmented log (Kafka's UnifiedLog for a single local replica).

Concurrency model: appends, rolls, truncation and segment deletion take `_lock`; reads take
no lock and work on snapshots (the segment tuple is replaced copy-on-write, LEO is read
before the segment list so it never points past what the snapshot holds). fsync happens
outside `_lock` with group commit, so appends keep flowing while a flush is in progress.
"""

from __future__ import annotations

import bisect
import errno
import logging
import operator
import shutil
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kbroker.protocol.control_records import EndTxnMarker, build_end_txn_marker_batch, parse_end_txn_marker
from kbroker.protocol.legacy_records import MAGIC_V1, convert_produced_set, first_magic
from kbroker.protocol.records import (
    ATTR_COMPRESSION_MASK,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    NO_TIMESTAMP,
    BatchesSummary,
    RecordBatchHeader,
    decode_records,
    max_decompressed_size,
    plain_client_batch,
    recompress_batches,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batches,
)
from kbroker.storage.atomic_file import fsync_dir
from kbroker.storage.config import LogConfig
from kbroker.storage.errors import (
    InvalidTxnStateError,
    KafkaStorageError,
    LogReplacedError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from kbroker.storage.flush_stats import FLUSH_STATS
from kbroker.storage.index import _INT32_MAX
from kbroker.storage.leader_append import append_plain as _append_one
from kbroker.storage.leader_append import next_batch
from kbroker.storage.leader_epoch_cache import LeaderEpochFileCache
from kbroker.storage.log_loader import (
    INDEX_SUFFIXES,
    batches_with_markers,
    cleanup_leftover_files,
    recover_segments,
    segment_bases,
)
from kbroker.storage.log_replica import ReplicaLogMixin
from kbroker.storage.producer_state import (
    BatchMetadata,
    ProducerAppendInfo,
    ProducerStateEntry,
    ProducerStateManager,
    VerificationGuard,
    validate_client_batch,
)
from kbroker.storage.recovery import recover_segment
from kbroker.storage.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    FileRecordsSlice,
    LogSegment,
)
from kbroker.storage.transaction_index import AbortedTxn, CompletedTxn, collect_aborted_txns

logger = logging.getLogger("kbroker.storage")

# ListOffsets special timestamps.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4


# A v2 batch's max timestamp (the int64 at 35), read from a marker batch without parsing its header.
_MAX_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_AT = 35


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class LogAppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time: int
    log_start_offset: int
    num_records: int
    valid_bytes: int


# LogAppendInfo's fields in its order, as Log._append_plain returns them.
PlainAppended = tuple[int, int, int, int, int, int, int, int]


@dataclass(slots=True)
class FetchDataInfo:
    fetch_offset: int
    records: FileRecordsSlice | None
    first_entry_incomplete: bool = False
    # Snapshots taken with the read, for the fetch response.
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    last_stable_offset: int = -1
    # Only for isolation_committed reads: the aborted transactions overlapping the records returned.
    aborted_transactions: list[AbortedTxn] | None = None

    @property
    def size(self) -> int:
        return self.records.size if self.records is not None else 0


# Extra hook for checks of client appends beyond the built-in producer state validation
# (ProducerStateManager), e.g. transaction verification. Called under the log lock with final offsets
# assigned, after the built-in checks and before anything is written; never for internal writers or
# markers. Raise to reject the request; return a LogAppendInfo to answer without appending; None to proceed.
ProducerStateValidator = Callable[["Log", BatchesSummary, int], "LogAppendInfo | None"]


@dataclass(slots=True)
class _PendingDelete:
    due_ms: int
    segment: LogSegment



def _ongoing(entry: ProducerStateEntry | None, producer_epoch: int) -> bool:
    return entry is not None and entry.current_txn_first_offset is not None and entry.producer_epoch == producer_epoch


# Log._append_plain, the leader's fast path for the common client append; False sends every append the general
# way (tests compare the two).
PLAIN_APPEND = True


class Log(ReplicaLogMixin):
    def __init__(self, dir: Path, topic: str, partition: int, config: LogConfig, segments: Sequence[LogSegment],
                 *, log_start_offset: int, log_end_offset: int, recovery_point: int) -> None:
        self.topic = topic
        self.partition = partition
        self.name = f"{topic}-{partition}"  # the topic-partition, as Kafka's logs name themselves
        self.config = config
        # What every append asks of the config, computed once per config object (LogConfig is frozen, its
        # properties are calls): see _config_facts.
        self._facts_config: LogConfig | None = None
        self._facts: tuple[bool, bool, bool, int] = (False, False, False, 0)
        self.producer_state = ProducerStateManager(dir, self.name)
        self.leader_epoch_cache = LeaderEpochFileCache(dir, self.name)
        self.leader_epoch = 0
        self._leading = True
        self._hw_tracks_leo = True
        self._dir = dir
        self._lock = threading.RLock()
        self._segments: tuple[LogSegment, ...] = tuple(segments)
        self._log_start_offset = log_start_offset
        self._leo = log_end_offset
        self._hw = log_end_offset
        # First offset of the oldest open transaction (a copy of the producer state's, for lock-free reads).
        self._first_unstable: int | None = None
        self._recovery_point = recovery_point
        self._appended_messages = 0
        self._flushed_messages = 0
        self._flush_cond = threading.Condition()
        self._flush_in_progress = False
        self._last_flush_ms = _now_ms()
        self._dir_dirty = False
        self._pending_deletes: list[_PendingDelete] = []
        # Told when a segment is queued for deletion (LogManager keeps the logs that have some, so its deletion
        # poll does not touch every log every second).
        self.on_pending_delete: Callable[[Log], None] | None = None
        self._closed = False
        # The log that took this one's place in another log dir (AlterReplicaLogDirs); appends are refused from then.
        self.replaced_by: Log | None = None
        self.validate_producer_state: ProducerStateValidator | None = None
        # Compaction state: offsets below cleaner_checkpoint are clean (persisted by LogManager in
        # cleaner-offset-checkpoint); tombstone_horizon_ms forces a pass when tombstones expire.
        self.cleaner_checkpoint = 0
        self.tombstone_horizon_ms: int | None = None

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, dir: str | Path, topic: str, partition: int, config: LogConfig, *, recovery_point: int = 0,
             log_start_offset: int = 0, clean_shutdown: bool, high_watermark: int | None = None) -> Log:
        """high_watermark: the checkpointed one of a replicated partition (None: the log end, as a single
        replica has everything committed)."""
        dir = Path(dir)
        dir.mkdir(parents=True, exist_ok=True)
        rebuild = cleanup_leftover_files(dir)
        segments: list[LogSegment] = []
        for base in sorted(segment_bases(dir)):
            missing_index = not (dir / f"{base:020d}{INDEX_SUFFIX}").exists()
            seg = LogSegment(dir, base, index_interval_bytes=config.index_interval_bytes,
                             max_index_size=config.segment_index_bytes)
            if missing_index and seg.size > 0:
                rebuild.add(base)
            segments.append(seg)
        tp = f"{topic}-{partition}"
        # Segments whose indexes were rebuilt; their transaction indexes come back from the producer state.
        recovered: set[int] = set()
        # (epoch, base offset) of the batches recovery walks: the checkpoint may not have the newest (flush).
        epochs: list[tuple[int, int]] = []
        if not segments:
            segments.append(cls._new_segment(dir, max(log_start_offset, 0), config))
        elif not clean_shutdown:
            segments, recovered = recover_segments(tp, segments, recovery_point, rebuild, epochs)
        elif rebuild:
            for seg in segments:
                if seg.base_offset in rebuild:
                    recover_segment(seg, seg.base_offset)
                    recovered.add(seg.base_offset)
        leo = segments[-1].read_next_offset()
        # Resolve the active segment's lazy max timestamp now, before appends and reads race on it.
        _ = segments[-1].max_timestamp_and_offset
        log_start_offset = max(log_start_offset, segments[0].base_offset)
        log = cls(dir, topic, partition, config, segments, log_start_offset=log_start_offset,
                  log_end_offset=leo, recovery_point=min(recovery_point, leo))
        if leo < log_start_offset:
            # DeleteRecords moved the start past everything we still have.
            log.truncate_fully_and_start_at(log_start_offset)
        cache = log.leader_epoch_cache
        for epoch, base_offset in epochs:
            # Only where the checkpoint disagrees with the batches: re-assigning an epoch it already has further
            # back would move that epoch's start up to the first recovered batch.
            if cache.epoch_for_offset(base_offset) != epoch:
                cache.assign(epoch, base_offset)
        # Epochs past what recovery kept, or before the log start, name no batch any more.
        cache.truncate_from_end(log._leo)
        cache.truncate_from_start(log._log_start_offset)
        if high_watermark is not None:
            log._hw = max(min(high_watermark, log._leo), log._log_start_offset)
        log._load_producer_state(reload_from_clean_shutdown=clean_shutdown,
                                 rebuild_txn_indexes={b for b in recovered if b >= log._segments[0].base_offset})
        if not clean_shutdown:
            log.flush()
        return log

    def _load_producer_state(self, *, reload_from_clean_shutdown: bool,
                             rebuild_txn_indexes: set[int] | None = None) -> None:
        """Latest snapshot at or below LEO plus the batches after it (Kafka's loadProducerState).

        rebuild_txn_indexes: bases of segments whose (emptied) transaction indexes are rebuilt on the way,
        so the replay starts at a snapshot at or below the first of them.
        """
        with self._lock:
            psm = self.producer_state
            leo = self._leo
            max_snapshot = min(rebuild_txn_indexes) if rebuild_txn_indexes else leo
            try:
                latest = psm.load_latest_snapshot(max_snapshot)
            except OSError as e:
                raise KafkaStorageError(f"error loading producer state of {self.name}: {e}") from e
            if latest is None and reload_from_clean_shutdown and not rebuild_txn_indexes:
                # A log written before producer snapshots existed (Kafka's upgrade path): a clean stop
                # always leaves a snapshot, so there is nothing to scan for.
                psm.update_map_end_offset(leo)
                if leo > self._segments[0].base_offset:
                    self._take_producer_snapshot()
                self._first_unstable = psm.first_unstable_offset
                return
            self._rebuild_producer_state_from(psm.map_end_offset if latest is not None else 0, leo,
                                              rebuild_txn_indexes)

    def _rebuild_producer_state_from(self, start: int, end: int, rebuild_txn_indexes: set[int] | None = None) -> None:
        psm = self.producer_state
        started = time.monotonic()
        batches = batches_with_markers(self._segments, start, end,
                                       max_decompressed_size(self.config.max_message_bytes))
        if rebuild_txn_indexes:
            def on_completed(txn: CompletedTxn, last_stable_offset: int) -> None:
                seg = self._segment_for(txn.last_offset)
                if txn.is_aborted and seg.base_offset in rebuild_txn_indexes:
                    seg.txn_index.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset,
                                                    last_stable_offset))
            try:
                n = psm.load_batches(batches, on_completed)
            except OSError as e:
                raise KafkaStorageError(f"error rebuilding transaction indexes of {self.name}: {e}") from e
        else:
            n = psm.load_batches(batches)
        psm.on_log_start_offset_incremented(self._log_start_offset)
        psm.update_map_end_offset(end)
        self._first_unstable = psm.first_unstable_offset
        if n:
            logger.info("Loaded producer state of %s from offset %d to %d: %d batches, %d producers, %d open "
                        "transactions in %.3f s", self.name, start, end, n, len(psm), len(psm.ongoing_txns),
                        time.monotonic() - started)

    def _segment_for(self, offset: int) -> LogSegment:
        segments = self._segments
        return segments[max(0, bisect.bisect_right(segments, offset, key=lambda s: s.base_offset) - 1)]

    def _take_producer_snapshot(self, *, sync: bool = False) -> None:
        try:
            self.producer_state.take_snapshot(sync=sync)
        except OSError as e:
            logger.warning("Failed to write producer state snapshot of %s at offset %d: %s", self.name,
                           self.producer_state.map_end_offset, e)

    @staticmethod
    def _new_segment(dir: Path, base_offset: int, config: LogConfig) -> LogSegment:
        for suffix in (LOG_SUFFIX, *INDEX_SUFFIXES):
            # A stale file (e.g. an index of a segment lost in a crash) must not leak into the new one.
            (dir / f"{base_offset:020d}{suffix}").unlink(missing_ok=True)
        return LogSegment(dir, base_offset, index_interval_bytes=config.index_interval_bytes,
                          max_index_size=config.segment_index_bytes, create=True)

    # -- simple state --------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        return self._dir

    @dir.setter
    def dir(self, value: Path) -> None:
        # LogManager renames the directory of a deleted log; snapshots follow it.
        self._dir = value
        self.producer_state.dir = value
        self.leader_epoch_cache.dir = value

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._leo

    @property
    def high_watermark(self) -> int:
        return self._hw

    # What any fetch answer from this log depends on besides the request: log end, high watermark, log start and the
    # first unstable offset (the last stable offset follows from those). Equal tuples, equal answers. Read through a
    # C getter: a leader checks it for every idle partition of every follower fetch.
    fetch_state = property(operator.attrgetter("_leo", "_hw", "_log_start_offset", "_first_unstable"))
    # What a follower's Fetch tells its leader of this log: its log end (the fetch offset) and log start.
    fetch_position = property(operator.attrgetter("_leo", "_log_start_offset"))

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark (never below the log start)."""
        return self._lso(self._hw)

    def _lso(self, hw: int) -> int:
        first_unstable = self._first_unstable
        if first_unstable is not None and first_unstable < hw:
            return max(first_unstable, self._log_start_offset)
        return hw

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def unflushed_messages(self) -> int:
        return self._appended_messages - self._flushed_messages

    @property
    def flush_needed(self) -> bool:
        """flush.messages reached: the broker should flush() before acknowledging."""
        return self.unflushed_messages >= self.config.flush_messages

    @property
    def last_flush_ms(self) -> int:
        return self._last_flush_ms

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return self._segments

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size(self) -> int:
        return sum(s.size for s in self._segments)

    def update_config(self, config: LogConfig) -> None:
        self.config = config

    # -- append --------------------------------------------------------------------------------

    def append_as_leader(self, records: bytes | bytearray | memoryview, now_ms: int, *,
                         leader_epoch: int | None = None, from_client: bool = True,
                         end_txn_marker: EndTxnMarker | None = None,
                         verification_guard: VerificationGuard | None = None) -> LogAppendInfo:
        """Validate, assign offsets and append all batches of one request (all or nothing).

        Writable records (bytearray, writable memoryview) are rewritten in place: the caller hands them over.

        from_client=False is for internal writers (coordinators): it allows control batches. end_txn_marker: what
        the one control batch of records holds, from the writer that built it (spares reading it back).
        """
        if from_client and PLAIN_APPEND:
            plain = self._append_plain(records, now_ms, leader_epoch, verification_guard)
            if plain is not None:
                return LogAppendInfo(*plain)
        config = self.config
        if from_client and 0 <= first_magic(records) <= MAGIC_V1:
            # Magic 0/1 (Produce v0-v2 from clients of Kafka 0.8-0.10): stored as one v2 batch.
            records = bytearray(convert_produced_set(records, max_message_bytes=config.max_message_bytes,
                                                     max_decompressed=max_decompressed_size(config.max_message_bytes)))
        # Every record of every batch is walked (Kafka's LogValidator): a compacted topic refuses records
        # without a key, and CreateTime outside message.timestamp.before/after.max.ms is refused, each record
        # by its index in its batch (RecordValidationError -> record_errors in the Produce response).
        summary = validate_batches(
            records, from_client=from_client, topic_partition=self.name, compacted=config.compact,
            timestamp_bounds=config.timestamp_bounds(now_ms) if from_client else None,
            log_append_time=config.log_append_time, max_decompressed=max_decompressed_size(config.max_message_bytes))
        self._check_batch_sizes(summary, config)
        if config.target_codec is not None:
            # Topic compression.type names a codec: batches sent with another are rebuilt, as Kafka's LogValidator.
            rebuilt = recompress_batches(records, summary, config.target_codec, config.compression_level,
                                         max_size=max_decompressed_size(config.max_message_bytes))
            if rebuilt is not None:
                records, summary = rebuilt, validate_batches(rebuilt, from_client=from_client)
                # A codec can do worse than the producer's on this data.
                self._check_batch_sizes(summary, config)
        buf: bytearray | memoryview
        if isinstance(records, bytearray) or (isinstance(records, memoryview) and not records.readonly):
            # A writable buffer is the caller's private copy (the broker's request frame): rewrite it in
            # place instead of copying a batch that may be a megabyte.
            buf = memoryview(records)[: summary.valid_bytes]
        else:
            buf = bytearray(records[: summary.valid_bytes])
        log_append_time = now_ms if config.log_append_time else -1
        with self._lock:
            self._check_open()
            if leader_epoch is not None and (leader_epoch < self.leader_epoch or not self._leading):
                # The caller read its epoch before a LeaderAndIsr moved this replica on (become_leader/_follower).
                raise NotLeaderOrFollowerError(
                    f"{self.name} is no longer leader at epoch {leader_epoch} (epoch {self.leader_epoch}, "
                    f"{'leading' if self._leading else 'not leading'})")
            first_offset = self._leo
            offset = first_offset
            for pos, h in summary.batches:
                set_base_offset(buf, pos, offset)
                h.base_offset = offset
                if leader_epoch is not None:
                    set_partition_leader_epoch(buf, pos, leader_epoch)
                    h.partition_leader_epoch = leader_epoch
                if log_append_time >= 0 and not h.is_control:
                    set_log_append_time(buf, pos, now_ms)
                    h.max_timestamp = now_ms
                    h.attributes |= ATTR_TIMESTAMP_TYPE
                offset = h.next_offset
            last_offset = offset - 1
            updates, completed, duplicate_batch = self._analyze_producer_state(
                buf, summary, from_client, end_txn_marker if len(summary.batches) == 1 else None, verification_guard)
            if duplicate_batch is not None:
                # Kafka answers a retried batch with the offsets it was written at, and appends nothing.
                return LogAppendInfo(
                    duplicate_batch.first_offset, duplicate_batch.last_offset, duplicate_batch.max_timestamp,
                    duplicate_batch.last_offset, duplicate_batch.max_timestamp if log_append_time >= 0 else -1,
                    self._log_start_offset, 0, 0)
            if self.validate_producer_state is not None and from_client:
                duplicate = self.validate_producer_state(self, summary, first_offset)
                if duplicate is not None:
                    return duplicate
            if leader_epoch is not None:
                self.leader_epoch_cache.assign(leader_epoch, first_offset)
            segment = self._write(buf, summary.batches, len(buf), now_ms, last_offset, summary.num_records)
            self._update_producers(updates, completed, segment)
            self.producer_state.update_map_end_offset(offset)
        if log_append_time >= 0:
            max_ts, offset_of_max = now_ms, first_offset
        elif summary.max_timestamp_batch >= 0:
            max_ts = summary.max_timestamp
            offset_of_max = summary.batches[summary.max_timestamp_batch][1].last_offset
        else:
            max_ts, offset_of_max = -1, first_offset
        return LogAppendInfo(first_offset, last_offset, max_ts, offset_of_max, log_append_time,
                             self._log_start_offset, summary.num_records, summary.valid_bytes)

    def _config_facts(self, config: LogConfig) -> tuple[bool, bool, bool, int]:
        """(the plain append applies: the producer's compression and CreateTime; the topic is compacted;
        timestamps are bounded; max_segment_ms), kept until the log's config is replaced."""
        self._facts = (config.compression_type == "producer" and config.message_timestamp_type == "CreateTime",
                       config.compact, config.timestamp_bounds(0) is not None, config.max_segment_ms)
        self._facts_config = config
        return self._facts

    def _append_plain(self, records: bytes | bytearray | memoryview, now_ms: int, leader_epoch: int | None,
                      verification_guard: VerificationGuard | None = None) -> PlainAppended | None:
        """append_as_leader for the common client append, with the same result as a tuple of LogAppendInfo's fields
        (the direct Produce path reads it without the object): one CreateTime batch that passes validation,
        without a producer or from a known producer at its epoch, in sequence; a transactional batch continues
        the producer's open transaction here or opens one (verified by the guard when verification is on), a plain
        one needs none open. None, with nothing changed, for anything else: the general path then decides (the
        first batch of a producer, retries, errors, a plain batch inside a transaction, an unverified one, topic
        recompression, LogAppendTime).
        It skips the staged copy of the producer's entry: every check is made before the write, and the entry
        is updated in place after it, under the lock as the general path's commit is. With the C built, the most
        common of these appends is one call (LogSegment.append_plain_one); the steps below serve what it declines
        and are the whole path without the C."""
        config = self.config
        applies, compacted, bounded, max_segment_ms = (self._facts if config is self._facts_config
                                                       else self._config_facts(config))
        if not applies:
            return None
        bounds = config.timestamp_bounds(now_ms) if bounded else None
        if _append_one is not None and len(records) <= config.max_message_bytes and (
                type(records) is bytearray or (type(records) is memoryview and not records.readonly)):
            # The common case in one C call (storage/leader_append.py's append_plain): a batch without a
            # transaction, in sequence, into the active segment without a roll, the leader epoch already cached.
            # Anything it declines (nothing changed) takes the steps below, which decide as before.
            with self._lock:
                if (not self._closed and self.replaced_by is None and self.validate_producer_state is None
                        and (leader_epoch is None or (leader_epoch >= self.leader_epoch and self._leading
                                                      and self.leader_epoch_cache.holds(leader_epoch, self._leo)))):
                    first_offset = self._leo
                    segment = self._segments[-1]
                    psm = self.producer_state
                    try:
                        written = segment.append_plain_one(records, compacted, bounds, psm.producers, first_offset,
                                                           leader_epoch, now_ms, config.segment_bytes,
                                                           max_segment_ms)
                    except OSError as e:
                        raise self._storage_error(segment, e) from e
                    if written is not None:
                        last_offset = written[0]
                        # _end_moved, inline on this path
                        self._leo = last_offset + 1
                        if self._hw_tracks_leo:
                            self._hw = last_offset + 1
                        records_count = written[6]
                        self._appended_messages += records_count
                        entry = written[7]
                        if entry is not None:
                            entry.batch_metadata.append(written[8])  # type: ignore[arg-type]
                            entry.last_timestamp = written[5]
                            self._first_unstable = psm.first_unstable_offset if psm.ongoing_txns else None
                        psm.map_end_offset = last_offset + 1
                        if written[5] > NO_TIMESTAMP:
                            return (first_offset, last_offset, written[5], last_offset, -1, self._log_start_offset,
                                    records_count, len(records))
                        return (first_offset, last_offset, -1, first_offset, -1, self._log_start_offset,
                                records_count, len(records))
        h = plain_client_batch(records, compacted, bounds)
        if h is None:
            # A compressed batch (librdkafka's lz4 and zstd): the general path's own validation, the same call it
            # would make first for a magic-2 set (its errors are the general path's), then the fast path.
            if not (len(records) >= BATCH_HEADER_SIZE and records[16] == 2 and records[22] & ATTR_COMPRESSION_MASK):
                return None
            summary = validate_batches(
                records, from_client=True, topic_partition=self.name, compacted=compacted,
                timestamp_bounds=bounds, log_append_time=False,
                max_decompressed=max_decompressed_size(config.max_message_bytes))
            if len(summary.batches) != 1:
                return None
            h = summary.batches[0][1]
            if h.attributes & ATTR_TIMESTAMP_TYPE or summary.valid_bytes != len(records):
                return None
        # A writable buffer is the caller's private copy (the request frame), rewritten in place.
        buf = records if type(records) is bytearray or (type(records) is memoryview and not records.readonly) \
            else bytearray(records)
        size = h.batch_length + 12
        if size > config.max_message_bytes:
            return None
        pid = h.producer_id
        with self._lock:
            if self._closed or self.replaced_by is not None or self.validate_producer_state is not None:
                return None
            if leader_epoch is not None and (leader_epoch < self.leader_epoch or not self._leading):
                return None
            first_offset = self._leo
            last_offset = first_offset + h.last_offset_delta
            entry = added = None
            opens_txn = False
            psm = self.producer_state
            if pid >= 0:
                entry = psm.producers.get(pid)
                if entry is None or entry.producer_epoch != h.producer_epoch:
                    return None
                if h.attributes & ATTR_TRANSACTIONAL:
                    # The general path's _check_verified and ProducerAppendInfo.append: the first transactional
                    # batch here opens the producer's transaction, if the coordinator confirmed it (KIP-890).
                    opens_txn = entry.current_txn_first_offset is None
                    if opens_txn and verification_guard is not None and verification_guard.producer_id != pid:
                        return None
                elif entry.current_txn_first_offset is not None:
                    return None
                # In sequence and not a retry: the metadata the entry gains once the batch is written.
                added = next_batch(entry.batch_metadata, h.base_sequence, h.last_offset_delta, first_offset,
                                   h.max_timestamp)
                if added is None:
                    return None
            if leader_epoch is not None:
                self.leader_epoch_cache.assign(leader_epoch, first_offset)
            segment = self._maybe_roll(size, now_ms, last_offset)
            try:
                # The base offset and leader epoch are set in buf by the same call that writes it.
                segment.append_plain(buf, first_offset, leader_epoch, now_ms)
            except OSError as e:
                raise self._storage_error(segment, e) from e
            # _end_moved, inline on this path
            self._leo = last_offset + 1
            if self._hw_tracks_leo:
                self._hw = last_offset + 1
            self._appended_messages += h.records_count
            if added is not None:  # set whenever entry is
                entry.batch_metadata.append(added)  # type: ignore[union-attr]
                entry.last_timestamp = h.max_timestamp  # type: ignore[union-attr]
                if opens_txn:
                    entry.current_txn_first_offset = first_offset  # type: ignore[union-attr]
                    psm.ongoing_txns[first_offset] = pid
                # As the general commit does (first_unstable_offset: the first open transaction's, None without)
                self._first_unstable = psm.first_unstable_offset if psm.ongoing_txns else None
            psm.map_end_offset = last_offset + 1  # ProducerStateManager.update_map_end_offset
        if h.max_timestamp > NO_TIMESTAMP:
            return (first_offset, last_offset, h.max_timestamp, last_offset, -1, self._log_start_offset,
                    h.records_count, size)
        return first_offset, last_offset, -1, first_offset, -1, self._log_start_offset, h.records_count, size

    def _write(self, buf: bytearray | memoryview | bytes, batches: list[tuple[int, RecordBatchHeader]], size: int,
               now_ms: int, last_offset: int, num_records: int) -> LogSegment:
        """Under the lock, offsets final: roll if due, write the batches, move the log end (and the high watermark
        when this replica is the whole ISR: committed as soon as it is in the log)."""
        segment = self._write_segment(buf, batches, size, now_ms, last_offset)
        self._end_moved(last_offset, num_records)
        return segment

    def _end_moved(self, last_offset: int, num_records: int) -> None:
        """After a write: the log end moves, and the high watermark with it when this replica is the whole ISR."""
        self._leo = last_offset + 1
        if self._hw_tracks_leo:
            self._hw = last_offset + 1
        self._appended_messages += num_records

    def _storage_error(self, segment: LogSegment, e: OSError) -> KafkaStorageError:
        return KafkaStorageError(
            f"error appending to {segment.log_path} of {self.name}: {errno.errorcode.get(e.errno or 0, e)} {e}")

    def _write_segment(self, buf: bytearray | memoryview | bytes, batches: list[tuple[int, RecordBatchHeader]],
                       size: int, now_ms: int, last_offset: int) -> LogSegment:
        """Roll if due and write the batches to the active segment; an OSError is the log's KafkaStorageError."""
        segment = self._maybe_roll(size, now_ms, last_offset)
        try:
            segment.append(buf, batches, now_ms)
        except OSError as e:
            raise self._storage_error(segment, e) from e
        return segment

    def _check_batch_sizes(self, summary: BatchesSummary, config: LogConfig) -> None:
        for pos, h in summary.batches:
            if h.size_in_bytes > config.max_message_bytes:
                raise RecordTooLargeError(
                    f"batch at position {pos} is {h.size_in_bytes} bytes, larger than max.message.bytes "
                    f"{config.max_message_bytes} of {self.name}")

    def append_control(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                       now_ms: int, *, leader_epoch: int | None = None, template: bytes | None = None,
                       marker: EndTxnMarker | None = None) -> LogAppendInfo:
        """Write a COMMIT or ABORT marker of the producer's transaction (a control batch of one record).

        Checked as Kafka's appendEndTxnMarker: a stale producer epoch raises InvalidProducerEpochError, a
        stale coordinator epoch TransactionCoordinatorFencedError. A marker for a producer without an open
        transaction here is written all the same and completes nothing.

        template and marker: build_end_txn_marker_batch of these same arguments and its EndTxnMarker, made once by
        a writer of one transaction's markers to many partitions (TxnMarkerChannel). A batch's base offset and
        partition leader epoch lie outside its CRC, so one built batch serves every partition, its copy's two
        fields set by the append.
        """
        batch = bytearray(template if template is not None else
                          build_end_txn_marker_batch(producer_id, producer_epoch, coordinator_epoch, commit, now_ms))
        if marker is None:
            marker = EndTxnMarker(commit, coordinator_epoch)
        info = self._append_marker(batch, producer_id, producer_epoch, marker, now_ms, leader_epoch) \
            if PLAIN_APPEND else None
        if info is None:
            info = self.append_as_leader(batch, now_ms, leader_epoch=leader_epoch, from_client=False,
                                         end_txn_marker=marker)
        if logger.isEnabledFor(logging.DEBUG):  # one per partition per transaction: spare the call otherwise
            logger.debug("Wrote %s marker of producer %d (epoch %d) at offset %d of %s",
                         "COMMIT" if commit else "ABORT", producer_id, producer_epoch, info.first_offset, self.name)
        return info

    def _append_marker(self, buf: bytearray, producer_id: int, producer_epoch: int, marker: EndTxnMarker,
                       now_ms: int, leader_epoch: int | None) -> LogAppendInfo | None:
        """append_as_leader(from_client=False) for the marker batch append_control built, with the same result:
        no validation of a batch the broker wrote, the producer's entry updated in place (Kafka's
        appendEndTxnMarker: epoch, coordinator epoch, the transaction completed), the aborted-transaction index,
        LSO and high watermark as the general commit keeps them. None, with nothing changed, where the general path
        must decide: a stale producer or coordinator epoch (its error), topic recompression, a max.message.bytes
        below the marker, a closed or moved log, a stale leader epoch."""
        config = self.config
        size = len(buf)
        if producer_id < 0 or config.target_codec is not None or size > config.max_message_bytes:
            return None
        psm = self.producer_state
        with self._lock:
            if self._closed or self.replaced_by is not None:
                return None
            if leader_epoch is not None and (leader_epoch < self.leader_epoch or not self._leading):
                return None
            entry = psm.producers.get(producer_id)
            if entry is None:
                if marker.coordinator_epoch < -1:
                    return None
            elif producer_epoch < entry.producer_epoch or entry.coordinator_epoch > marker.coordinator_epoch:
                return None
            offset = self._leo
            if leader_epoch is not None:
                self.leader_epoch_cache.assign(leader_epoch, offset)
            segment = self._maybe_roll(size, now_ms, offset)
            try:
                # As _append_plain: the base offset and leader epoch are set in buf by the call that writes it, and
                # the segment's index bookkeeping is the same call's (the general path's segment.append).
                segment.append_plain(buf, offset, leader_epoch, now_ms)
            except OSError as e:
                raise self._storage_error(segment, e) from e
            self._end_moved(offset, 1)
            # The marker's one record: its timestamp is the batch's max timestamp (append_control's now_ms, or the
            # template's, built with the same).
            max_timestamp = _MAX_TIMESTAMP.unpack_from(buf, _MAX_TIMESTAMP_AT)[0]
            if entry is None:
                entry = psm.producers[producer_id] = ProducerStateEntry(producer_id)
            first = entry.current_txn_first_offset
            entry.maybe_update_producer_epoch(producer_epoch)
            entry.current_txn_first_offset = None
            entry.coordinator_epoch = marker.coordinator_epoch
            entry.last_timestamp = max_timestamp
            if first is not None:
                self._update_producers([], [CompletedTxn(producer_id, first, offset, not marker.commit)], segment)
            self._first_unstable = psm.first_unstable_offset
            psm.update_map_end_offset(offset + 1)
        log_append_time = now_ms if config.log_append_time else -1
        return LogAppendInfo(offset, offset, now_ms if log_append_time >= 0 else max_timestamp, offset,
                             log_append_time, self._log_start_offset, 1, size)

    def _analyze_producer_state(
        self, buf: bytearray | memoryview, summary: BatchesSummary, from_client: bool,
        known_marker: EndTxnMarker | None = None, verification_guard: VerificationGuard | None = None,
    ) -> tuple[list[ProducerAppendInfo], list[CompletedTxn], BatchMetadata | None]:
        """Validate the batches of producers (Kafka's analyzeAndValidateProducerState); stage their updates.

        Returns the staged updates and the transactions their markers complete, or the metadata of the
        original batch when a client batch is a retry of one of the producer's last 5 (then the request
        is answered with its offsets).
        """
        psm = self.producer_state
        updates: dict[int, ProducerAppendInfo] = {}
        completed: list[CompletedTxn] = []
        for pos, h in summary.batches:
            pid = h.producer_id
            if pid < 0:
                continue
            if from_client:
                validate_client_batch(h)
                entry = psm.last_entry(pid)
                if entry is not None:
                    duplicate = entry.find_duplicate_batch(h)
                    if duplicate is not None:
                        logger.debug("Duplicate batch of producer %d (seq %d..%d) in %s: original at offset %d",
                                     pid, h.base_sequence, h.last_sequence, self.name, duplicate.first_offset)
                        return [], [], duplicate
                if verification_guard is not None and h.is_transactional and not h.is_control:
                    # Every batch, not only a request's first: a transactional batch the coordinator does not know
                    # of would hold the last stable offset back for good (Kafka's UnifiedLog.append).
                    self._check_verified(h, entry, verification_guard)
            info = updates.get(pid)
            if info is None:
                info = updates[pid] = psm.prepare_update(pid, validate=from_client)
            marker = None
            if h.is_control:
                marker = known_marker if known_marker is not None else parse_end_txn_marker(
                    buf, pos, max_size=max_decompressed_size(self.config.max_message_bytes))
            txn = info.append(h, marker)
            if txn is not None:
                completed.append(txn)
        return list(updates.values()), completed, None

    def _check_verified(self, h: RecordBatchHeader, entry: ProducerStateEntry | None,
                        guard: VerificationGuard) -> None:
        if not _ongoing(entry, h.producer_epoch) and guard.producer_id != h.producer_id:
            raise InvalidTxnStateError(
                f"Record was not part of an ongoing transaction (producer {h.producer_id}, epoch "
                f"{h.producer_epoch}, {self.name})")

    def _update_producers(self, updates: list[ProducerAppendInfo], completed: list[CompletedTxn],
                          segment: LogSegment) -> None:
        """Commit staged producer updates; index the aborted transactions with the LSO after their marker."""
        psm = self.producer_state
        for info in updates:
            psm.update(info)
        for txn in completed:
            if txn.is_aborted:
                entry = AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, psm.last_stable_offset(txn))
                try:
                    segment.txn_index.append(entry)
                except OSError as e:
                    raise KafkaStorageError(f"error appending to {segment.txn_index.path} of {self.name}: {e}") from e
            psm.complete_txn(txn)
        if updates:
            self._first_unstable = psm.first_unstable_offset

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log {self.name} is closed")
        if self.replaced_by is not None:
            raise LogReplacedError(f"log {self.name} moved to {self.replaced_by.dir.parent}")

    def _maybe_roll(self, size: int, now_ms: int, max_offset: int) -> LogSegment:
        """The active segment, rolled first if this append is due a new one. The append path asks on every
        request, so the checks read the segment's fields instead of its properties (the same tests as
        LogSegment.time_waited_for_roll, _Index.is_full and can_convert_to_relative_offset)."""
        seg = self._segments[-1]
        seg_size = seg._size
        if seg_size == 0:
            return seg
        cfg = self.config
        max_segment_ms = (self._facts if cfg is self._facts_config else self._config_facts(cfg))[3]
        base = seg._rolling_base_ms
        if base is None:
            base = seg.rolling_base_ms()
        if (
            seg_size > cfg.segment_bytes - size
            or (base is not None and now_ms - base > max_segment_ms)
            or seg.index._count >= seg.index.max_entries
            or seg.time_index._count >= seg.time_index.max_entries
            or not 0 <= max_offset - seg.base_offset <= _INT32_MAX
        ):
            return self.roll()
        return seg

    def roll(self) -> LogSegment:
        """Start a new active segment at LEO (no-op if the active one is empty)."""
        with self._lock:
            self._check_open()
            active = self._segments[-1]
            if active.size == 0:
                return active
            try:
                new = self._new_segment(self.dir, self._leo, self.config)
            except OSError as e:
                raise KafkaStorageError(f"error rolling {self.name}: {e}") from e
            active.on_become_inactive()
            self._segments = (*self._segments, new)
            self._dir_dirty = True
            self.producer_state.update_map_end_offset(self._leo)
            self._take_producer_snapshot()
            logger.debug("Rolled %s: new segment at offset %d", self.name, new.base_offset)
            return new

    # -- read ----------------------------------------------------------------------------------

    def read(self, fetch_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_message: bool = True, isolation_committed: bool = False) -> FetchDataInfo:
        """Whole batches from the one holding fetch_offset, below max_offset (and the LSO when
        isolation_committed, with the aborted transactions overlapping what is returned)."""
        leo = self._leo
        hw = self._hw
        lso = self._log_start_offset
        segments = self._segments
        if fetch_offset < lso or fetch_offset > leo:
            raise OffsetOutOfRangeError(
                f"offset {fetch_offset} is out of range for {self.name}: [{lso}, {leo}]")
        limit = leo if max_offset is None else min(max_offset, leo)
        last_stable = self._lso(hw)
        result = FetchDataInfo(fetch_offset, None, high_watermark=hw, log_start_offset=lso, log_end_offset=leo,
                               last_stable_offset=last_stable)
        if isolation_committed:
            limit = min(limit, last_stable)
            result.aborted_transactions = []
        if fetch_offset >= limit:
            return result
        i = max(0, bisect.bisect_right(segments, fetch_offset, key=lambda s: s.base_offset) - 1)
        while i < len(segments):
            seg = segments[i]
            if seg.base_offset >= limit:
                break
            max_position = seg.position_of(limit) if limit < leo else None
            try:
                got = seg.read(fetch_offset, max_bytes, max_position, min_one_message)
            except OSError as e:
                raise KafkaStorageError(f"error reading {seg.log_path}: {e}") from e
            if got is not None:
                result.records = got.records
                result.first_entry_incomplete = got.first_entry_incomplete
                if isolation_committed and got.records is not None:
                    result.aborted_transactions = self._collect_aborted(segments, i, fetch_offset, got.next_offset)
                return result
            i += 1
        return result

    def collect_aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """Every aborted transaction with last_offset >= start_offset and first_offset < upper_bound_offset."""
        segments = self._segments
        i = max(0, bisect.bisect_right(segments, start_offset, key=lambda s: s.base_offset) - 1)
        return self._collect_aborted(segments, i, start_offset, upper_bound_offset)

    def _collect_aborted(self, segments: Sequence[LogSegment], first: int, start_offset: int,
                         upper_bound_offset: int) -> list[AbortedTxn]:
        """From segments[first], the segment holding start_offset, on."""
        indexes = (segments[j].txn_index for j in range(first, len(segments)))
        try:
            return collect_aborted_txns(indexes, start_offset, upper_bound_offset)
        except OSError as e:
            raise KafkaStorageError(f"error reading the transaction indexes of {self.name}: {e}") from e

    # -- timestamps ----------------------------------------------------------------------------

    def offset_for_timestamp(self, ts: int) -> tuple[int, int] | None:
        if ts in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            return self._log_start_offset, -1
        if ts == LATEST_TIMESTAMP:
            return self._leo, -1
        lso = self._log_start_offset
        segments = self._segments
        if ts == MAX_TIMESTAMP:
            return self._max_timestamp_offset(segments, lso)
        for seg in segments:
            if seg.max_timestamp >= ts:
                found = seg.find_offset_by_timestamp(ts, lso, max_decompressed_size(self.config.max_message_bytes))
                if found is not None:
                    return found
        return None

    def _max_timestamp_offset(self, segments: Sequence[LogSegment], lso: int) -> tuple[int, int] | None:
        best: LogSegment | None = None
        for seg in segments:
            if seg.max_timestamp >= 0 and (best is None or seg.max_timestamp > best.max_timestamp):
                best = seg
        if best is None:
            return None
        ts, batch_last = best.max_timestamp_and_offset
        loc = best.translate_offset(batch_last)
        if loc is None:
            return None
        limit = max_decompressed_size(self.config.max_message_bytes)
        for rec in decode_records(best.read_batch_bytes(loc), max_size=limit):
            if rec.timestamp == ts and rec.offset >= lso:
                return rec.offset, ts
        return max(batch_last, lso), ts

    # -- deletion ------------------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start to offset (-1 = high watermark); drop segments wholly below."""
        with self._lock:
            self._check_open()
            if offset == -1:
                offset = self._hw
            if offset < 0 or offset > self._hw:
                raise OffsetOutOfRangeError(
                    f"cannot delete records of {self.name} before {offset}: high watermark is {self._hw}")
            if offset > self._log_start_offset:
                self._log_start_offset = offset
                logger.info("Incremented log start offset of %s to %d (DeleteRecords)", self.name, offset)
                self._delete_segments(self._start_offset_breached(), "log start offset breach")
                self.producer_state.on_log_start_offset_incremented(self._log_start_offset)
                self.leader_epoch_cache.truncate_from_start(self._log_start_offset)
            return self._log_start_offset

    def _start_offset_breached(self) -> list[LogSegment]:
        segs = self._segments
        return [s for i, s in enumerate(segs[:-1]) if segs[i + 1].base_offset <= self._log_start_offset]

    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """Retention: whole non-active segments, by log start, time and size; returns segments deleted."""
        now_ms = _now_ms() if now_ms is None else now_ms
        cfg = self.config
        with self._lock:
            if self._closed:
                return 0
            # Breached segments and retention candidates are both prefixes (offsets only grow).
            doomed = self._start_offset_breached()
            if cfg.delete:
                rest = self._segments[len(doomed):-1]
                n = 0
                if cfg.retention_ms >= 0:
                    while n < len(rest) and now_ms - rest[n].largest_timestamp() > cfg.retention_ms:
                        n += 1
                if cfg.retention_bytes >= 0:
                    diff = self.size - cfg.retention_bytes - sum(s.size for s in doomed) - sum(s.size for s in rest[:n])
                    while n < len(rest) and diff - rest[n].size >= 0:
                        diff -= rest[n].size
                        n += 1
                doomed.extend(rest[:n])
            if doomed:
                self._delete_segments(doomed, "retention")
            return len(doomed)

    def _delete_segments(self, doomed: Sequence[LogSegment], reason: str) -> None:
        """Drop segments from the list now; rename to .deleted and close them after file.delete.delay.ms."""
        if not doomed:
            return
        gone = {id(s) for s in doomed}
        remaining = tuple(s for s in self._segments if id(s) not in gone)
        assert remaining, "the active segment is never deleted"
        self._segments = remaining
        if remaining[0].base_offset > self._log_start_offset:
            self._log_start_offset = remaining[0].base_offset
            self.producer_state.on_log_start_offset_incremented(self._log_start_offset)
            self.leader_epoch_cache.truncate_from_start(self._log_start_offset)
        due = _now_ms() + self.config.file_delete_delay_ms
        for seg in doomed:
            logger.info("Deleting segment %d of %s (%s), log start offset now %d",
                        seg.base_offset, self.name, reason, self._log_start_offset)
            self._schedule_delete(seg, due)

    def _schedule_delete(self, seg: LogSegment, due_ms: int) -> None:
        try:
            seg.close_writers()
            seg.change_file_suffix(DELETED_SUFFIX)
        except OSError as e:
            logger.warning("Failed to rename segment %s for deletion: %s", seg.log_path, e)
        self._queue_delete(due_ms, seg)

    def _queue_delete(self, due_ms: int, seg: LogSegment) -> None:
        self._pending_deletes.append(_PendingDelete(due_ms, seg))
        if self.on_pending_delete is not None:
            self.on_pending_delete(self)

    def delete_pending_files(self, now_ms: int | None = None, *, force: bool = False) -> int:
        """Close and unlink segments whose delete delay has passed; returns how many."""
        now_ms = _now_ms() if now_ms is None else now_ms
        with self._lock:
            due = [p for p in self._pending_deletes if force or p.due_ms <= now_ms]
            if not due:
                return 0
            self._pending_deletes = [p for p in self._pending_deletes if not (force or p.due_ms <= now_ms)]
        for p in due:
            try:
                p.segment.delete_files()
            except OSError as e:
                # Whatever is left goes with the log's directory when the log itself is deleted.
                logger.warning("Could not delete segment %d of %s: %s", p.segment.base_offset, self.name, e)
        return len(due)

    # -- flush ---------------------------------------------------------------------------------

    def flush(self, up_to_offset: int | None = None) -> None:
        """fsync everything up to up_to_offset (default: LEO now). Group commit: concurrent
        callers whose offsets an in-progress fsync covers wait for it instead of issuing their own."""
        if self._closed:
            return
        target = self._leo if up_to_offset is None else min(up_to_offset, self._leo)
        with self._flush_cond:
            while True:
                if self._recovery_point >= target:
                    return
                if not self._flush_in_progress:
                    self._flush_in_progress = True
                    break
                self._flush_cond.wait()
        ok = False
        try:
            with self._lock:
                flush_to = self._leo
                appended = self._appended_messages
                segments = self._segments
                dir_dirty, self._dir_dirty = self._dir_dirty, False
            start = self._recovery_point
            flush_started = time.perf_counter()
            try:
                for i, seg in enumerate(segments):
                    seg_end = segments[i + 1].base_offset if i + 1 < len(segments) else flush_to
                    if seg_end <= start or seg.size == 0:
                        continue
                    try:
                        seg.flush()
                        if i + 1 < len(segments):
                            seg.close_writers()
                    except OSError as e:
                        # EBADF: deleted (and closed) concurrently, nothing left to make durable.
                        if e.errno != errno.EBADF:
                            raise
                if dir_dirty:
                    fsync_dir(self.dir)
                with self._lock:
                    # Epochs that start below the new recovery point are never rebuilt from the log again.
                    self.leader_epoch_cache.sync()
            except OSError as e:
                with self._lock:
                    self._dir_dirty = self._dir_dirty or dir_dirty
                raise KafkaStorageError(f"error flushing {self.name}: {e}") from e
            FLUSH_STATS.record((time.perf_counter() - flush_started) * 1000)
            ok = True
        finally:
            with self._flush_cond:
                self._flush_in_progress = False
                if ok:
                    self._recovery_point = max(self._recovery_point, flush_to)
                    self._flushed_messages = max(self._flushed_messages, appended)
                    self._last_flush_ms = _now_ms()
                self._flush_cond.notify_all()

    # -- producer state ------------------------------------------------------------------------

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers whose last batch is older than producer.id.expiration.ms; returns their ids."""
        with self._lock:
            expired = self.producer_state.remove_expired_producers(now_ms, expiration_ms)
        if expired:
            logger.info("Expired %d producer ids of %s", len(expired), self.name)
        return expired

    def producer_states(self) -> list[ProducerStateEntry]:
        """A copy of every producer's state (DescribeProducers)."""
        with self._lock:
            return [e.copy() for e in self.producer_state.producers.values()]

    def ongoing_transaction_first_offset(self, producer_id: int) -> int | None:
        entry = self.producer_state.producers.get(producer_id)
        return entry.current_txn_first_offset if entry is not None else None

    def has_ongoing_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Kafka's UnifiedLog.hasOngoingTransaction: the producer's transaction at this epoch is open here."""
        return _ongoing(self.producer_state.producers.get(producer_id), producer_epoch)

    def take_producer_snapshot(self) -> None:
        """Snapshot the producer state at LEO now (tests, tools)."""
        with self._lock:
            self.producer_state.update_map_end_offset(self._leo)
            self._take_producer_snapshot(sync=True)

    # -- cleaner support -----------------------------------------------------------------------

    def replace_segments(self, olds: Sequence[LogSegment], new: LogSegment) -> bool:
        """Swap one cleaned segment (.swap suffix, base offset of olds[0]) in for consecutive segments olds.
        False if one of them is gone (retention won) or is the active segment. The .swap file is the commit
        point: loading installs it and drops the segments inside its offset range (_cleanup_leftover_files)."""
        with self._lock:
            segs = self._segments
            if self._closed or not olds or segs[-1] in olds:
                return False
            try:
                start = segs.index(olds[0])
            except ValueError:
                return False
            if tuple(segs[start : start + len(olds)]) != tuple(olds):
                return False
            for old in olds:
                old.close_writers()
                old.change_file_suffix(DELETED_SUFFIX)
            new.change_file_suffix("")
            self._segments = (*segs[:start], new, *segs[start + len(olds):])
            self._dir_dirty = True
            for old in olds:
                self._schedule_delete_already_renamed(old)
            return True

    def _schedule_delete_already_renamed(self, seg: LogSegment) -> None:
        self._queue_delete(_now_ms() + self.config.file_delete_delay_ms, seg)

    @property
    def has_pending_deletes(self) -> bool:
        return bool(self._pending_deletes)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self, *, persist: bool = True) -> None:
        """persist=False: the log is being deleted; skip what only a restart would read (snapshot, timestamps)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if persist:
                self._persist_for_restart()
            for seg in self._segments:
                try:
                    seg.close()
                except OSError as e:
                    if persist:
                        raise
                    # Being deleted: its directory was renamed, so index entries still pending find their file
                    # gone. Nothing of it is read again.
                    logger.debug("Closing segment %d of deleted log %s: %s", seg.base_offset, self.name, e)
        self.delete_pending_files(force=True)

    def _persist_for_restart(self) -> None:
        self.leader_epoch_cache.sync()
        active = self._segments[-1]
        # Persist the active segment's max timestamp so the next start needs no scan.
        try:
            active.on_become_inactive()
            active.time_index.flush()
        except OSError:
            pass
        # The producer map as of LEO, so a clean restart replays nothing. A log that never held a batch
        # needs none (a restart finds nothing to replay): tens of thousands of new partitions stop fast.
        never_written = self._leo <= self._segments[0].base_offset and not len(self.producer_state)
        if self._dir.exists() and not never_written:
            self.producer_state.update_map_end_offset(self._leo)
            self._take_producer_snapshot(sync=True)
            try:
                fsync_dir(self._dir)
            except OSError:
                pass

    def delete(self) -> None:
        self.close(persist=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (f"Log({self.name}, start={self._log_start_offset}, end={self._leo}, "
                f"segments={len(self._segments)})")

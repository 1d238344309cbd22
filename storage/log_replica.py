"""What a Log does as a replica of a replicated partition (Kafka's UnifiedLog follower paths).

Kept beside storage/log.py so log.py stays one responsibility: the Log class mixes this in. Everything
here runs under the Log's `_lock` like the leader append; the high watermark is one attribute written
under the lock and read without it (a plain int: readers see the old or the new value).

- A follower appends the leader's batches as they are (offsets, leader epochs, producer ids): the leader
  epoch cache and the producer state follow them, so the replica can lead later without losing
  idempotent producers' sequence state.
- Truncation (a follower dropping what its leader's log does not have, or starting over at the leader's
  log start) also lives here.
- The high watermark: while this replica is the whole ISR (the embedded default, and any ISR of one)
  the leader append moves it to the log end; otherwise the Partition sets it (leader: min LEO over the
  ISR; follower: the leader's, capped at the local log end).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kbroker.protocol.records import one_replicated_batch, validate_batches
from kbroker.storage.errors import KafkaStorageError
from kbroker.storage.leader_epoch_cache import LeaderEpochFileCache
from kbroker.storage.segment import DELETED_SUFFIX, LogSegment

if TYPE_CHECKING:
    from pathlib import Path

    from kbroker.storage.config import LogConfig
    from kbroker.storage.log import LogAppendInfo
    from kbroker.storage.producer_state import ProducerStateManager

logger = logging.getLogger("kbroker.storage")

# append_fetched's one-batch path (KBROKER_FOLLOWER_PLAIN_APPEND=0: every fetched batch through append_as_follower).
FOLLOWER_PLAIN_APPEND = os.environ.get("KBROKER_FOLLOWER_PLAIN_APPEND", "1") != "0"


class UnexpectedAppendOffsetError(KafkaStorageError):
    """A follower append whose first offset is below the log end (Kafka's UnexpectedAppendOffsetException)."""


class ReplicaLogMixin:
    # Provided by Log.
    _lock: threading.RLock
    _leo: int
    _hw: int
    _log_start_offset: int
    _appended_messages: int
    producer_state: ProducerStateManager
    leader_epoch_cache: LeaderEpochFileCache
    # The leader epoch this replica writes with while it leads (set by the broker's Partition; 0 in the
    # single-node default, where leadership never moves), and whether it leads: appends_as_leader at an older
    # epoch, or once it follows, are refused.
    leader_epoch: int
    _leading: bool
    _hw_tracks_leo: bool

    _segments: tuple[LogSegment, ...]
    _recovery_point: int
    _flushed_messages: int
    _first_unstable: int | None
    _dir_dirty: bool
    _closed: bool
    replaced_by: object | None  # the Log this one moved to (another log dir)
    cleaner_checkpoint: int
    config: LogConfig
    name: str

    if TYPE_CHECKING:
        @property
        def dir(self) -> Path: ...
        def _schedule_delete(self, seg: LogSegment, due_ms: int) -> None: ...
        @staticmethod
        def _new_segment(dir: Path, base_offset: int, config: LogConfig) -> LogSegment: ...
        def _rebuild_producer_state_from(self, start: int, end: int,
                                         rebuild_txn_indexes: set[int] | None = None) -> None: ...
        def _check_open(self) -> None: ...
        def _write_segment(self, buf, batches, size: int, now_ms: int, last_offset: int): ...  # type: ignore[no-untyped-def]
        def _maybe_roll(self, size: int, now_ms: int, max_offset: int) -> LogSegment: ...
        def _storage_error(self, segment: LogSegment, e: OSError) -> KafkaStorageError: ...
        def _analyze_producer_state(self, buf, summary, from_client):  # type: ignore[no-untyped-def]
            ...
        def _update_producers(self, updates, completed, segment) -> None:  # type: ignore[no-untyped-def]
            ...

    # -- follower append -----------------------------------------------------------------------

    def append_as_follower(self, records: bytes | bytearray | memoryview) -> LogAppendInfo | None:
        """Append batches fetched from the leader unchanged (their offsets and leader epochs).

        Returns None when the records hold no whole batch (a partial one at the end is left out). The leader's
        batches may skip offsets (compaction) but never start below the log end: that raises
        UnexpectedAppendOffsetError.
        """
        from kbroker.storage.log import LogAppendInfo

        summary = validate_batches(records, from_client=False, replicated=True)
        batches = summary.batches
        if not batches:
            return None
        buf = records[: summary.valid_bytes]
        now_ms = int(time.time() * 1000)
        with self._lock:
            self._check_open()
            first_offset = batches[0][1].base_offset
            if first_offset < self._leo:
                raise UnexpectedAppendOffsetError(
                    f"follower append to {self.name} starts at offset {first_offset}, below the log end {self._leo}")
            expected = first_offset
            for _, h in batches:
                if h.base_offset < expected:
                    raise UnexpectedAppendOffsetError(
                        f"follower batches of {self.name} out of order: {h.base_offset} after {expected}")
                expected = h.next_offset
            last_offset = expected - 1
            cache = self.leader_epoch_cache
            epoch = -1
            for _, h in batches:
                if h.partition_leader_epoch != epoch:  # a leader's batches come in runs of one epoch
                    epoch = h.partition_leader_epoch
                    if epoch >= 0:
                        cache.assign(epoch, h.base_offset)
            updates, completed, _ = self._analyze_producer_state(buf, summary, False)
            segment = self._write_segment(buf, batches, len(buf), now_ms, last_offset)
            self._leo = expected
            self._appended_messages += summary.num_records
            self._update_producers(updates, completed, segment)
            self.producer_state.update_map_end_offset(expected)
        return LogAppendInfo(first_offset, last_offset, summary.max_timestamp, last_offset, -1,
                             self._log_start_offset, summary.num_records, summary.valid_bytes)

    def append_fetched(self, records: bytes | bytearray | memoryview) -> None:
        """The replica fetcher's append of a fetch answer's records: append_as_follower, with the same effect on
        the log (bytes, indexes, leader epochs, log end), and for the usual answer of a replication round, one
        whole batch without a producer id, in one compiled call (Log._append_plain's segment write: the batch's own
        offsets and epoch kept) after one compiled header and CRC check, without the general path's summary,
        producer analysis and index loop. Anything else (several or partial batches, producers, control batches,
        a batch below the log end, a closed or moved log, a fault) goes to append_as_follower, which decides."""
        if not FOLLOWER_PLAIN_APPEND or not self._append_fetched_plain(records):
            self.append_as_follower(records)

    def _append_fetched_plain(self, records: bytes | bytearray | memoryview) -> bool:
        h = one_replicated_batch(records)
        if h is None or h.producer_id >= 0:
            return False
        base = h.base_offset
        next_offset = base + h.last_offset_delta + 1
        size = len(records)
        # write_plain writes a writable buffer (it sets the base offset, here to its own value): a fetch answer's
        # records are a view of the received frame's bytes.
        buf = records if type(records) is bytearray else bytearray(records)
        now_ms = int(time.time() * 1000)
        with self._lock:
            if self._closed or self.replaced_by is not None or base < self._leo:
                return False
            epoch = h.partition_leader_epoch
            if epoch >= 0:
                self.leader_epoch_cache.assign(epoch, base)
            segment = self._maybe_roll(size, now_ms, next_offset - 1)
            try:
                segment.append_plain(buf, base, None, now_ms)
            except OSError as e:
                raise self._storage_error(segment, e) from e
            self._leo = next_offset
            self._appended_messages += h.records_count
            self.producer_state.update_map_end_offset(next_offset)
        return True

    # -- leader epochs -------------------------------------------------------------------------

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= epoch, its end offset) for OffsetForLeaderEpoch; (-1, -1) when unknown."""
        return self.leader_epoch_cache.end_offset_for(epoch, self._leo)

    @property
    def latest_epoch(self) -> int:
        return self.leader_epoch_cache.latest_epoch

    def become_leader(self, epoch: int) -> int:
        """Lead at epoch from the log end, which is returned (Kafka's maybeAssignEpochStartOffset on makeLeader).

        One step under the log's lock, as the appends that stamp their batches: read apart, an append racing the
        change could land at the offset the new epoch starts at stamped with the old one, and followers would then
        truncate and refetch that batch forever (its epoch ends where it starts)."""
        with self._lock:
            self.leader_epoch_cache.assign(epoch, self._leo)
            self.leader_epoch = epoch
            self._leading = True
            return self._leo

    def become_follower(self, epoch: int) -> None:
        """Follow at epoch (or neither lead nor follow, after StopReplica): leader appends are refused from now on."""
        with self._lock:
            self.leader_epoch = max(self.leader_epoch, epoch)
            self._leading = False

    # -- high watermark ------------------------------------------------------------------------

    def set_hw_tracks_leo(self, tracks: bool) -> None:
        """True while this replica is the whole ISR: every leader append commits at once."""
        with self._lock:
            self._hw_tracks_leo = tracks
            if tracks:
                self._hw = self._leo

    def maybe_increment_high_watermark(self, hw: int) -> bool:
        """Leader: move the high watermark forward to hw (never back, never past the log end)."""
        with self._lock:
            hw = min(hw, self._leo)
            if hw <= self._hw:
                return False
            self._hw = hw
            return True

    def update_high_watermark(self, hw: int) -> int:
        """Follower: take the leader's high watermark, capped at the local log end; returns the new value."""
        with self._lock:
            self._hw = max(min(hw, self._leo), self._log_start_offset)
            return self._hw

    # -- truncation ----------------------------------------------------------------------------

    def truncate_fully_and_start_at(self, offset: int) -> None:
        with self._lock:
            self._check_open()
            old = self._segments
            new = self._new_segment_after(old, offset)
            self._segments = (new,)
            self._leo = self._hw = self._log_start_offset = offset
            self._recovery_point = offset
            self._flushed_messages = self._appended_messages
            self.cleaner_checkpoint = offset
            self._first_unstable = None
            self.leader_epoch_cache.clear()
            try:
                self.producer_state.truncate_fully_and_start_at(offset)
            except OSError as e:
                raise KafkaStorageError(f"error deleting producer snapshots of {self.name}: {e}") from e
            now = int(time.time() * 1000)
            for seg in old:
                if seg is not new:
                    self._schedule_delete(seg, now + self.config.file_delete_delay_ms)

    def _new_segment_after(self, old: Sequence[LogSegment], offset: int) -> LogSegment:
        for seg in old:
            if seg.base_offset == offset:
                # Same file name: move the old one aside first.
                seg.close_writers()
                seg.change_file_suffix(DELETED_SUFFIX)
        self._dir_dirty = True
        return self._new_segment(self.dir, offset, self.config)

    def truncate_to(self, offset: int) -> None:
        """Remove every batch at or after offset (whole batches), e.g. for a future follower."""
        with self._lock:
            self._check_open()
            if offset >= self._leo:
                # An epoch entry the leader's log does not have may still sit at the end (Kafka's truncateTo).
                self.leader_epoch_cache.truncate_from_end(offset)
                return
            if offset <= self._segments[0].base_offset:
                self.truncate_fully_and_start_at(max(offset, self._log_start_offset))
                return
            keep = tuple(s for s in self._segments if s.base_offset < offset)
            doomed = [s for s in self._segments if s.base_offset >= offset]
            self._segments = keep
            now = int(time.time() * 1000)
            for seg in doomed:
                self._schedule_delete(seg, now)
            keep[-1].truncate_to(offset)
            self._leo = keep[-1].read_next_offset()
            self._hw = min(self._hw, self._leo)
            self.leader_epoch_cache.truncate_from_end(self._leo)
            self._recovery_point = min(self._recovery_point, self._leo)
            # Kafka's truncateAndReload: drop newer snapshots, replay from the latest one left.
            psm = self.producer_state
            try:
                latest = psm.load_latest_snapshot(self._leo)
            except OSError as e:
                raise KafkaStorageError(f"error reloading producer state of {self.name}: {e}") from e
            self._rebuild_producer_state_from(psm.map_end_offset if latest is not None else 0, self._leo)

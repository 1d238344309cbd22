"""Idempotent and transactional producer state per partition (Kafka's ProducerStateManager).

For every producer id seen in a partition the manager keeps a ProducerStateEntry: the producer
epoch, the metadata of its last 5 batches (sequence range and offsets, for duplicate
detection), the timestamp of its last batch (for expiration), the epoch of the transaction
coordinator that wrote its last marker, and the first offset of its open transaction. Appends
are validated in Kafka's order (epoch, duplicate, unknown producer, sequence, transaction state)
through a ProducerAppendInfo that stages the updates of one request; the Log commits them once
the batches are written.

Open transactions are also kept ordered by first offset (`ongoing_txns`): the oldest one bounds
the last stable offset. A marker completes the producer's transaction (CompletedTxn); the Log
records aborted ones in the segment's transaction index.

The map is persisted in `<20-digit offset>.snapshot` files in the partition directory: the
state after every batch below that offset. On open the latest snapshot at or below the log end
is loaded and the batch headers after it are replayed (ProducerStateManager.load_from_log).

Snapshot format (big endian), version 1:
    magic b"KBPS" | version int16 | crc32c uint32 over everything after it |
    snapshot offset int64 | entry count int32 | entries
    entry: producer id int64 | epoch int16 | coordinator epoch int32 | last timestamp int64 |
           current txn first offset int64 (-1: none) | batch count int8 | batches
    batch: first seq int32 | last seq int32 | first offset int64 | last offset int64 | max timestamp int64
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
from kbroker.protocol.control_records import EndTxnMarker
from kbroker.protocol.records import NO_PRODUCER_EPOCH, NO_SEQUENCE, InvalidRecordError, RecordBatchHeader
from kbroker.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
    UnknownProducerIdError,
)
from kbroker.storage.transaction_index import CompletedTxn

logger = logging.getLogger("kbroker.storage")

SNAPSHOT_SUFFIX = ".snapshot"
# Kafka's ProducerStateEntry.NumBatchesToRetain: the max.in.flight.requests an idempotent producer may use.
NUM_BATCHES_TO_RETAIN = 5
INT32_MAX = 2**31 - 1

_MAGIC = b"KBPS"
_VERSION = 1
_PREFIX = struct.Struct(">4shI")
_HEAD = struct.Struct(">qi")
_ENTRY = struct.Struct(">qhiqqb")
_BATCH = struct.Struct(">iiqqq")


class CorruptSnapshotError(ValueError):
    pass


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """next_seq directly follows last_seq; sequences wrap from Int32 max to 0."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


@dataclass(slots=True, frozen=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True, frozen=True)
class VerificationGuard:
    """Kafka's VerificationGuard: the producer whose transaction the coordinator confirmed for one append to a
    partition (KIP-890), so its first transactional batch there may open the transaction; -1: none (the sentinel)."""

    producer_id: int = -1


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batch_metadata: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    # First offset of the producer's open transaction in this partition; None outside a transaction.
    current_txn_first_offset: int | None = None

    @property
    def is_empty(self) -> bool:
        return not self.batch_metadata

    @property
    def first_seq(self) -> int:
        return self.batch_metadata[0].first_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self.batch_metadata[-1].last_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def first_data_offset(self) -> int:
        return self.batch_metadata[0].first_offset if self.batch_metadata else -1

    @property
    def last_data_offset(self) -> int:
        return self.batch_metadata[-1].last_offset if self.batch_metadata else -1

    def copy(self) -> ProducerStateEntry:
        return ProducerStateEntry(self.producer_id, self.producer_epoch,
                                  deque(self.batch_metadata, maxlen=NUM_BATCHES_TO_RETAIN), self.last_timestamp,
                                  self.coordinator_epoch, self.current_txn_first_offset)

    def add_batch(self, producer_epoch: int, first_seq: int, last_seq: int, first_offset: int, last_offset: int,
                  timestamp: int) -> None:
        self.maybe_update_producer_epoch(producer_epoch)
        self.batch_metadata.append(BatchMetadata(first_seq, last_seq, first_offset, last_offset, timestamp))
        self.last_timestamp = timestamp

    def maybe_update_producer_epoch(self, producer_epoch: int) -> bool:
        if self.producer_epoch != producer_epoch:
            self.batch_metadata.clear()
            self.producer_epoch = producer_epoch
            return True
        return False

    def find_duplicate_batch(self, h: RecordBatchHeader) -> BatchMetadata | None:
        if h.producer_epoch != self.producer_epoch:
            return None
        return self.batch_with_sequence_range(h.base_sequence, h.last_sequence)

    def batch_with_sequence_range(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for m in self.batch_metadata:
            if m.first_seq == first_seq and m.last_seq == last_seq:
                return m
        return None


class ProducerAppendInfo:
    """The updates one append makes to one producer, validated against its current entry.

    validate: a client's append (sequence checks, Kafka's AppendOrigin.CLIENT). check_epochs: producer and
    coordinator epochs and the transaction state are enforced (every origin but the replay of the log itself,
    Kafka's AppendOrigin.REPLICATION).
    """

    def __init__(self, topic_partition: str, producer_id: int, current: ProducerStateEntry | None,
                 *, validate: bool, check_epochs: bool = True) -> None:
        self.topic_partition = topic_partition
        self.producer_id = producer_id
        self.current = current
        self.validate = validate
        self.check_epochs = check_epochs or validate
        self.updated = current.copy() if current is not None else ProducerStateEntry(producer_id)
        # First offsets of the transactions this append opens.
        self.started_txns: list[int] = []

    def append(self, h: RecordBatchHeader, marker: EndTxnMarker | None = None) -> CompletedTxn | None:
        """Check and stage one batch whose offsets are final; marker: the control record of a control batch.

        Returns the transaction a marker completes (None for a marker of a producer without one here).
        """
        if h.is_control:
            if marker is None:
                # An empty control batch: the cleaner already removed the transaction it ended.
                return None
            return self.append_end_txn_marker(marker, h.producer_epoch, h.base_offset, h.max_timestamp)
        if self.check_epochs:
            self._check_epoch(h.producer_epoch, h.base_offset)
        if self.validate:
            self._check_sequence(h.producer_epoch, h.base_sequence, h.base_offset)
        updated = self.updated
        updated.add_batch(h.producer_epoch, h.base_sequence, h.last_sequence, h.base_offset, h.last_offset,
                          h.max_timestamp)
        if updated.current_txn_first_offset is None:
            if h.is_transactional:
                updated.current_txn_first_offset = h.base_offset
                self.started_txns.append(h.base_offset)
        elif not h.is_transactional and self.check_epochs:
            raise InvalidTxnStateError(
                f"Expected transactional write from producer {self.producer_id} at offset {h.base_offset} in "
                f"{self.topic_partition}: its transaction from offset {updated.current_txn_first_offset} is open")
        return None

    def append_end_txn_marker(self, marker: EndTxnMarker, producer_epoch: int, offset: int,
                              timestamp: int) -> CompletedTxn | None:
        """Kafka's appendEndTxnMarker: only a transaction with data here is completed (and indexed if aborted)."""
        updated = self.updated
        if self.check_epochs:
            self._check_epoch(producer_epoch, offset)
            if updated.coordinator_epoch > marker.coordinator_epoch:
                raise TransactionCoordinatorFencedError(
                    f"Invalid coordinator epoch for producer {self.producer_id} at offset {offset} in "
                    f"{self.topic_partition}: {marker.coordinator_epoch} (zombie), {updated.coordinator_epoch} "
                    f"(current)")
        completed = None
        if updated.current_txn_first_offset is not None:
            completed = CompletedTxn(self.producer_id, updated.current_txn_first_offset, offset, not marker.commit)
        updated.maybe_update_producer_epoch(producer_epoch)
        updated.current_txn_first_offset = None
        updated.coordinator_epoch = marker.coordinator_epoch
        updated.last_timestamp = timestamp
        return completed

    def _check_epoch(self, producer_epoch: int, offset: int) -> None:
        if producer_epoch < self.updated.producer_epoch:
            raise InvalidProducerEpochError(
                f"Epoch of producer {self.producer_id} at offset {offset} in {self.topic_partition} is "
                f"{producer_epoch}, which is smaller than the last seen epoch {self.updated.producer_epoch}")

    def _check_sequence(self, producer_epoch: int, first_seq: int, offset: int) -> None:
        updated = self.updated
        if self.current is None and updated.is_empty and updated.producer_epoch == NO_PRODUCER_EPOCH:
            if first_seq != 0:
                raise UnknownProducerIdError(
                    f"Found no record of producer {self.producer_id} on the broker at offset {offset} in "
                    f"{self.topic_partition}: it may have expired or its records been removed "
                    f"(sequence {first_seq})")
            return
        if producer_epoch != updated.producer_epoch:
            if first_seq != 0:
                raise OutOfOrderSequenceError(
                    f"Invalid sequence number for new epoch of producer {self.producer_id} at offset {offset} in "
                    f"{self.topic_partition}: {producer_epoch} (request epoch), {first_seq} (seq. number), "
                    f"{updated.producer_epoch} (current producer epoch)")
            return
        if not in_sequence(updated.last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"Out of order sequence number for producer {self.producer_id} at offset {offset} in "
                f"{self.topic_partition}: {first_seq} (incoming seq. number), {updated.last_seq} "
                f"(current end sequence number)")


class ProducerStateManager:
    """producer id -> ProducerStateEntry for one partition, plus its snapshot files.

    Not thread-safe by itself: the owning Log calls it under its lock.
    """

    def __init__(self, dir: Path, topic_partition: str) -> None:
        self.dir = dir
        self.topic_partition = topic_partition
        self.producers: dict[int, ProducerStateEntry] = {}
        # Open transactions: first offset -> producer id, in offset order (appends only add larger offsets).
        self.ongoing_txns: dict[int, int] = {}
        # Every batch below this offset is reflected in `producers`.
        self.map_end_offset = 0

    # -- lookups -------------------------------------------------------------------------------

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self.producers.get(producer_id)

    @property
    def active_producers(self) -> dict[int, ProducerStateEntry]:
        return dict(self.producers)

    def __len__(self) -> int:
        return len(self.producers)

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest open transaction."""
        for first_offset in self.ongoing_txns:
            return first_offset
        return None

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The LSO once `completed` ends (Kafka's lastStableOffset(CompletedTxn)), for its aborted-txn entry."""
        for first_offset, pid in self.ongoing_txns.items():
            if pid != completed.producer_id:
                return first_offset
        return completed.last_offset + 1

    def complete_txn(self, completed: CompletedTxn) -> None:
        if self.ongoing_txns.pop(completed.first_offset, None) is None:
            logger.warning("Completed transaction of producer %d from offset %d in %s was not open",
                           completed.producer_id, completed.first_offset, self.topic_partition)

    # -- appends -------------------------------------------------------------------------------

    def prepare_update(self, producer_id: int, *, validate: bool, check_epochs: bool = True) -> ProducerAppendInfo:
        return ProducerAppendInfo(self.topic_partition, producer_id, self.producers.get(producer_id),
                                  validate=validate, check_epochs=check_epochs)

    def update(self, info: ProducerAppendInfo) -> None:
        self.producers[info.producer_id] = info.updated
        for first_offset in info.started_txns:
            self.ongoing_txns[first_offset] = info.producer_id

    def update_map_end_offset(self, offset: int) -> None:
        self.map_end_offset = offset

    def load_batches(self, batches: Iterable[tuple[RecordBatchHeader, EndTxnMarker | None]],
                     on_completed: Callable[[CompletedTxn, int], None] | None = None) -> int:
        """Replay batches already in the log (header and, for control batches, marker; no validation).

        on_completed(txn, last stable offset) sees every transaction a marker completes (to rebuild
        transaction indexes). Returns batches applied.
        """
        n = 0
        for h, marker in batches:
            if h.producer_id < 0:
                continue
            if h.next_offset <= self.map_end_offset:
                continue
            info = self.prepare_update(h.producer_id, validate=False, check_epochs=False)
            completed = info.append(h, marker)
            self.update(info)
            if completed is not None:
                if on_completed is not None:
                    on_completed(completed, self.last_stable_offset(completed))
                self.complete_txn(completed)
            n += 1
        return n

    # -- removal -------------------------------------------------------------------------------

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> list[int]:
        expired = [pid for pid, e in self.producers.items()
                   if e.current_txn_first_offset is None and now_ms - e.last_timestamp >= expiration_ms]
        for pid in expired:
            del self.producers[pid]
        return expired

    def on_log_start_offset_incremented(self, log_start_offset: int) -> None:
        """Kafka 3.x keeps a producer when the log start moves past all its batches (DeleteRecords, retention,
        KIP-360): it goes only after producer.id.expiration.ms, so idempotent and transactional producers carry on
        with their sequences instead of meeting UNKNOWN_PRODUCER_ID (Kafka 2.x's truncateHead forgot them)."""
        if self.map_end_offset < log_start_offset:
            self.map_end_offset = log_start_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.producers.clear()
        self.ongoing_txns.clear()
        self.delete_snapshots_above(-1)
        self.map_end_offset = offset

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot_offsets(self) -> list[int]:
        out = []
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        for name in names:
            if name.endswith(SNAPSHOT_SUFFIX) and name[: -len(SNAPSHOT_SUFFIX)].isdigit():
                out.append(int(name[: -len(SNAPSHOT_SUFFIX)]))
        return sorted(out)

    def snapshot_path(self, offset: int) -> Path:
        return self.dir / snapshot_file_name(offset)

    def latest_snapshot_offset(self) -> int | None:
        offsets = self.snapshot_offsets()
        return offsets[-1] if offsets else None

    def take_snapshot(self, *, sync: bool = False, retain: int = 2) -> Path:
        """Write the map as of map_end_offset; keep the newest `retain` snapshots."""
        path = self.snapshot_path(self.map_end_offset)
        data = encode_snapshot(self.map_end_offset, self.producers.values())
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        self.delete_old_snapshots(retain)
        return path

    def delete_old_snapshots(self, retain: int = 2) -> None:
        offsets = self.snapshot_offsets()
        for off in offsets[: max(0, len(offsets) - retain)]:
            self.snapshot_path(off).unlink(missing_ok=True)

    def delete_snapshots_above(self, offset: int) -> None:
        for off in self.snapshot_offsets():
            if off > offset:
                self.snapshot_path(off).unlink(missing_ok=True)

    def load_latest_snapshot(self, max_offset: int) -> int | None:
        """Replace the map with the newest valid snapshot at or below max_offset; returns its offset.

        Snapshots above max_offset and unreadable ones are deleted; with none, the map is emptied.
        """
        for p in self.dir.glob(f"*{SNAPSHOT_SUFFIX}.tmp"):
            p.unlink(missing_ok=True)
        self.delete_snapshots_above(max_offset)
        self.producers = {}
        self.ongoing_txns = {}
        self.map_end_offset = 0
        for off in reversed(self.snapshot_offsets()):
            path = self.snapshot_path(off)
            try:
                snap_offset, entries = decode_snapshot(path.read_bytes())
                if snap_offset != off:
                    raise CorruptSnapshotError(f"holds offset {snap_offset}")
            except (OSError, CorruptSnapshotError) as e:
                logger.warning("Deleting unreadable producer state snapshot %s of %s: %s", path,
                               self.topic_partition, e)
                path.unlink(missing_ok=True)
                continue
            self.producers = {e.producer_id: e for e in entries}
            open_txns = sorted((e.current_txn_first_offset, e.producer_id) for e in entries
                               if e.current_txn_first_offset is not None)
            self.ongoing_txns = dict(open_txns)
            self.map_end_offset = off
            return off
        return None


def encode_snapshot(offset: int, entries: Iterable[ProducerStateEntry]) -> bytes:
    body = bytearray()
    items = list(entries)
    body += _HEAD.pack(offset, len(items))
    for e in items:
        txn = -1 if e.current_txn_first_offset is None else e.current_txn_first_offset
        body += _ENTRY.pack(e.producer_id, e.producer_epoch, e.coordinator_epoch, e.last_timestamp, txn,
                            len(e.batch_metadata))
        for m in e.batch_metadata:
            body += _BATCH.pack(m.first_seq, m.last_seq, m.first_offset, m.last_offset, m.max_timestamp)
    return _PREFIX.pack(_MAGIC, _VERSION, crc32c.crc32c(body)) + bytes(body)


def decode_snapshot(data: bytes) -> tuple[int, list[ProducerStateEntry]]:
    if len(data) < _PREFIX.size + _HEAD.size:
        raise CorruptSnapshotError(f"too short ({len(data)} bytes)")
    magic, version, crc = _PREFIX.unpack_from(data, 0)
    if magic != _MAGIC:
        raise CorruptSnapshotError(f"bad magic {magic!r}")
    if version != _VERSION:
        raise CorruptSnapshotError(f"unsupported version {version}")
    body = memoryview(data)[_PREFIX.size:]
    if crc32c.crc32c(body) != crc:
        raise CorruptSnapshotError("CRC mismatch")
    try:
        offset, count = _HEAD.unpack_from(body, 0)
        pos = _HEAD.size
        entries = []
        for _ in range(count):
            pid, epoch, coord_epoch, last_ts, txn, n = _ENTRY.unpack_from(body, pos)
            pos += _ENTRY.size
            entry = ProducerStateEntry(pid, epoch, last_timestamp=last_ts, coordinator_epoch=coord_epoch,
                                       current_txn_first_offset=None if txn < 0 else txn)
            for _b in range(n):
                entry.batch_metadata.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            entries.append(entry)
    except struct.error as e:
        raise CorruptSnapshotError(f"truncated: {e}") from None
    if pos != len(body):
        raise CorruptSnapshotError(f"{len(body) - pos} trailing bytes")
    return offset, entries


def validate_client_batch(h: RecordBatchHeader) -> None:
    """Kafka's LogValidator rule for client batches carrying a producer id."""
    if h.producer_id >= 0 and h.base_sequence < 0:
        raise InvalidRecordError(f"Invalid sequence number {h.base_sequence} in batch of producer {h.producer_id}")

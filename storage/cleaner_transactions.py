"""Transaction rules of the log cleaner (Kafka's CleanedTransactionMetadata and LogCleaner batch retention).

- Batches of aborted transactions are removed (their keys never enter the offset map).
- A marker stays while any batch of its transaction remains (seen in this pass); after that it gets a
  delete horizon of now + delete.retention.ms and is removed by the first pass after the horizon.
- The last batch of a producer still in the producer state is kept as an empty batch instead of being
  removed, so its sequence/epoch survive a reload.
- The cleanable range ends at the last stable offset, so batches of open transactions are never touched.
- The cleaned segment's transaction index holds the aborted transactions whose markers it keeps and
  whose batches were seen in this pass.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kbroker.protocol.control_records import EndTxnMarker, parse_end_txn_marker
from kbroker.protocol.records import COMPRESSION_NONE, Record, RecordBatchHeader, build_batch, decode_records
from kbroker.storage.producer_state import ProducerStateEntry
from kbroker.storage.transaction_index import AbortedTxn, TransactionIndex


@dataclass(slots=True)
class _AbortedTxnMetadata:
    txn: AbortedTxn
    last_observed_batch_offset: int | None = None


@dataclass(slots=True, frozen=True)
class LastRecord:
    """A producer's last data offset (None when it has only markers left) and epoch."""

    last_data_offset: int | None
    producer_epoch: int


def last_records_of_producers(entries: list[ProducerStateEntry]) -> dict[int, LastRecord]:
    return {e.producer_id: LastRecord(None if e.is_empty else e.last_data_offset, e.producer_epoch)
            for e in entries}


class CleanedTransactionMetadata:
    """Fed every transactional batch and marker of one pass in offset order."""

    def __init__(self, aborted: list[AbortedTxn]) -> None:
        self._aborted = deque(sorted(aborted, key=lambda t: t.first_offset))
        self._ongoing_committed: set[int] = set()
        self._ongoing_aborted: dict[int, _AbortedTxnMetadata] = {}
        # The transaction index of the segment being written, if any.
        self.cleaned_index: TransactionIndex | None = None

    def _consume_aborted_up_to(self, offset: int) -> None:
        while self._aborted and self._aborted[0].first_offset <= offset:
            txn = self._aborted.popleft()
            self._ongoing_aborted.setdefault(txn.producer_id, _AbortedTxnMetadata(txn))

    def on_control_batch_read(self, h: RecordBatchHeader, marker: EndTxnMarker | None) -> bool:
        """True when the marker may go (once its delete horizon passed)."""
        self._consume_aborted_up_to(h.last_offset)
        if marker is None:
            return True  # an empty control batch: its marker was cleaned already
        pid = h.producer_id
        if not marker.commit:
            meta = self._ongoing_aborted.pop(pid, None)
            if meta is not None and meta.last_observed_batch_offset is not None:
                # Batches of this transaction were seen: keep the marker until they are all gone.
                if self.cleaned_index is not None:
                    self.cleaned_index.append(meta.txn)
                return False
            return True
        if pid in self._ongoing_committed:
            self._ongoing_committed.discard(pid)
            return False
        return True

    def on_batch_read(self, h: RecordBatchHeader) -> bool:
        """True when the data batch belongs to an aborted transaction."""
        self._consume_aborted_up_to(h.last_offset)
        if not h.is_transactional:
            return False
        meta = self._ongoing_aborted.get(h.producer_id)
        if meta is not None:
            meta.last_observed_batch_offset = h.last_offset
            return True
        self._ongoing_committed.add(h.producer_id)
        return False


def is_last_batch_of_producer(h: RecordBatchHeader, last_records: dict[int, LastRecord]) -> bool:
    last = last_records.get(h.producer_id)
    if last is None:
        return False
    if last.last_data_offset is not None:
        return h.last_offset == last.last_data_offset
    return h.is_control and h.producer_epoch == last.producer_epoch


def empty_batch(h: RecordBatchHeader) -> bytes:
    """The batch without records: offsets, producer id/epoch/sequence and flags kept."""
    return build_batch([], base_offset=h.base_offset, compression=COMPRESSION_NONE, producer_id=h.producer_id,
                       producer_epoch=h.producer_epoch, base_sequence=h.base_sequence,
                       is_transactional=h.is_transactional, is_control=h.is_control,
                       timestamp_type=h.timestamp_type, partition_leader_epoch=h.partition_leader_epoch,
                       last_offset_delta=h.last_offset_delta, max_timestamp=h.max_timestamp)


def filter_control_batch(h: RecordBatchHeader, raw: bytes, txn: CleanedTransactionMetadata,
                         last_records: dict[int, LastRecord], now_ms: int, delete_retention_ms: int,
                         max_size: int) -> tuple[bytes | None, int | None]:
    """(the marker batch to keep — `raw` when unchanged — or None, its pending delete horizon)."""
    marker = parse_end_txn_marker(raw, max_size=max_size) if h.records_count else None
    can_discard = txn.on_control_batch_read(h, marker)
    retain_empty = h.producer_id >= 0 and is_last_batch_of_producer(h, last_records)
    if not h.records_count:
        return (raw if retain_empty else None), None
    if not can_discard:
        return raw, None
    if h.has_delete_horizon:
        if h.delete_horizon_ms <= now_ms:
            return (empty_batch(h) if retain_empty else None), None
        return raw, h.delete_horizon_ms
    horizon = now_ms + delete_retention_ms
    records: list[Record] = decode_records(raw, max_size=max_size)
    out = build_batch(records, base_offset=h.base_offset, compression=h.compression, producer_id=h.producer_id,
                      producer_epoch=h.producer_epoch, base_sequence=h.base_sequence, is_transactional=True,
                      is_control=True, partition_leader_epoch=h.partition_leader_epoch,
                      last_offset_delta=h.last_offset_delta, max_timestamp=h.max_timestamp,
                      delete_horizon_ms=horizon)
    return out, horizon


def filter_aborted_batch(h: RecordBatchHeader, raw: bytes, last_records: dict[int, LastRecord]) -> bytes | None:
    """A batch of an aborted transaction: gone, or empty when it is its producer's last."""
    if h.producer_id >= 0 and is_last_batch_of_producer(h, last_records):
        return raw if h.records_count == 0 else empty_batch(h)
    return None

"""LogCleaner and transactions: aborted data removed, markers kept until delete.retention.ms, open txns untouched."""

from __future__ import annotations

from kbroker.protocol.records import iter_batch_headers
from kbroker.storage.cleaner import clean_log
from kbroker.storage.log import Log
from kbroker.storage.transaction_index import AbortedTxn

from tests.storage.storage_helpers import NOW, kv_batch, read_all

DAY = 86_400_000


def _compacted(make_log) -> Log:
    return make_log(cleanup_policy="compact", segment_bytes=400, file_delete_delay_ms=0,
                    min_cleanable_dirty_ratio=0.0, delete_retention_ms=DAY)


class Txn:
    def __init__(self, log: Log, pid: int) -> None:
        self.log, self.pid, self.seq = log, pid, 0

    def send(self, key: bytes, value: bytes, *, transactional: bool = True) -> int:
        b = kv_batch([(key, value)], producer_id=self.pid, producer_epoch=0, base_sequence=self.seq,
                     is_transactional=transactional)
        self.seq += 1
        return self.log.append_as_leader(b, NOW).first_offset

    def end(self, commit: bool) -> int:
        return self.log.append_control(self.pid, 0, 0, commit, NOW).first_offset


def _batches(log: Log) -> list[tuple[int, bool, int, int]]:
    """(base offset, is control, records, producer id) of every batch on disk."""
    out = []
    for seg in log.segments:
        if seg.size:
            data = log.read(seg.base_offset, 1 << 30, min_one_message=True).records
            assert data is not None
            out += [(h.base_offset, h.is_control, h.records_count, h.producer_id)
                     for _, h in iter_batch_headers(data.read_bytes())]
    return out


def _fill(log: Log) -> tuple[list[int], list[int]]:
    """Producer 1 commits k1=c, producer 2 aborts k1=a and k2=a; returns (marker offsets, aborted data offsets)."""
    log.append_as_leader(kv_batch([(b"k1", b"orig"), (b"k2", b"orig")]), NOW)
    p1, p2 = Txn(log, 1), Txn(log, 2)
    aborted = [p2.send(b"k1", b"a")]
    p1.send(b"k3", b"c")
    aborted.append(p2.send(b"k2", b"a"))
    markers = [p1.end(commit=True), p2.end(commit=False)]
    for i in range(12):  # filler so the transactions land in cleanable segments
        log.append_as_leader(kv_batch([(b"f%d" % i, b"x" * 40)]), NOW)
    # The producers' last batches are in the active segment: nothing cleanable is "last of a producer".
    p1.send(b"z1", b"z", transactional=False)
    p2.send(b"z2", b"z", transactional=False)
    return markers, aborted


def test_aborted_data_removed_and_never_shadows_committed_keys(make_log) -> None:
    log = _compacted(make_log)
    markers, aborted = _fill(log)
    index_before = log.collect_aborted_transactions(0, log.log_end_offset)
    assert index_before == [AbortedTxn(2, aborted[0], markers[1], markers[1] + 1)]
    stats = clean_log(log, NOW)
    assert stats is not None
    values = {r.key: r.value for r in read_all(log) if r.offset not in markers}
    assert values[b"k1"] == b"orig" and values[b"k2"] == b"orig" and values[b"k3"] == b"c"
    offsets = {b[0] for b in _batches(log)}
    assert not offsets & set(aborted)
    # Both markers stay: their transactions had batches in this pass (the abort's entry stays indexed).
    assert set(markers) <= offsets
    assert log.collect_aborted_transactions(0, log.log_end_offset) == index_before


def test_markers_dropped_only_after_delete_retention(make_log) -> None:
    log = _compacted(make_log)
    markers, _ = _fill(log)
    clean_log(log, NOW)
    # Second pass: no batch of either transaction is left, the markers get a delete horizon.
    clean_log(log, NOW + 1000, force=True)
    assert set(markers) <= {b[0] for b in _batches(log)}
    assert log.tombstone_horizon_ms == NOW + 1000 + DAY
    assert log.collect_aborted_transactions(0, log.log_end_offset) == []  # no data left to filter
    clean_log(log, NOW + DAY, force=True)
    assert set(markers) <= {b[0] for b in _batches(log)}
    clean_log(log, NOW + 1000 + DAY, force=True)
    # The abort marker goes; the commit marker stays while its transaction's k3 is in the log (Kafka's rule).
    assert markers[0] in {b[0] for b in _batches(log)} and markers[1] not in {b[0] for b in _batches(log)}
    values = {r.key: r.value for r in read_all(log)}
    assert values[b"k3"] == b"c" and values[b"k1"] == b"orig"


def test_open_transaction_is_never_cleaned(make_log) -> None:
    log = _compacted(make_log)
    p = Txn(log, 7)
    log.append_as_leader(kv_batch([(b"k", b"old")]), NOW)
    first = p.send(b"k", b"open")
    for i in range(12):
        log.append_as_leader(kv_batch([(b"k", b"x" * 40 + b"%d" % i)]), NOW)
    assert log.last_stable_offset == first and len(log.segments) > 2
    clean_log(log, NOW)
    # Only offsets below the LSO were cleanable: the open transaction's batch and everything after it remain.
    offsets = {b[0] for b in _batches(log)}
    assert first in offsets and all(o in offsets for o in range(first, log.log_end_offset))
    p.end(commit=False)
    for i in range(10):
        log.append_as_leader(kv_batch([(b"g%d" % i, b"y" * 40)]), NOW)
    clean_log(log, NOW, force=True)
    # Aborted now: its records go; the batch stays empty as the producer's last one.
    assert {b[0]: b for b in _batches(log)}[first] == (first, False, 0, 7)
    assert [r.value for r in read_all(log) if r.key == b"k"] == [b"x" * 40 + b"11"]


def test_last_batch_of_producer_kept_empty(make_log) -> None:
    log = _compacted(make_log)
    p = Txn(log, 9)
    first = p.send(b"k", b"aborted")
    marker = p.end(commit=False)
    for i in range(12):
        log.append_as_leader(kv_batch([(b"f%d" % i, b"x" * 40)]), NOW)
    clean_log(log, NOW)
    by_offset = {b[0]: b for b in _batches(log)}
    # The aborted batch is the producer's last data batch: kept without records, with its marker.
    assert by_offset[first] == (first, False, 0, 9) and by_offset[marker][1]
    assert log.collect_aborted_transactions(0, log.log_end_offset) == [AbortedTxn(9, first, marker, marker + 1)]
    # Reload: the producer's state and no open transaction come back.
    log.take_producer_snapshot()
    for s in log.dir.glob("*.snapshot"):
        s.unlink()
    log.truncate_to(log.log_end_offset - 1)
    assert log.ongoing_transaction_first_offset(9) is None and log.last_stable_offset == log.log_end_offset

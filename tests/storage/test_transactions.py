"""Transactions in the storage layer: producer state, LSO, the aborted-transaction index, recovery."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
from kbroker.protocol.control_records import build_end_txn_marker_batch, parse_end_txn_marker
from kbroker.protocol.records import iter_batch_headers
from kbroker.storage.config import LogConfig
from kbroker.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from kbroker.storage.log import Log
from kbroker.storage.transaction_index import AbortedTxn, TransactionIndex

from tests.storage.storage_helpers import NOW, batch

CFG = LogConfig(segment_bytes=1500, index_interval_bytes=100)


class Producer:
    """Stages the batches of one transactional producer with the right sequences."""

    def __init__(self, pid: int, epoch: int = 0) -> None:
        self.pid = pid
        self.epoch = epoch
        self.seq = 0

    def batch(self, n: int = 1, *, transactional: bool = True, key: str = "k", size: int = 10) -> bytes:
        b = batch(n, key=key, size=size, producer_id=self.pid, producer_epoch=self.epoch, base_sequence=self.seq,
                  is_transactional=transactional)
        self.seq += n
        return b

    def send(self, log: Log, n: int = 1, **kw: object) -> int:
        return log.append_as_leader(self.batch(n, **kw), NOW).first_offset  # type: ignore[arg-type]

    def end(self, log: Log, commit: bool, coordinator_epoch: int = 0) -> int:
        return log.append_control(self.pid, self.epoch, coordinator_epoch, commit, NOW).first_offset


def _txn_index_path(log: Log, base: int) -> Path:
    return log.dir / f"{base:020d}.txnindex"


def _entries_bytes(*txns: AbortedTxn) -> bytes:
    return b"".join(struct.pack(">hqqqq", 0, t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
                    for t in txns)


def _read_committed(log: Log, offset: int) -> tuple[list[int], list[AbortedTxn]]:
    info = log.read(offset, 1 << 20, max_offset=log.high_watermark, isolation_committed=True)
    assert info.aborted_transactions is not None
    offsets: list[int] = []
    if info.records is not None:
        offsets = [h.base_offset for _, h in iter_batch_headers(info.records.read_bytes())]
    return offsets, info.aborted_transactions


def test_marker_batch_format() -> None:
    raw = build_end_txn_marker_batch(7, 3, 5, False, NOW, base_offset=10)
    (_, h), = iter_batch_headers(raw)
    assert h.is_control and h.is_transactional and h.producer_id == 7 and h.producer_epoch == 3
    assert h.base_sequence == -1 and h.records_count == 1
    marker = parse_end_txn_marker(raw)
    assert marker is not None and not marker.commit and marker.coordinator_epoch == 5
    from kbroker.protocol.records import decode_records
    rec, = decode_records(raw)
    assert rec.key == struct.pack(">hh", 0, 0) and rec.value == struct.pack(">hi", 0, 5)


def test_commit_moves_lso_and_clears_open_txn(make_log) -> None:
    log = make_log(CFG)
    p = Producer(1)
    assert log.last_stable_offset == 0
    plain = log.append_as_leader(batch(2), NOW)
    assert log.last_stable_offset == 2
    first = p.send(log, 3)
    assert first == plain.last_offset + 1
    p.send(log, 2)
    assert log.last_stable_offset == first and log.high_watermark == 7
    assert log.ongoing_transaction_first_offset(1) == first
    marker = p.end(log, commit=True)
    assert marker == 7 and log.last_stable_offset == 8 == log.log_end_offset
    assert log.ongoing_transaction_first_offset(1) is None
    state, = log.producer_states()
    assert state.producer_id == 1 and state.current_txn_first_offset is None and state.coordinator_epoch == 0
    assert not _txn_index_path(log, 0).exists()  # Kafka creates the file with the first aborted transaction


def test_abort_writes_kafka_format_entry(make_log) -> None:
    log = make_log(CFG)
    a, b = Producer(10), Producer(20)
    a_first = a.send(log, 2)          # 0-1
    b_first = b.send(log, 1)          # 2
    a.send(log, 1)                    # 3
    a_marker = a.end(log, commit=False)   # 4: b still open -> LSO after it is b's first offset
    assert log.last_stable_offset == b_first
    b_marker = b.end(log, commit=False)   # 5: nothing open -> marker + 1
    assert log.last_stable_offset == 6
    expected = [AbortedTxn(10, a_first, a_marker, b_first), AbortedTxn(20, b_first, b_marker, b_marker + 1)]
    assert _txn_index_path(log, 0).read_bytes() == _entries_bytes(*expected)
    assert len(_txn_index_path(log, 0).read_bytes()) == 2 * 34
    assert log.collect_aborted_transactions(0, 6) == expected
    assert log.collect_aborted_transactions(5, 6) == expected[1:]
    assert log.collect_aborted_transactions(0, 2) == expected[:1]
    assert log.collect_aborted_transactions(6, 7) == []


def test_read_committed_stops_at_lso_and_lists_aborted(make_log) -> None:
    log = make_log(CFG)
    a, b = Producer(1), Producer(2)
    a.send(log)                        # 0
    b.send(log)                        # 1
    a_marker = a.end(log, commit=False)    # 2
    log.append_as_leader(batch(1), NOW)    # 3 (non-transactional)
    offsets, aborted = _read_committed(log, 0)
    assert offsets == [0] and aborted == [AbortedTxn(1, 0, a_marker, 1)]
    info = log.read(0, 1 << 20, isolation_committed=True)
    assert info.last_stable_offset == 1 and info.high_watermark == 4
    uncommitted = log.read(0, 1 << 20)
    assert uncommitted.aborted_transactions is None and uncommitted.last_stable_offset == 1
    b.end(log, commit=True)            # 4
    offsets, aborted = _read_committed(log, 0)
    assert offsets == [0, 1, 2, 3, 4] and aborted == [AbortedTxn(1, 0, a_marker, 1)]
    offsets, aborted = _read_committed(log, 3)
    assert offsets == [3, 4] and aborted == []
    at_lso = log.read(5, 100, isolation_committed=True)
    assert at_lso.records is None and at_lso.aborted_transactions == []


def test_read_committed_upper_bound_is_the_end_of_what_is_returned(make_log) -> None:
    log = make_log(CFG)
    a, b = Producer(1), Producer(2)
    a.send(log, key="a", size=200)     # 0
    b.send(log, key="b", size=200)     # 1
    a.end(log, commit=True)            # 2
    b.end(log, commit=False)           # 3
    one = len(a.batch(1, size=200))
    info = log.read(0, one, isolation_committed=True)
    assert info.records is not None
    # Only batch 0 fits: b's transaction starts at 1, outside [0, 1).
    assert info.aborted_transactions == []
    info = log.read(0, 1 << 20, isolation_committed=True)
    assert info.aborted_transactions == [AbortedTxn(2, 1, 3, 4)]


def test_aborted_transactions_across_segments(make_log) -> None:
    log = make_log(CFG)
    a, b = Producer(1), Producer(2)
    a_first = a.send(log, size=300)
    for _ in range(8):
        b.send(log, size=300)
        b.end(log, commit=False)
    a_marker = a.end(log, commit=False)
    assert len(log.segments) > 2
    entries = [e for s in log.segments for e in s.txn_index.all_entries()]
    assert len(entries) == 9 and entries[-1] == AbortedTxn(1, a_first, a_marker, a_marker + 1)
    # Each entry lives in the segment holding its marker.
    for seg in log.segments:
        for e in seg.txn_index.all_entries():
            assert log._segment_for(e.last_offset) is seg
    # While a was open every b abort has LSO = a's first offset.
    assert all(e.last_stable_offset == a_first for e in entries[:-1])
    assert log.collect_aborted_transactions(0, log.log_end_offset) == entries
    last_seg = log.segments[-1].base_offset
    got = log.collect_aborted_transactions(last_seg, log.log_end_offset)
    assert entries[-1] in got and all(e.last_offset >= last_seg for e in got)
    # A read stops at the end of a segment: transactions starting after what it returns are left out.
    start = log.segments[1].base_offset
    offsets, aborted = _read_committed(log, start)
    upper = log.segments[2].base_offset
    assert offsets[-1] < upper
    assert aborted == [e for e in entries if e.last_offset >= start and e.first_offset < upper]
    assert AbortedTxn(1, a_first, a_marker, a_marker + 1) in aborted


def test_marker_epoch_checks(make_log) -> None:
    log = make_log(CFG)
    p = Producer(5, epoch=2)
    p.send(log)
    with pytest.raises(InvalidProducerEpochError) as e:
        log.append_control(5, 1, 0, True, NOW)
    assert e.value.error_code == 47
    p.end(log, commit=False, coordinator_epoch=4)
    with pytest.raises(TransactionCoordinatorFencedError) as f:
        log.append_control(5, 2, 3, False, NOW)
    assert f.value.error_code == 52
    leo = log.log_end_offset
    # A marker without an open transaction is written and completes nothing.
    assert log.append_control(5, 3, 4, True, NOW).first_offset == leo
    assert log.log_end_offset == leo + 1 and log.last_stable_offset == leo + 1
    assert len(log.active_segment.txn_index.all_entries()) == 1
    assert log.producer_states()[0].producer_epoch == 3


def test_non_transactional_batch_inside_open_txn_is_invalid_txn_state(make_log) -> None:
    log = make_log(CFG)
    p = Producer(9)
    p.send(log)
    leo = log.log_end_offset
    with pytest.raises(InvalidTxnStateError) as e:
        log.append_as_leader(p.batch(1, transactional=False), NOW)
    assert e.value.error_code == 48 and log.log_end_offset == leo
    # Idempotent batches of a producer without an open transaction are fine.
    q = Producer(10)
    q.send(log, transactional=False)
    assert log.last_stable_offset == 0


def test_producer_expiry_keeps_open_transactions(make_log) -> None:
    log = make_log(CFG)
    a, b = Producer(1), Producer(2)
    a.send(log)
    b.send(log)
    b.end(log, commit=True)
    assert log.remove_expired_producers(NOW + 10**9, 1000) == [2]
    assert log.ongoing_transaction_first_offset(1) == 0 and log.last_stable_offset == 0


def _txn_workload(log: Log) -> None:
    a, b, c = Producer(1), Producer(2), Producer(3)
    for i in range(6):
        a.send(log, size=150)
        b.send(log, size=150)
        a.end(log, commit=i % 2 == 0)
        log.append_as_leader(batch(1, size=100), NOW)
        b.end(log, commit=i % 3 == 0)
    c.send(log, 2, size=100)            # left open
    a.send(log, size=50)                # left open too


def _txn_state(log: Log) -> tuple[int, list[AbortedTxn], dict[int, bytes], dict[int, int | None]]:
    files = {s.base_offset: _txn_index_path(log, s.base_offset).read_bytes()
             for s in log.segments if _txn_index_path(log, s.base_offset).exists()}
    open_txns = {e.producer_id: e.current_txn_first_offset for e in log.producer_states()}
    return (log.last_stable_offset, log.collect_aborted_transactions(0, log.log_end_offset), files, open_txns)


def test_clean_restart_keeps_open_transactions(log_dir: Path) -> None:
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=True)
    _txn_workload(log)
    before = _txn_state(log)
    assert before[0] < log.log_end_offset and len(before[1]) > 2
    log.close()
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=True)
    try:
        assert _txn_state(log) == before
        # The open transactions can still be completed after the restart.
        log.append_control(3, 0, 0, False, NOW)
        log.append_control(1, 0, 0, True, NOW)
        assert log.last_stable_offset == log.log_end_offset
        assert log.collect_aborted_transactions(0, log.log_end_offset)[-1].producer_id == 3
    finally:
        log.close()


def test_restart_from_snapshot_replays_open_transaction(log_dir: Path) -> None:
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=True)
    p = Producer(4)
    first = p.send(log, size=100)
    log.take_producer_snapshot()        # snapshot holds the open transaction
    p.send(log, size=100)
    q = Producer(5)
    q_first = q.send(log)               # opened after the snapshot: found by the replay
    leo = log.log_end_offset
    # No close: the state at LEO comes from the snapshot plus the batches after it.
    log.flush()
    for seg in log.segments:
        seg.close()
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=False, recovery_point=leo)
    try:
        assert log.ongoing_transaction_first_offset(4) == first
        assert log.ongoing_transaction_first_offset(5) == q_first
        assert log.last_stable_offset == first
    finally:
        log.close()


def test_unclean_recovery_rebuilds_txn_index_and_truncates_torn_tail(log_dir: Path) -> None:
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=True)
    _txn_workload(log)
    before = _txn_state(log)
    path = log.active_segment.log_path
    log.close()
    # Crash leftovers: a torn batch at the end, transaction indexes lost, no usable snapshot.
    with open(path, "ab") as f:
        f.write(Producer(1).batch(3)[:40])
    for p in log_dir.glob("*.txnindex"):
        p.unlink()
    for p in log_dir.glob("*.snapshot"):
        p.unlink()
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=False, recovery_point=0)
    try:
        assert _txn_state(log) == before
    finally:
        log.close()


def test_unclean_recovery_from_recovery_point_uses_snapshot(log_dir: Path) -> None:
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=True)
    _txn_workload(log)
    before = _txn_state(log)
    bases = [s.base_offset for s in log.segments]
    log.close()
    mid = bases[len(bases) // 2]
    for p in log_dir.glob("*.txnindex"):
        if int(p.name.split(".")[0]) >= mid:
            p.write_bytes(b"\x00" * 7)  # garbage in the unflushed part: rebuilt, not trusted
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=False, recovery_point=mid)
    try:
        assert _txn_state(log) == before
    finally:
        log.close()


def test_interrupted_cleaning_rebuilds_txn_index(log_dir: Path) -> None:
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=True)
    _txn_workload(log)
    before = _txn_state(log)
    seg = next(s for s in log.segments if _txn_index_path(log, s.base_offset).exists())
    log.close()
    stem = log_dir / f"{seg.base_offset:020d}"
    shutil.copy(f"{stem}.log", f"{stem}.log.swap")   # a finished cleaning that changed nothing
    os.rename(f"{stem}.txnindex", f"{stem}.txnindex.swap")
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=True)
    try:
        assert _txn_state(log) == before
    finally:
        log.close()


def test_truncate_to_drops_entries_and_reopens_transactions(make_log) -> None:
    log = make_log(CFG)
    a, b = Producer(1), Producer(2)
    a.send(log)                        # 0
    b.send(log)                        # 1
    a.end(log, commit=False)           # 2
    b.end(log, commit=False)           # 3
    assert len(log.collect_aborted_transactions(0, 4)) == 2
    log.truncate_to(3)
    assert log.collect_aborted_transactions(0, 4) == [AbortedTxn(1, 0, 2, 1)]
    assert log.ongoing_transaction_first_offset(2) == 1 and log.last_stable_offset == 1
    assert _txn_index_path(log, 0).read_bytes() == _entries_bytes(AbortedTxn(1, 0, 2, 1))
    log.truncate_to(1)
    assert log.collect_aborted_transactions(0, 4) == [] and log.last_stable_offset == 0
    assert log.ongoing_transaction_first_offset(1) == 0


def test_retention_and_delete_records_remove_txn_index_with_segment(make_log) -> None:
    log = make_log(CFG.replace(file_delete_delay_ms=0))
    p = Producer(1)
    for _ in range(10):
        p.send(log, size=300)
        p.end(log, commit=False)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 3 and all(_txn_index_path(log, b).exists() for b in bases)
    log.delete_records_before(bases[2])
    log.delete_pending_files()
    assert not _txn_index_path(log, bases[0]).exists() and not _txn_index_path(log, bases[1]).exists()
    assert _txn_index_path(log, bases[2]).exists()
    assert all(e.last_offset >= bases[2] for e in log.collect_aborted_transactions(0, log.log_end_offset))
    log.truncate_fully_and_start_at(500)
    log.delete_pending_files()
    assert not list(log.dir.glob("*.txnindex")) and log.last_stable_offset == 500


def test_open_txn_below_log_start_is_clamped(make_log) -> None:
    log = make_log(CFG)
    p = Producer(1)
    p.send(log, size=300)
    for _ in range(6):
        log.append_as_leader(batch(1, size=300), NOW)
    log.delete_records_before(3)
    assert log.last_stable_offset == 3 and log.ongoing_transaction_first_offset(1) == 0


def test_transaction_index_file_ops(tmp_path: Path) -> None:
    idx = TransactionIndex(tmp_path / "00000000000000000000.txnindex", 0)
    assert idx.all_entries() == [] and not idx.path.exists()
    e1, e2 = AbortedTxn(1, 0, 5, 3), AbortedTxn(2, 3, 9, 10)
    idx.append(e1)
    idx.append(e2)
    with pytest.raises(ValueError):
        idx.append(AbortedTxn(3, 4, 9, 10))
    idx.flush()
    idx.close()
    reopened = TransactionIndex(idx.path, 0)
    assert reopened.all_entries() == [e1, e2]
    reopened.sanity_check()
    assert reopened.collect_aborted_txns(6, 20) == ([e2], False)
    assert reopened.collect_aborted_txns(6, 10) == ([e2], True)
    assert reopened.collect_aborted_txns(0, 3) == ([e1], True)
    assert reopened.collect_aborted_txns(0, 4) == ([e1, e2], True)
    assert reopened.collect_aborted_txns(0, 11) == ([e1, e2], False)
    reopened.truncate_to(9)
    assert reopened.all_entries() == [e1] and idx.path.stat().st_size == 34
    with open(idx.path, "ab") as f:
        f.write(b"\x00" * 5)
    from kbroker.storage.transaction_index import CorruptTransactionIndexError
    with pytest.raises(CorruptTransactionIndexError):
        TransactionIndex(idx.path, 0).sanity_check()
    assert TransactionIndex(idx.path, 0).all_entries() == [e1]


def test_torn_marker_leaves_transaction_open_after_recovery(log_dir: Path) -> None:
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=True)
    p = Producer(3)
    first = p.send(log, 2)
    marker = p.end(log, commit=False)
    assert log.collect_aborted_transactions(0, log.log_end_offset) == [AbortedTxn(3, first, marker, marker + 1)]
    path = log.active_segment.log_path
    size = os.path.getsize(path)
    log.close()
    os.truncate(path, size - 10)  # the marker write was torn by the crash
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=False, recovery_point=0)
    try:
        assert log.log_end_offset == marker and log.last_stable_offset == first
        assert log.ongoing_transaction_first_offset(3) == first
        assert log.collect_aborted_transactions(0, log.log_end_offset) == []
        assert not _txn_index_path(log, 0).read_bytes()
        # The coordinator writes the marker again.
        assert p.end(log, commit=False) == marker
        assert log.collect_aborted_transactions(0, log.log_end_offset) == [AbortedTxn(3, first, marker, marker + 1)]
    finally:
        log.close()

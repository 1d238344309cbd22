"""Idempotent producer state: sequence validation, duplicates, snapshots, rebuild, truncation, expiration."""

from __future__ import annotations

from pathlib import Path

import pytest
from kbroker.protocol.records import InvalidRecordError, build_batch
from kbroker.storage.cleaner import clean_log
from kbroker.storage.config import LogConfig
from kbroker.storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError, UnknownProducerIdError
from kbroker.storage.log import Log
from kbroker.storage.manager import LogManager
from kbroker.storage.producer_state import (
    INT32_MAX,
    ProducerStateEntry,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    in_sequence,
    snapshot_file_name,
)

from tests.storage.storage_helpers import NOW, batch, read_all

PID = 1000


def pbatch(seq: int, n: int = 1, *, pid: int = PID, epoch: int = 0, ts: int = NOW, key: str = "k",
           **kw: object) -> bytes:
    return batch(n, producer_id=pid, producer_epoch=epoch, base_sequence=seq, ts=ts, key=key, **kw)


def snapshots(dir: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in dir.glob("*.snapshot"))


def reopen(log: Log, *, clean: bool, config: LogConfig | None = None) -> Log:
    dir, cfg = log.dir, config or log.config
    if clean:
        log.close()
    else:
        # kill -9: no close, no snapshot; the files stay as they are
        for seg in log.segments:
            seg.close()
        log._closed = True
    return Log.open(dir, "topic", 0, cfg, clean_shutdown=clean, recovery_point=0)


# -- sequence validation ------------------------------------------------------------------------


def test_in_sequence_wraps_at_int32_max() -> None:
    assert in_sequence(-1, 0) and in_sequence(4, 5) and in_sequence(INT32_MAX, 0)
    assert not in_sequence(4, 4) and not in_sequence(4, 6) and not in_sequence(INT32_MAX - 1, 0)


def test_in_sequence_batches_append(make_log) -> None:
    log = make_log()
    assert log.append_as_leader(pbatch(0, 3), NOW).first_offset == 0
    assert log.append_as_leader(pbatch(3, 2), NOW).first_offset == 3
    entry = log.producer_state.last_entry(PID)
    assert entry is not None and (entry.producer_epoch, entry.first_seq, entry.last_seq) == (0, 0, 4)
    assert [(m.first_seq, m.last_seq, m.first_offset, m.last_offset) for m in entry.batch_metadata] == [
        (0, 2, 0, 2), (3, 4, 3, 4)]
    assert log.log_end_offset == 5


def test_duplicate_returns_original_offsets_and_appends_nothing(make_log) -> None:
    log = make_log()
    log.append_as_leader(batch(2), NOW)  # offsets 0-1 without a producer
    for i in range(6):
        log.append_as_leader(pbatch(2 * i, 2), NOW)  # offsets 2..13, sequences 0..11
    size, leo = log.size, log.log_end_offset
    # a retry of any of the last 5 batches: the original offsets, no append
    for i in range(1, 6):
        info = log.append_as_leader(pbatch(2 * i, 2), NOW + 1)
        assert (info.first_offset, info.last_offset, info.num_records) == (2 + 2 * i, 3 + 2 * i, 0)
    assert (log.size, log.log_end_offset) == (size, leo)
    # the first batch fell out of the 5 kept: a retry of it is out of order now
    with pytest.raises(OutOfOrderSequenceError) as ei:
        log.append_as_leader(pbatch(0, 2), NOW)
    assert ei.value.error_code == 45
    # same first sequence but a different range is not a duplicate
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(pbatch(10, 1), NOW)
    assert log.append_as_leader(pbatch(12), NOW).first_offset == leo


def test_duplicate_with_log_append_time_reports_original_time(make_log) -> None:
    log = make_log(message_timestamp_type="LogAppendTime")
    first = log.append_as_leader(pbatch(0, 2), NOW + 5)
    dup = log.append_as_leader(pbatch(0, 2), NOW + 99)
    assert (dup.first_offset, dup.log_append_time) == (first.first_offset, first.log_append_time) == (0, NOW + 5)


def test_gap_is_out_of_order(make_log) -> None:
    log = make_log()
    log.append_as_leader(pbatch(0, 2), NOW)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(pbatch(3), NOW)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(pbatch(1), NOW)  # overlaps, not an exact duplicate
    assert log.log_end_offset == 2 and log.append_as_leader(pbatch(2), NOW).first_offset == 2


def test_sequence_wraps_around(make_log) -> None:
    log = make_log()
    log.append_as_leader(pbatch(0), NOW)
    # jump the producer close to the end of the sequence space with a new epoch, then wrap
    log.append_as_leader(pbatch(0, epoch=1), NOW)
    entry = log.producer_state.last_entry(PID)
    assert entry is not None
    # pretend many batches went by: put the entry at INT32_MAX - 2
    entry.batch_metadata.clear()
    entry.add_batch(1, INT32_MAX - 5, INT32_MAX - 3, 1, 1, NOW)
    info = log.append_as_leader(pbatch(INT32_MAX - 2, 5, epoch=1), NOW)  # sequences MAX-2..MAX, 0, 1
    assert info.first_offset == 2
    entry = log.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == 1
    assert log.append_as_leader(pbatch(2, epoch=1), NOW).first_offset == 7
    # the wrapped batch is still recognised as a duplicate
    assert log.append_as_leader(pbatch(INT32_MAX - 2, 5, epoch=1), NOW).first_offset == 2


def test_new_epoch_must_start_at_zero_and_old_epoch_is_fenced(make_log) -> None:
    log = make_log()
    log.append_as_leader(pbatch(0, 3, epoch=2), NOW)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(pbatch(3, epoch=3), NOW)
    assert log.append_as_leader(pbatch(0, epoch=3), NOW).first_offset == 3
    with pytest.raises(InvalidProducerEpochError) as ei:
        log.append_as_leader(pbatch(3, epoch=2), NOW)
    assert ei.value.error_code == 47
    # an old-epoch retry is fenced too, not treated as a duplicate
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(pbatch(0, 3, epoch=2), NOW)
    assert log.log_end_offset == 4


def test_unknown_producer_must_start_at_zero(make_log) -> None:
    log = make_log()
    with pytest.raises(UnknownProducerIdError) as ei:
        log.append_as_leader(pbatch(5), NOW)
    assert ei.value.error_code == 59
    assert log.log_end_offset == 0 and log.producer_state.last_entry(PID) is None
    assert log.append_as_leader(pbatch(0), NOW).first_offset == 0


def test_batches_without_producer_id_skip_validation(make_log) -> None:
    log = make_log()
    log.append_as_leader(batch(1), NOW)
    log.append_as_leader(batch(1), NOW)
    assert log.log_end_offset == 2 and len(log.producer_state) == 0


def test_producer_batch_needs_a_sequence(make_log) -> None:
    log = make_log()
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(pbatch(-1), NOW)


def test_several_batches_in_one_request(make_log) -> None:
    log = make_log()
    # two batches of one producer in one request: the second is checked against the first
    info = log.append_as_leader(pbatch(0, 2) + pbatch(2, 2) + pbatch(0, pid=7), NOW)
    assert (info.first_offset, info.last_offset) == (0, 4)
    # all or nothing: a bad second batch rejects the whole request
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(pbatch(4) + pbatch(9), NOW)
    assert log.log_end_offset == 5
    entry = log.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == 3
    # a request holding a retried batch is answered as the duplicate
    assert log.append_as_leader(pbatch(2, 2) + pbatch(4), NOW).first_offset == 2
    assert log.log_end_offset == 5


def test_internal_writers_are_not_sequence_checked(make_log) -> None:
    log = make_log()
    log.append_as_leader(pbatch(0), NOW)
    log.append_as_leader(pbatch(7), NOW, from_client=False)
    entry = log.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == 7


# -- snapshots and rebuild ------------------------------------------------------------------------


def test_snapshot_codec_round_trip_and_crc() -> None:
    e = ProducerStateEntry(5, 3, last_timestamp=NOW, coordinator_epoch=2)
    for i in range(7):
        e.add_batch(3, 2 * i, 2 * i + 1, 10 * i, 10 * i + 1, NOW + i)
    data = encode_snapshot(123, [e, ProducerStateEntry(6, 0)])
    offset, entries = decode_snapshot(data)
    assert offset == 123 and entries == [e, ProducerStateEntry(6, 0)]
    assert len(entries[0].batch_metadata) == 5
    bad = bytearray(data)
    bad[-1] ^= 1
    with pytest.raises(ValueError, match="CRC"):
        decode_snapshot(bytes(bad))
    with pytest.raises(ValueError):
        decode_snapshot(data[:-3])


def test_snapshot_keeps_open_transactions_in_offset_order(tmp_path: Path) -> None:
    late = ProducerStateEntry(7, 1, last_timestamp=NOW, coordinator_epoch=4, current_txn_first_offset=90)
    early = ProducerStateEntry(8, 0, last_timestamp=NOW, current_txn_first_offset=12)
    done = ProducerStateEntry(9, 0, last_timestamp=NOW)
    offset, entries = decode_snapshot(encode_snapshot(100, [late, done, early]))
    assert entries == [late, done, early]
    psm = ProducerStateManager(tmp_path, "t-0")
    psm.producers = {e.producer_id: e for e in entries}
    psm.map_end_offset = 100
    psm.take_snapshot()
    psm = ProducerStateManager(tmp_path, "t-0")
    assert psm.load_latest_snapshot(100) == 100
    assert list(psm.ongoing_txns.items()) == [(12, 8), (90, 7)] and psm.first_unstable_offset == 12


def test_snapshot_at_roll_and_close_then_clean_load(make_log, log_dir: Path) -> None:
    log = make_log(segment_bytes=1000)
    seq = 0
    for _ in range(30):
        log.append_as_leader(pbatch(seq, 3), NOW)
        seq += 3
    assert len(log.segments) > 3
    bases = [s.base_offset for s in log.segments]
    assert snapshots(log_dir) == bases[-2:]  # one per roll, the newest two kept
    log.append_as_leader(pbatch(seq, 3), NOW)
    seq += 3
    leo = log.log_end_offset
    log.close()
    assert snapshots(log_dir) == [bases[-1], leo]
    log = Log.open(log_dir, "topic", 0, log.config, clean_shutdown=True, recovery_point=leo)
    try:
        entry = log.producer_state.last_entry(PID)
        assert entry is not None and entry.last_seq == seq - 1 and len(entry.batch_metadata) == 5
        assert log.append_as_leader(pbatch(seq - 3, 3), NOW).first_offset == leo - 3  # duplicate survives
        assert log.append_as_leader(pbatch(seq), NOW).first_offset == leo
    finally:
        log.close()


def test_rebuild_after_unclean_stop(make_log, log_dir: Path) -> None:
    log = make_log(segment_bytes=1000)
    seqs = {1: 0, 2: 0}
    for i in range(40):
        pid = 1 + i % 2
        log.append_as_leader(pbatch(seqs[pid], 2, pid=pid), NOW)
        seqs[pid] += 2
    log.append_as_leader(batch(1), NOW)
    last_snapshot = snapshots(log_dir)[-1]
    assert last_snapshot < log.log_end_offset  # the tail after the last roll is not in any snapshot
    leo = log.log_end_offset
    log = reopen(log, clean=False)
    try:
        assert log.log_end_offset == leo
        for pid in (1, 2):
            entry = log.producer_state.last_entry(pid)
            assert entry is not None and entry.last_seq == seqs[pid] - 1
            assert log.append_as_leader(pbatch(seqs[pid] - 2, 2, pid=pid), NOW).first_offset < leo
            with pytest.raises(OutOfOrderSequenceError):
                log.append_as_leader(pbatch(seqs[pid] + 1, pid=pid), NOW)
            assert log.append_as_leader(pbatch(seqs[pid], pid=pid), NOW).first_offset >= leo
    finally:
        log.close()


def test_rebuild_without_any_snapshot_scans_from_the_start(make_log, log_dir: Path) -> None:
    log = make_log()
    for i in range(10):
        log.append_as_leader(pbatch(i), NOW)
    assert snapshots(log_dir) == []
    log = reopen(log, clean=False)
    try:
        entry = log.producer_state.last_entry(PID)
        assert entry is not None and entry.last_seq == 9
    finally:
        log.close()


def test_corrupt_snapshot_is_ignored(make_log, log_dir: Path) -> None:
    log = make_log()
    for i in range(5):
        log.append_as_leader(pbatch(i), NOW)
    log.close()
    (path,) = log_dir.glob("*.snapshot")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    log = Log.open(log_dir, "topic", 0, log.config, clean_shutdown=False)
    try:
        assert not path.exists()  # deleted and rebuilt from the log
        entry = log.producer_state.last_entry(PID)
        assert entry is not None and entry.last_seq == 4
    finally:
        log.close()


def test_clean_open_without_snapshot_skips_the_scan(make_log, log_dir: Path) -> None:
    # A log from before producer snapshots existed: a clean start trusts there is nothing to load.
    log = make_log()
    log.append_as_leader(pbatch(0), NOW)
    log.close()
    for p in log_dir.glob("*.snapshot"):
        p.unlink()
    log = Log.open(log_dir, "topic", 0, log.config, clean_shutdown=True)
    try:
        assert len(log.producer_state) == 0 and snapshots(log_dir) == [1]
    finally:
        log.close()


def test_truncation_removes_newer_snapshots_and_reloads(make_log, log_dir: Path) -> None:
    log = make_log(segment_bytes=1000)
    for i in range(30):
        log.append_as_leader(pbatch(2 * i, 2), NOW)  # sequences 2i..2i+1 at offsets 2i..2i+1
    snaps = snapshots(log_dir)
    assert len(snaps) == 2
    target = snaps[0] + 2  # inside the second-newest snapshot's segment
    log.truncate_to(target)
    assert log.log_end_offset == target
    assert snapshots(log_dir) == [snaps[0]]
    entry = log.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == target - 1
    assert log.append_as_leader(pbatch(target, 2), NOW).first_offset == target
    # truncating everything forgets the producers and every snapshot
    log.truncate_to(0)
    assert len(log.producer_state) == 0 and snapshots(log_dir) == []
    with pytest.raises(UnknownProducerIdError):
        log.append_as_leader(pbatch(5), NOW)


def test_log_start_offset_keeps_producers_with_no_batch_left(make_log) -> None:
    """Kafka 3.x (KIP-360): only producer.id.expiration.ms forgets a producer, not the log start passing it."""
    log = make_log()
    log.append_as_leader(pbatch(0, pid=1), NOW)
    log.append_as_leader(pbatch(0, pid=2), NOW)
    log.append_as_leader(pbatch(1, pid=1), NOW)
    log.delete_records_before(3)
    assert log.producer_state.last_entry(2) is not None
    assert log.producer_state.last_entry(1) is not None
    assert log.append_as_leader(pbatch(2, pid=1), NOW).first_offset == 3
    assert log.append_as_leader(pbatch(1, pid=2), NOW).first_offset == 4


# -- expiration -------------------------------------------------------------------------------------


def test_expiration(make_log) -> None:
    log = make_log()
    log.append_as_leader(pbatch(0, pid=1, ts=NOW), NOW)
    log.append_as_leader(pbatch(0, pid=2, ts=NOW + 5000), NOW)
    assert log.remove_expired_producers(NOW + 5999, 6000) == []
    assert log.remove_expired_producers(NOW + 6000, 6000) == [1]
    assert log.producer_state.last_entry(2) is not None
    with pytest.raises(UnknownProducerIdError):
        log.append_as_leader(pbatch(1, pid=1), NOW)
    assert log.append_as_leader(pbatch(1, pid=2), NOW).first_offset == 2


def test_log_manager_expires_producers(tmp_path: Path) -> None:
    lm = LogManager([str(tmp_path / "d0")], LogConfig(), producer_id_expiration_ms=1000, cleaner_enabled=False)
    lm.startup()
    try:
        log = lm.get_or_create_log("t", 0)
        log.append_as_leader(pbatch(0, ts=NOW), NOW)
        assert lm.remove_expired_producers(NOW + 999) == 0
        assert lm.remove_expired_producers(NOW + 1000) == 1
        assert len(log.producer_state) == 0
    finally:
        lm.shutdown()


# -- compaction -------------------------------------------------------------------------------------


def test_state_rebuilt_after_cleaning_still_validates(make_log, log_dir: Path) -> None:
    log = make_log(cleanup_policy="compact", segment_bytes=2000)
    for i in range(40):
        # keys repeat, so cleaning empties most batches; the producer metadata must survive
        log.append_as_leader(build_batch([(b"key%d" % (i % 3), b"v%d" % i, [], NOW)], producer_id=PID,
                                         producer_epoch=0, base_sequence=i), NOW)
    log.roll()
    stats = clean_log(log, NOW, force=True)
    assert stats is not None and stats.records_removed > 0
    leo = log.log_end_offset
    for p in log_dir.glob("*.snapshot"):
        p.unlink()
    log = reopen(log, clean=False)
    try:
        assert [r.value for r in read_all(log)] == [b"v37", b"v38", b"v39"]
        entry = log.producer_state.last_entry(PID)
        assert entry is not None and entry.last_seq == 39
        assert log.append_as_leader(build_batch([(b"key0", b"again", [], NOW)], producer_id=PID, producer_epoch=0,
                                                base_sequence=39), NOW).first_offset == 39  # duplicate
        assert log.append_as_leader(build_batch([(b"key0", b"new", [], NOW)], producer_id=PID, producer_epoch=0,
                                                base_sequence=40), NOW).first_offset == leo
    finally:
        log.close()


def test_snapshot_file_name() -> None:
    assert snapshot_file_name(42) == "00000000000000000042.snapshot"

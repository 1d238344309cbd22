from __future__ import annotations

import errno
import os
import resource
import signal
from pathlib import Path

import pytest
from kbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    INVALID_TIMESTAMP,
    TIMESTAMP_LOG_APPEND_TIME,
    CorruptRecordError,
    InvalidRecordError,
    RecordValidationError,
    build_batch,
    decode_records,
    iter_batch_headers,
    parse_batch_header,
    validate_batches,
)
from kbroker.storage import leader_append
from kbroker.storage import segment as segment_module
from kbroker.storage.errors import KafkaStorageError, OffsetOutOfRangeError, RecordTooLargeError
from kbroker.storage.log import Log
from kbroker.storage.segment import _PAGE, _SCAN_CHUNK, _scan_chunk

from tests.storage.storage_helpers import NOW, batch, kv_batch, read_all


def test_offsets_contiguous_and_stored_as_received(make_log) -> None:
    log = make_log()
    infos = [log.append_as_leader(batch(3, base_offset=999), NOW) for _ in range(4)]
    assert [(i.first_offset, i.last_offset, i.num_records) for i in infos] == [(0, 2, 3), (3, 5, 3), (6, 8, 3), (9, 11, 3)]
    assert infos[0].log_append_time == -1 and infos[0].max_timestamp == NOW and infos[0].offset_of_max_timestamp == 2
    assert log.log_end_offset == log.high_watermark == 12
    data = log.read(0, 1 << 20).records.read_bytes()
    validate_batches(data)  # CRCs intact: only baseOffset was rewritten
    assert [h.base_offset for _, h in iter_batch_headers(data)] == [0, 3, 6, 9]
    assert [r.offset for r in read_all(log)] == list(range(12))
    # the bytes on disk are the client's bytes except baseOffset
    original = batch(3, base_offset=999)
    assert data[8:len(original)] == original[8:]


def test_multi_batch_request_and_all_or_nothing(make_log) -> None:
    log = make_log()
    info = log.append_as_leader(batch(2) + batch(5), NOW)
    assert (info.first_offset, info.last_offset, info.num_records) == (0, 6, 7)
    bad = bytearray(batch(2) + batch(2))
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(bytes(bad), NOW)
    assert log.log_end_offset == 7 and log.active_segment.size == len(batch(2) + batch(5))


def test_read_max_bytes_whole_batches_and_min_one_message(make_log) -> None:
    log = make_log(index_interval_bytes=200)
    one = len(batch(1, size=100))
    for _ in range(50):
        log.append_as_leader(batch(1, size=100), NOW)
    info = log.read(10, one * 3 + one // 2)
    assert info.records is not None and info.records.size == one * 3
    assert [h.base_offset for _, h in iter_batch_headers(info.records.read_bytes())] == [10, 11, 12]
    # smaller than one batch: KIP-74 returns the whole first batch
    info = log.read(10, 5)
    assert info.records is not None and info.records.size == one and not info.first_entry_incomplete
    info = log.read(10, 5, min_one_message=False)
    assert info.records is None and info.first_entry_incomplete
    # max_offset (high watermark) bounds the read, exclusive
    info = log.read(10, 1 << 20, max_offset=14)
    assert [h.base_offset for _, h in iter_batch_headers(info.records.read_bytes())] == [10, 11, 12, 13]
    assert log.read(14, 100, max_offset=14).records is None
    # fetch from the middle of a batch starts at that batch
    log.append_as_leader(batch(10), NOW)
    info = log.read(55, 1 << 20)
    assert parse_batch_header(info.records.read_bytes()).base_offset == 50


def test_offset_out_of_range_and_empty_at_leo(make_log) -> None:
    log = make_log()
    log.append_as_leader(batch(5), NOW)
    empty = log.read(5, 100)
    assert empty.records is None and empty.log_end_offset == 5 and empty.high_watermark == 5
    with pytest.raises(OffsetOutOfRangeError) as ei:
        log.read(6, 100)
    assert ei.value.error_code == 1
    log.delete_records_before(3)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 100)
    assert log.read(3, 100).records is not None


def test_reads_span_segments(make_log) -> None:
    log = make_log(segment_bytes=1000, index_interval_bytes=100)
    for i in range(100):
        log.append_as_leader(batch(2, key=f"r{i}-"), NOW + i)
    assert len(log.segments) > 10
    assert [r.offset for r in read_all(log)] == list(range(200))
    seg = log.segments[3]
    # a fetch never spans two segments
    info = log.read(seg.base_offset, 1 << 20)
    assert info.records.size == seg.size
    assert all(s.size <= 1000 for s in log.segments)


def test_record_too_large_and_keyless_compacted(make_log) -> None:
    log = make_log(max_message_bytes=200)
    with pytest.raises(RecordTooLargeError) as ei:
        log.append_as_leader(batch(1, size=300), NOW)
    assert ei.value.error_code == 10
    log.update_config(log.config.replace(cleanup_policy="compact", max_message_bytes=10_000))
    with pytest.raises(InvalidRecordError) as ei2:
        log.append_as_leader(kv_batch([(b"a", b"1"), (None, b"2")]), NOW)
    assert ei2.value.error_code == 87
    assert log.append_as_leader(kv_batch([(b"a", b"1"), (b"b", None)], compression=3), NOW).num_records == 2
    assert log.log_end_offset == 2


def test_config_update_reaches_the_append_path(make_log) -> None:
    """The append reads segment.ms, max.compaction.lag.ms and the timestamp bounds from facts it keeps per config
    object (Log._config_facts): a replaced config is what the next append uses."""
    log = make_log()
    log.append_as_leader(batch(1), NOW)
    log.append_as_leader(batch(1), NOW + 10_000)
    assert len(log.segments) == 1
    log.update_config(log.config.replace(segment_ms=5_000))
    log.append_as_leader(batch(1), NOW + 10_001)  # the first segment began 10 s earlier: a roll
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.update_config(log.config.replace(segment_ms=3_600_000, cleanup_policy="compact",
                                         max_compaction_lag_ms=1_000))
    log.append_as_leader(batch(1), NOW + 12_000)  # max.compaction.lag.ms rolls a compacted topic's segment
    assert [s.base_offset for s in log.segments] == [0, 2, 3]
    log.update_config(log.config.replace(message_timestamp_difference_max_ms=1_000))
    with pytest.raises(RecordValidationError) as refused:
        log.append_as_leader(batch(1, ts=NOW), NOW + 12_000)
    assert refused.value.error_code == INVALID_TIMESTAMP
    assert log.log_end_offset == 4


def test_control_batches_only_from_internal_writers(make_log) -> None:
    log = make_log()
    control = build_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [], NOW)], is_control=True,
                          is_transactional=True, producer_id=5)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(control, NOW)
    assert log.append_as_leader(control, NOW, from_client=False).first_offset == 0


def test_log_append_time(make_log) -> None:
    log = make_log(message_timestamp_type="LogAppendTime")
    info = log.append_as_leader(batch(3, ts=5), NOW + 7)
    assert info.log_append_time == NOW + 7 and info.max_timestamp == NOW + 7 and info.offset_of_max_timestamp == 0
    data = log.read(0, 1000).records.read_bytes()
    validate_batches(data)  # CRC recomputed
    h = parse_batch_header(data)
    assert h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME and h.max_timestamp == NOW + 7
    assert [r.timestamp for r in decode_records(data)] == [NOW + 7] * 3


def test_roll_on_segment_ms_and_index_full(make_log) -> None:
    log = make_log(segment_ms=1000)
    log.append_as_leader(batch(1), NOW)
    log.append_as_leader(batch(1), NOW + 1000)
    assert len(log.segments) == 1
    log.append_as_leader(batch(1), NOW + 1001)
    assert [s.base_offset for s in log.segments] == [0, 2]
    log2_cfg = log.config.replace(segment_ms=10**12, segment_index_bytes=16, index_interval_bytes=1)
    log.update_config(log2_cfg)
    log.roll()
    n = len(log.segments)
    for _ in range(8):
        log.append_as_leader(batch(1), NOW)
    # the new segment's index holds 2 entries at most, so it rolled again
    assert len(log.segments) > n
    assert [r.offset for r in read_all(log)] == list(range(11))


def test_storage_error_keeps_log_consistent(make_log, monkeypatch) -> None:
    log = make_log()
    log.append_as_leader(batch(2), NOW)
    size = log.active_segment.size
    real = os.pwrite
    calls = {"n": 0}

    def failing(fd: int, data, pos: int) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            real(fd, bytes(data)[:7], pos)  # partial write, then the disk fills up
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, pos)

    monkeypatch.setattr(os, "pwrite", failing)
    # The fast path's write is C (protocol/_batch_scan.c) unless switched off: its Python reference here, whose
    # os.pwrite the failure replaces (the C's own partial write is the test below).
    monkeypatch.setattr(segment_module, "write_plain", leader_append.write_plain_py)
    with pytest.raises(KafkaStorageError) as ei:
        log.append_as_leader(batch(3), NOW)
    assert ei.value.error_code == 56
    assert log.log_end_offset == 2 and log.active_segment.size == size
    assert os.path.getsize(log.active_segment.log_path) == size
    assert log.append_as_leader(batch(3), NOW).first_offset == 2
    assert [r.offset for r in read_all(log)] == list(range(5))


def test_partial_write_at_the_file_size_limit_keeps_log_consistent(make_log) -> None:
    """A real short write: the file size limit (RLIMIT_FSIZE) lets 7 bytes of the batch through, then the kernel
    refuses with EFBIG; whichever write runs (C or its reference) cuts the file back and the log stays as it was."""
    log = make_log()
    log.append_as_leader(batch(2, producer_id=7, producer_epoch=0, base_sequence=0), NOW)
    log.append_as_leader(batch(2, producer_id=7, producer_epoch=0, base_sequence=2), NOW)  # the fast path from here
    size = log.active_segment.size
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 7, old_limit[1]))
        with pytest.raises(KafkaStorageError) as ei:
            log.append_as_leader(batch(3, producer_id=7, producer_epoch=0, base_sequence=4), NOW)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert ei.value.error_code == 56 and "EFBIG" in str(ei.value)
    assert log.log_end_offset == 4 and log.active_segment.size == size
    assert os.path.getsize(log.active_segment.log_path) == size
    assert log.append_as_leader(batch(3, producer_id=7, producer_epoch=0, base_sequence=4), NOW).first_offset == 4
    assert [r.offset for r in read_all(log)] == list(range(7))


def test_producer_state_hook(make_log) -> None:
    log = make_log()
    seen = []

    def hook(lg: Log, summary, first_offset: int):
        seen.append((first_offset, summary.producers))
        if summary.batches[0][1].producer_id == 99:
            raise InvalidRecordError("fenced")
        return None

    log.validate_producer_state = hook
    log.append_as_leader(batch(2, producer_id=7, producer_epoch=0, base_sequence=0), NOW)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(batch(1, producer_id=99, producer_epoch=0, base_sequence=0), NOW)
    assert seen == [(0, [(7, 0, 0, 1)]), (2, [(99, 0, 0, 0)])] and log.log_end_offset == 2


def test_offset_for_timestamp(make_log) -> None:
    log = make_log(segment_bytes=600, index_interval_bytes=50)
    for i in range(40):
        # two records per batch, timestamps 1000 + 10*i and 1000 + 10*i + 5
        log.append_as_leader(build_batch([(b"a", b"x", [], 1000 + 10 * i), (b"b", b"y", [], 1005 + 10 * i)]), NOW)
    assert len(log.segments) > 3
    assert log.offset_for_timestamp(-2) == (0, -1)
    assert log.offset_for_timestamp(-1) == (80, -1)
    assert log.offset_for_timestamp(0) == (0, 1000)
    assert log.offset_for_timestamp(1000) == (0, 1000)
    assert log.offset_for_timestamp(1001) == (1, 1005)
    assert log.offset_for_timestamp(1203) == (41, 1205)
    assert log.offset_for_timestamp(1395) == (79, 1395)
    assert log.offset_for_timestamp(1396) is None
    assert log.offset_for_timestamp(-3) == (79, 1395)
    # out-of-order timestamps: max is in the middle
    log.append_as_leader(build_batch([(b"c", b"z", [], 5000), (b"d", b"z", [], 10)]), NOW)
    assert log.offset_for_timestamp(-3) == (80, 5000)
    assert log.offset_for_timestamp(2000) == (80, 5000)
    log.delete_records_before(45)
    assert log.offset_for_timestamp(0) == (45, 1225)


def test_offset_for_timestamp_survives_restart(log_dir: Path, make_log) -> None:
    log = make_log(segment_bytes=600, index_interval_bytes=50)
    for i in range(40):
        log.append_as_leader(build_batch([(b"a", b"x", [], 1000 + 10 * i)]), NOW)
    log.close()
    log = Log.open(log_dir, "topic", 0, log.config, clean_shutdown=True, recovery_point=40)
    try:
        assert log.offset_for_timestamp(1201) == (21, 1210)
        assert log.offset_for_timestamp(-3) == (39, 1390)
        assert log.log_end_offset == 40
    finally:
        log.close()


def test_delete_records_before(make_log) -> None:
    log = make_log(segment_bytes=500, file_delete_delay_ms=0)
    for _ in range(30):
        log.append_as_leader(batch(2), NOW)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 3
    target = bases[2] + 1
    assert log.delete_records_before(target) == target
    assert log.log_start_offset == target
    assert log.segments[0].base_offset == bases[2]  # whole segments only
    assert read_all(log)[0].offset == target
    assert log.delete_records_before(1) == target  # never moves backwards
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(61)
    assert log.delete_records_before(-1) == 60
    assert len(log.segments) == 1 and log.read(60, 100).records is None
    # deleted files are renamed, then removed after the delay
    assert any(p.suffix == ".deleted" for p in log.dir.iterdir())
    log.delete_pending_files()
    assert not any(p.suffix == ".deleted" for p in log.dir.iterdir())
    log.append_as_leader(batch(1), NOW)
    assert [r.offset for r in read_all(log)] == [60]


def test_deleted_segment_fd_stays_valid_for_delay(make_log) -> None:
    log = make_log(segment_bytes=300, file_delete_delay_ms=60_000)
    for _ in range(10):
        log.append_as_leader(batch(2), NOW)
    slice_ = log.read(0, 1 << 20).records
    expected = slice_.read_bytes()
    log.delete_records_before(log.segments[-1].base_offset)
    assert not (log.dir / "00000000000000000000.log").exists()
    assert slice_.read_bytes() == expected  # an in-flight sendfile would still work
    assert log.delete_pending_files() == 0
    assert log.delete_pending_files(force=True) > 0


def test_truncate_fully_and_truncate_to(make_log) -> None:
    log = make_log(segment_bytes=400)
    for _ in range(20):
        log.append_as_leader(batch(2), NOW)
    log.truncate_to(17)
    assert log.log_end_offset == 16  # whole batches: the batch holding 16-17 is gone
    assert [r.offset for r in read_all(log)] == list(range(16))
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset, len(log.segments)) == (100, 100, 1)
    assert log.append_as_leader(batch(1), NOW).first_offset == 100


def test_recent_batch_positions_answer_as_the_index_scan(make_log) -> None:
    """Reads near the log end find their batches from the positions of the batches appended last, without reading
    a header; every offset, size and position limit must give what the offset index and a header scan give,
    across the window's trims, a truncation and the appends after it."""
    log = make_log(index_interval_bytes=1000)
    sizes = [1 + i % 3 for i in range(150)]  # more batches than the window keeps

    def check() -> None:
        seg = log.active_segment
        recent = seg._recent
        leo = log.log_end_offset
        got = []
        # An append on another thread lists its batches before it moves the size: a reader must not see them.
        racing = [*recent, (leo + 9, seg.size)]
        for window in (recent, [], racing):
            seg._recent = window
            got.append([
                (loc.position if (loc := seg.translate_offset(o)) is not None else None, seg.position_of(o),
                 *(((r.records.position, r.records.size, r.next_offset) if r is not None and r.records is not None
                    else None if r is None else "incomplete")
                   for r in [seg.read(o, max_size, max_position=mp, min_one_message=one)
                             for mp in (None, seg.size // 2, seg.position_of(o + 7))
                             for max_size in (1, 150, 10_000) for one in (True, False)]))
                for o in range(max(0, leo - 120), leo + 2)])
        seg._recent = recent
        assert got[0] == got[1] == got[2]

    for n in sizes:
        log.append_as_leader(batch(n), NOW)
    assert 0 < len(log.active_segment._recent) <= 64
    check()
    log.truncate_to(log.log_end_offset - 20)
    assert log.active_segment._recent == []
    check()
    for n in sizes[:30]:
        log.append_as_leader(batch(n), NOW)
    check()


def test_header_scans_read_a_page_after_a_jump_and_chunks_when_sequential() -> None:
    """A scan's first read (an index entry, a few headers before the one wanted) and its read after jumping over a
    large batch stop at the end of the page, with a whole header always in it; a scan walking small batches one
    after another reads whole chunks."""
    assert _scan_chunk(0, sequential=False) == _PAGE
    assert _scan_chunk(100, sequential=False) == _PAGE - 100
    near_end = _PAGE - (BATCH_HEADER_SIZE - 1)  # a header would not fit in what is left of the page
    assert _scan_chunk(near_end, sequential=False) == 2 * _PAGE - near_end >= BATCH_HEADER_SIZE
    assert _scan_chunk(3 * _PAGE + 7, sequential=True) == _SCAN_CHUNK

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log

from tests.storage.storage_helpers import NOW, batch, read_all

DAY = 86_400_000


def _log_with_aged_segments(make_log, **kw) -> Log:
    """Five segments whose records are 10, 8, 6, 4, 2 days old, plus a 1-day-old active one."""
    log = make_log(segment_bytes=10**9, file_delete_delay_ms=0, **kw)
    for age in (10, 8, 6, 4, 2, 1):
        for _ in range(3):
            log.append_as_leader(batch(2, ts=NOW - age * DAY, size=50), NOW)
        if age != 1:
            log.roll()
    assert len(log.segments) == 6
    return log


def test_retention_by_time_whole_segments_never_active(make_log) -> None:
    log = _log_with_aged_segments(make_log, retention_ms=5 * DAY)
    bases = [s.base_offset for s in log.segments]
    assert log.delete_old_segments(NOW) == 3
    assert [s.base_offset for s in log.segments] == bases[3:]
    assert log.log_start_offset == bases[3]
    assert read_all(log)[0].offset == bases[3]
    log.delete_pending_files()
    assert not (log.dir / f"{bases[0]:020d}.log").exists()
    assert sorted(p.name for p in log.dir.glob("*.log")) == [f"{b:020d}.log" for b in bases[3:]]
    # everything expired: still the active segment survives
    assert log.delete_old_segments(NOW + 100 * DAY) == 2
    assert len(log.segments) == 1 and log.segments[0].base_offset == bases[-1]
    assert log.log_end_offset == 36 and log.read(bases[-1], 1000).records is not None


def test_retention_by_size(make_log) -> None:
    log = _log_with_aged_segments(make_log, retention_ms=-1)
    seg_size = log.segments[0].size
    log.update_config(log.config.replace(retention_bytes=int(seg_size * 3.5)))
    # 6 segments of equal size; keep as few as needed to get under 3.5 segments
    assert log.delete_old_segments(NOW) == 2
    assert len(log.segments) == 4
    assert log.delete_old_segments(NOW) == 0
    log.update_config(log.config.replace(retention_bytes=0))
    assert log.delete_old_segments(NOW) == 3 and len(log.segments) == 1


def test_compact_only_policy_ignores_retention(make_log) -> None:
    log = _log_with_aged_segments(make_log, retention_ms=1, cleanup_policy="compact")
    assert log.delete_old_segments(NOW) == 0
    log.update_config(log.config.replace(cleanup_policy="compact,delete"))
    assert log.delete_old_segments(NOW) == 5


def test_flush_advances_recovery_point(make_log) -> None:
    log = make_log(segment_bytes=600)
    for _ in range(10):
        log.append_as_leader(batch(3), NOW)
    assert log.unflushed_messages == 30 and log.recovery_point == 0
    log.flush(5)
    assert log.recovery_point == 30 and log.unflushed_messages == 0  # a flush covers everything appended
    log.append_as_leader(batch(1), NOW)
    assert log.unflushed_messages == 1
    log.flush()
    assert log.recovery_point == 31


def test_group_commit_shares_fsyncs(make_log, monkeypatch) -> None:
    log = make_log()
    fsyncs = []
    real = os.fsync
    gate = threading.Event()

    def slow_fsync(fd: int) -> None:
        fsyncs.append(fd)
        gate.wait(5)
        real(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    log.append_as_leader(batch(1), NOW)
    first = threading.Thread(target=log.flush)
    first.start()
    while not fsyncs:
        pass
    # while the first fsync is in progress, 8 producers append and wait for durability
    offsets = [log.append_as_leader(batch(1), NOW).last_offset for _ in range(8)]
    waiters = [threading.Thread(target=log.flush, args=(o + 1,)) for o in offsets]
    for t in waiters:
        t.start()
    calls_before = len(fsyncs)
    gate.set()
    first.join(5)
    for t in waiters:
        t.join(5)
    assert not any(t.is_alive() for t in waiters)
    assert log.recovery_point == 9 and log.unflushed_messages == 0
    # one flush for the first caller, then exactly one more shared by all 8 waiters
    per_flush = calls_before
    assert len(fsyncs) == 2 * per_flush


def test_flush_from_many_threads_is_consistent(make_log) -> None:
    log = make_log(segment_bytes=2000)
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            for _ in range(30):
                info = log.append_as_leader(batch(1), NOW)
                log.flush(info.last_offset + 1)
                assert log.recovery_point > info.last_offset
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=producer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert log.log_end_offset == 180 and log.recovery_point == 180
    assert [r.offset for r in read_all(log)] == list(range(180))


def test_concurrent_reads_during_appends(make_log) -> None:
    log = make_log(segment_bytes=3000, index_interval_bytes=100)
    stop = threading.Event()
    problems: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            leo = log.log_end_offset
            if leo == 0:
                continue
            info = log.read(leo - 1 if leo else 0, 500)
            if info.records is None:
                problems.append(f"no data at {leo - 1}")

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(300):
        log.append_as_leader(batch(1), NOW)
    stop.set()
    t.join()
    assert not problems
    assert [r.offset for r in read_all(log)] == list(range(300))


@pytest.mark.parametrize("clean", [True, False])
def test_reopen_restores_offsets(log_dir: Path, clean: bool) -> None:
    cfg = LogConfig(segment_bytes=700)
    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=True)
    for _ in range(20):
        log.append_as_leader(batch(2), NOW)
    log.delete_records_before(15)
    start, leo = log.log_start_offset, log.log_end_offset
    log.flush()
    log.close()
    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=clean, recovery_point=leo, log_start_offset=start)
    try:
        assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (15, 40, 40)
    finally:
        log.close()

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log
from kbroker.storage.segment import LogSegment

from tests.storage.storage_helpers import NOW, batch, read_all

CFG = LogConfig(segment_bytes=2000, index_interval_bytes=150)


def _fill(log_dir: Path, n: int, cfg: LogConfig = CFG) -> tuple[Log, list[int]]:
    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=True)
    for i in range(n):
        log.append_as_leader(batch(2, key=f"b{i}-", size=40, ts=NOW + i), NOW)
    return log, [s.base_offset for s in log.segments]


def _reopen_unclean(log_dir: Path, recovery_point: int = 0, cfg: LogConfig = CFG) -> Log:
    return Log.open(log_dir, "topic", 0, cfg, clean_shutdown=False, recovery_point=recovery_point)


def test_torn_tail_is_truncated(log_dir: Path, caplog) -> None:
    log, _ = _fill(log_dir, 30)
    leo, path, size = log.log_end_offset, log.active_segment.log_path, log.active_segment.size
    log.close()
    with open(path, "ab") as f:
        f.write(batch(3)[:50])  # crash in the middle of a write
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        log = _reopen_unclean(log_dir)
    try:
        assert log.log_end_offset == leo and os.path.getsize(path) == size
        assert "topic-0" in caplog.text and "removed 50 bytes" in caplog.text
        assert [r.offset for r in read_all(log)] == list(range(leo))
        assert log.append_as_leader(batch(1), NOW).first_offset == leo
    finally:
        log.close()


def test_random_garbage_tail_is_truncated(log_dir: Path, caplog) -> None:
    log, _ = _fill(log_dir, 30)
    leo, path, size = log.log_end_offset, log.active_segment.log_path, log.active_segment.size
    log.close()
    with open(path, "ab") as f:
        f.write(os.urandom(5000))
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        log = _reopen_unclean(log_dir)
    try:
        assert log.log_end_offset == leo and os.path.getsize(path) == size
        assert "removed 5000 bytes" in caplog.text
    finally:
        log.close()


def test_crc_flip_in_middle_truncates_there_and_drops_later_segments(log_dir: Path, caplog) -> None:
    log, bases = _fill(log_dir, 60)
    assert len(bases) >= 5
    victim = log.segments[2]
    batches = list(victim.iter_batches())
    bad = batches[3]
    victim_path = victim.log_path
    log.close()
    with open(victim_path, "r+b") as f:
        f.seek(bad.position + bad.size - 3)
        byte = f.read(1)
        f.seek(bad.position + bad.size - 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        log = _reopen_unclean(log_dir)
    try:
        assert log.log_end_offset == bad.header.base_offset
        assert [s.base_offset for s in log.segments] == bases[:3]
        assert os.path.getsize(victim_path) == bad.position
        for later in bases[3:]:
            assert not (log_dir / f"{later:020d}.log").exists()
        assert "CRC mismatch" in caplog.text
        assert caplog.text.count("Deleted topic-0 segment") == len(bases) - 3
        assert [r.offset for r in read_all(log)] == list(range(bad.header.base_offset))
        assert log.append_as_leader(batch(1), NOW).first_offset == bad.header.base_offset
    finally:
        log.close()


def test_indexes_rebuilt_after_unclean_shutdown(log_dir: Path) -> None:
    log, bases = _fill(log_dir, 40)
    seg = log.segments[1]
    expected_entries = [seg.index.lookup(o) for o in range(seg.base_offset, log.segments[2].base_offset)]
    expected_time = seg.time_index.last_entry()
    log.close()
    # lose one index entirely, corrupt another (torn entry + garbage)
    (log_dir / f"{bases[1]:020d}.index").unlink()
    with open(log_dir / f"{bases[2]:020d}.index", "r+b") as f:
        f.write(b"\xff" * 8)
    log = _reopen_unclean(log_dir)
    try:
        seg = log.segments[1]
        assert seg.index.entries > 0
        assert [seg.index.lookup(o) for o in range(seg.base_offset, log.segments[2].base_offset)] == expected_entries
        assert seg.time_index.last_entry()[0] == expected_time[0]
        assert [r.offset for r in read_all(log)] == list(range(80))
        assert log.offset_for_timestamp(NOW + 25) == (50, NOW + 25)
    finally:
        log.close()


def test_segments_below_recovery_point_are_trusted(log_dir: Path, caplog) -> None:
    log, bases = _fill(log_dir, 40)
    leo = log.log_end_offset
    first = log.segments[0]
    pos = list(first.iter_batches())[1].position
    log.close()
    with open(log_dir / f"{bases[0]:020d}.log", "r+b") as f:
        f.seek(pos + 70)
        f.write(b"\x00\x00")  # silent corruption in flushed data: not rescanned
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        log = _reopen_unclean(log_dir, recovery_point=bases[2])
    try:
        assert log.log_end_offset == leo and "Truncated" not in caplog.text
        assert log.recovery_point == leo
    finally:
        log.close()


def test_interrupted_cleaning_swap_file_completes(log_dir: Path) -> None:
    log, bases = _fill(log_dir, 30)
    leo = log.log_end_offset
    log.close()
    # a cleaned copy that reached .swap replaces the original; a .cleaned one is discarded
    src = log_dir / f"{bases[0]:020d}.log"
    (log_dir / f"{bases[0]:020d}.log.swap").write_bytes(src.read_bytes())
    (log_dir / f"{bases[1]:020d}.log.cleaned").write_bytes(b"junk")
    (log_dir / f"{bases[1]:020d}.log.deleted").write_bytes(b"junk")
    log = Log.open(log_dir, "topic", 0, CFG, clean_shutdown=True, recovery_point=leo)
    try:
        names = {p.name for p in log_dir.iterdir()}
        assert not any(n.endswith((".swap", ".cleaned", ".deleted")) for n in names)
        assert log.log_end_offset == leo and [r.offset for r in read_all(log)] == list(range(leo))
        assert log.segments[0].index.entries > 0  # rebuilt
    finally:
        log.close()


def test_clean_restart_of_200_segments_is_fast(log_dir: Path) -> None:
    cfg = LogConfig(segment_bytes=4096, index_interval_bytes=256)
    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=True)
    payload = batch(4, size=400)  # ~1.7 KB: two batches per segment
    while len(log.segments) < 201:
        log.append_as_leader(payload, NOW)
    leo = log.log_end_offset
    log.flush()
    log.close()
    started = time.perf_counter()
    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=True, recovery_point=leo)
    elapsed = time.perf_counter() - started
    try:
        print(f"\nclean open of {len(log.segments)} segments took {elapsed * 1000:.1f} ms")
        assert elapsed < 1.0
        assert log.log_end_offset == leo and len(log.segments) == 201
        # nothing was scanned or loaded eagerly
        assert all(s.index._entries is None for s in log.segments[:-1])
        assert log.read(leo // 2, 100).records is not None
    finally:
        log.close()
    started = time.perf_counter()
    log = _reopen_unclean(log_dir, recovery_point=leo, cfg=cfg)
    print(f"unclean open at recovery point: {(time.perf_counter() - started) * 1000:.1f} ms")
    log.close()


def test_segment_recover_direct(tmp_path: Path) -> None:
    from kbroker.storage.recovery import recover_segment

    data = batch(2) + batch(2, base_offset=2) + batch(1, base_offset=1)  # last one goes backwards
    (tmp_path / "00000000000000000000.log").write_bytes(data)
    seg = LogSegment(tmp_path, 0, index_interval_bytes=10, max_index_size=1000)
    result = recover_segment(seg, 0)
    assert result.next_offset == 4 and result.reason is not None and "below expected" in result.reason
    assert seg.size == len(batch(2)) * 2
    seg.close()

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from kbroker.storage.index import PENDING_BYTES, OffsetIndex, TimeIndex


def test_offset_index_lookup_append_truncate(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "00000000000000000100.index", 100, 8 * 1000)
    assert idx.lookup(150) == (100, 0)
    for i in range(1, 501):
        idx.append(100 + i * 10, i * 4096)
    assert idx.entries == 500 and not idx.is_full
    assert idx.lookup(99) == (100, 0)
    assert idx.lookup(110) == (110, 4096)
    assert idx.lookup(119) == (110, 4096)
    assert idx.lookup(10_000) == (5100, 500 * 4096)
    assert idx.lookup_by_position(4096 * 3 + 5) == (130, 4096 * 3)
    assert idx.lookup_by_position(10) == (100, 0)
    with pytest.raises(ValueError):
        idx.append(120, 1)  # not increasing
    # on disk (once written: the log's flush, a close, or every PENDING_BYTES): relative offset + position,
    # big-endian
    idx.flush()
    raw = idx.path.read_bytes()
    assert len(raw) == 4000 and struct.unpack(">ii", raw[:8]) == (10, 4096)
    idx.truncate_to(255)
    assert idx.entries == 15 and idx.lookup(10_000) == (250, 15 * 4096)
    assert idx.path.stat().st_size == 15 * 8
    idx.close()
    # a reopened index loads lazily and agrees
    again = OffsetIndex(idx.path, 100, 8 * 1000)
    assert again.last_entry() == (250, 15 * 4096) and again._entries is None
    assert again.lookup(205) == (200, 10 * 4096)
    again.close()


def test_offset_index_full_and_torn_entry(tmp_path: Path) -> None:
    p = tmp_path / "00000000000000000000.index"
    idx = OffsetIndex(p, 0, 8 * 3)
    for i in range(3):
        idx.append(i, i * 10)
    assert idx.is_full
    idx.close()
    with open(p, "ab") as f:
        f.write(b"\x00\x01\x02")  # torn write
    idx = OffsetIndex(p, 0, 80)
    assert idx.entries == 3 and p.stat().st_size == 24
    idx.append(5, 50)
    assert idx.lookup(6) == (5, 50)
    idx.close()


def test_time_index(tmp_path: Path) -> None:
    ti = TimeIndex(tmp_path / "00000000000000000050.timeindex", 50, 12 * 100)
    assert ti.lookup(1000) == (-1, 50)
    assert ti.last_entry() == (-1, 50)
    assert ti.maybe_append(1000, 55)
    assert not ti.maybe_append(1000, 60)  # timestamps must strictly increase
    assert not ti.maybe_append(900, 61)
    assert ti.maybe_append(2000, 70)
    assert ti.maybe_append(3000, 90)
    assert ti.lookup(999) == (-1, 50)
    assert ti.lookup(1500) == (1000, 55)
    assert ti.lookup(3000) == (3000, 90)
    assert ti.last_entry() == (3000, 90)
    ti.truncate_to(70)
    assert ti.last_entry() == (1000, 55)
    ti.close()
    assert TimeIndex(ti.path, 50, 1200).lookup(5000) == (1000, 55)


def test_entries_reach_the_file_in_batches_and_lookups_see_them_before(tmp_path: Path) -> None:
    """Appends are buffered (Kafka's indexes are memory-mapped): lookups, the last entry and truncation see the
    pending entries; the file gets them every PENDING_BYTES, at flush and at close, never a torn or reordered one."""
    p = tmp_path / "00000000000000000000.index"
    idx = OffsetIndex(p, 0, 8 * 10_000)
    per_write = PENDING_BYTES // 8
    for i in range(per_write - 1):
        idx.append(i * 10, i * 100)
    assert p.stat().st_size == 0 and idx.entries == per_write - 1
    assert idx.lookup(25) == (20, 200) and idx.last_entry() == ((per_write - 2) * 10, (per_write - 2) * 100)
    idx.append(per_write * 10, per_write * 100)
    assert p.stat().st_size == PENDING_BYTES  # a full buffer is written at once
    for i in range(per_write + 1, per_write + 4):
        idx.append(i * 10, i * 100)
    # Truncating inside the pending entries keeps the written ones; inside the written ones drops both.
    idx.truncate_to((per_write + 2) * 10)
    assert idx.entries == per_write + 1 and idx.last_entry() == ((per_write + 1) * 10, (per_write + 1) * 100)
    idx.flush()
    assert p.stat().st_size == (per_write + 1) * 8
    idx.append((per_write + 5) * 10, 1 << 20)
    idx.truncate_to(30)
    assert idx.entries == 3 and p.stat().st_size == 24 and idx.last_entry() == (20, 200)
    idx.append(40, 400)
    # A reopened index that never loaded its entries reads the file and the pending bytes alike.
    fresh = OffsetIndex(p, 0, 8 * 10_000)
    assert fresh.entries == 3
    fresh.close()
    idx.close()
    again = OffsetIndex(p, 0, 8 * 10_000)
    assert again.entries == 4 and again.lookup(45) == (40, 400)
    again.append(50, 500)
    assert again.last_entry() == (50, 500) and again.lookup(55) == (50, 500)
    again.delete_file()
    assert not p.exists()

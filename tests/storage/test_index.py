from __future__ import annotations

import struct
from pathlib import Path

import pytest

from storage.index import OffsetIndex, TimeIndex


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
    # on disk: relative offset + position, big-endian
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

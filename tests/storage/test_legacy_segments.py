"""Segments written by older versions, holding batches that produce refuses today: an empty compressed batch
(the old cleaner's) and a decompression bomb (the old produce path read headers only on delete topics)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kbroker.protocol.records import (
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    CorruptRecordError,
    build_batch,
    iter_batch_headers,
)
from kbroker.storage.cleaner import clean_log, rewrite_empty_compressed_batches
from kbroker.storage.config import LogConfig
from kbroker.storage.log import MAX_TIMESTAMP, Log

from tests.storage.storage_helpers import NOW, kv_batch, read_all, write_legacy_segment


def _old_empty_lz4_batch(producer_id: int, last_offset_delta: int) -> bytes:
    # What the old cleaner wrote for a fully superseded batch: an lz4 frame of nothing, recordsCount 0.
    return build_batch([], compression=COMPRESSION_LZ4, producer_id=producer_id, producer_epoch=0,
                       base_sequence=0, last_offset_delta=last_offset_delta, max_timestamp=NOW)


def _served_headers(log: Log) -> list:
    data = log.read(log.log_start_offset, 1 << 20).records.read_bytes()
    return [h for _, h in iter_batch_headers(data)]


def test_loading_rewrites_empty_compressed_batches(log_dir: Path) -> None:
    write_legacy_segment(log_dir, [
        _old_empty_lz4_batch(7, 1),  # offsets 0-1: producer 7 wrote again later, dropped
        build_batch([(b"a", b"1", (), NOW)], compression=COMPRESSION_LZ4, producer_id=7, producer_epoch=0,
                    base_sequence=2),  # offset 2
        _old_empty_lz4_batch(8, 2),  # offsets 3-5: producer 8's last batch, kept without compression
    ])
    write_legacy_segment(log_dir, [kv_batch([(b"b", b"2")])], base_offset=6)
    cfg = LogConfig(cleanup_policy="compact", file_delete_delay_ms=0)
    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=False)
    try:
        assert [(h.base_offset, h.records_count, h.compression) for h in _served_headers(log)] == [
            (0, 0, COMPRESSION_LZ4), (2, 1, COMPRESSION_LZ4), (3, 0, COMPRESSION_LZ4)]
        assert rewrite_empty_compressed_batches(log, 6) == 2
        headers = _served_headers(log)
        assert [(h.base_offset, h.last_offset, h.records_count, h.compression) for h in headers] == [
            (2, 2, 1, COMPRESSION_LZ4), (3, 5, 0, COMPRESSION_NONE)]
        assert (headers[1].producer_id, headers[1].base_sequence, headers[1].size_in_bytes) == (8, 0, 61)
        assert [r.offset for r in read_all(log)] == [2, 6]
        assert log.log_start_offset == 0 and log.log_end_offset == 7
        assert rewrite_empty_compressed_batches(log, 6) == 0
    finally:
        log.close()


def test_cleaner_rewrites_empty_compressed_batches_it_meets(log_dir: Path) -> None:
    write_legacy_segment(log_dir, [_old_empty_lz4_batch(9, 0), kv_batch([(b"a", b"1")])])
    write_legacy_segment(log_dir, [kv_batch([(b"a", b"2")])], base_offset=2)
    log = Log.open(log_dir, "topic", 0, LogConfig(cleanup_policy="compact", file_delete_delay_ms=0),
                   clean_shutdown=False)
    try:
        assert clean_log(log, NOW, force=True) is not None
        assert all(h.records_count or h.compression == COMPRESSION_NONE for h in _served_headers(log))
    finally:
        log.close()


BOMB = 80 * 1024 * 1024  # above the 64 MiB floor of max_decompressed_size


@pytest.fixture(scope="module")
def zstd_bomb() -> bytes:
    return build_batch([(b"k", bytes(BOMB), (), NOW)], compression=COMPRESSION_ZSTD)


def test_cleaner_and_timestamp_lookup_stay_bounded_over_an_old_bomb(log_dir: Path, zstd_bomb: bytes) -> None:
    write_legacy_segment(log_dir, [zstd_bomb])
    write_legacy_segment(log_dir, [kv_batch([(b"k", b"v")], ts=NOW - 1)], base_offset=1)
    log = Log.open(log_dir, "topic", 0, LogConfig(cleanup_policy="compact", file_delete_delay_ms=0),
                   clean_shutdown=False)
    try:
        with pytest.raises(CorruptRecordError, match="exceeds"):
            clean_log(log, NOW, force=True)
        with pytest.raises(CorruptRecordError, match="exceeds"):
            log.offset_for_timestamp(MAX_TIMESTAMP)
    finally:
        log.close()

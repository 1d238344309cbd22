from __future__ import annotations

from pathlib import Path

import pytest
from kbroker.protocol.records import (
    COMPRESSION_LZ4,
    COMPRESSION_ZSTD,
    build_batch,
    decode_records,
    iter_batch_headers,
    validate_batches,
)
from kbroker.storage.cleaner import CleanerStats, LogCleaner, clean_log
from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log

from tests.storage.storage_helpers import NOW, kv_batch, read_all, write_legacy_segment

DAY = 86_400_000


def _compacted(make_log, **kw) -> Log:
    return make_log(cleanup_policy="compact", segment_bytes=400, file_delete_delay_ms=0,
                    min_cleanable_dirty_ratio=0.0, **kw)


def _latest(log: Log) -> dict[bytes, tuple[int, bytes | None]]:
    out: dict[bytes, tuple[int, bytes | None]] = {}
    for r in read_all(log):
        assert r.key is not None
        out[r.key] = (r.offset, r.value)
    return out


def test_keeps_last_record_per_key_and_offsets(make_log) -> None:
    log = _compacted(make_log)
    expected: dict[bytes, tuple[int, bytes | None]] = {}
    for i in range(60):
        key = b"k%d" % (i % 5)
        info = log.append_as_leader(kv_batch([(key, b"value-%d" % i)]), NOW)
        expected[key] = (info.first_offset, b"value-%d" % i)
    before = read_all(log)
    active_base = log.active_segment.base_offset
    stats = clean_log(log, NOW)
    assert stats is not None and stats.records_removed > 0
    after = read_all(log)
    # everything in the active segment is untouched; before it, only the latest per key
    cleaned = [r for r in after if r.offset < active_base]
    latest_below = {r.key: r.offset for r in before if r.offset < active_base}
    assert sorted(r.offset for r in cleaned) == sorted(latest_below.values())
    assert [r.offset for r in after if r.offset >= active_base] == [r.offset for r in before if r.offset >= active_base]
    assert _latest(log) == expected
    assert log.log_end_offset == 60 and log.cleaner_checkpoint == active_base
    # offsets never change and every batch on disk is still valid
    data = b"".join(log.read(s.base_offset, 1 << 20).records.read_bytes() for s in log.segments if s.size)
    validate_batches(data, from_client=False)
    for r in after:
        assert r.value == dict((x.offset, x.value) for x in before)[r.offset]
    # appends continue at the right offset
    assert log.append_as_leader(kv_batch([(b"k1", b"new")]), NOW).first_offset == 60


def test_batch_keeps_base_and_last_offset_and_producer_metadata(make_log) -> None:
    log = _compacted(make_log)
    # batch of 4 records where all but the first get superseded later
    log.append_as_leader(build_batch([(b"a", b"1", [], NOW), (b"b", b"1", [], NOW), (b"c", b"1", [], NOW),
                                      (b"d", b"1", [], NOW)], producer_id=42, producer_epoch=3, base_sequence=0),
                         NOW)
    log.append_as_leader(build_batch([(b"x", b"1", [], NOW), (b"y", b"1", [], NOW)], producer_id=43,
                                     producer_epoch=1, base_sequence=0, compression=2), NOW)
    log.append_as_leader(kv_batch([(b"b", b"2"), (b"c", b"2"), (b"d", b"2"), (b"x", b"2"), (b"y", b"2")]), NOW)
    log.roll()
    log.append_as_leader(kv_batch([(b"z", b"0")]), NOW)
    clean_log(log, NOW)
    data = log.read(0, 1 << 20).records.read_bytes()
    headers = [h for _, h in iter_batch_headers(data)]
    first, second = headers[0], headers[1]
    assert (first.base_offset, first.last_offset, first.records_count) == (0, 3, 1)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (42, 3, 0)
    assert [r.key for r in decode_records(data, 0)] == [b"a"]
    # the fully superseded last batch of producer 43 survives as an empty batch, uncompressed (Kafka's
    # writeEmptyHeader): an empty compressed batch makes librdkafka abort
    assert (second.base_offset, second.last_offset, second.records_count) == (4, 5, 0)
    assert (second.producer_id, second.producer_epoch, second.base_sequence, second.compression) == (43, 1, 0, 0)
    assert second.size_in_bytes == 61 and second.base_timestamp == -1 and second.max_timestamp == NOW
    assert log.read(1, 1000).records.read_bytes()[:8] == data[:8]  # offset 1 -> batch holding it


@pytest.mark.parametrize("codec", [COMPRESSION_LZ4, COMPRESSION_ZSTD], ids=["lz4", "zstd"])
def test_emptied_batches_are_dropped_unless_a_producer_needs_them(make_log, codec: int) -> None:
    log = _compacted(make_log)
    for seq in (0, 2):  # two batches of producer 44; only the second is its last
        log.append_as_leader(build_batch([(b"p", b"%d" % seq, [], NOW), (b"q", b"%d" % seq, [], NOW)],
                                         producer_id=44, producer_epoch=0, base_sequence=seq, compression=codec),
                             NOW)
    log.append_as_leader(kv_batch([(b"p", b"new"), (b"q", b"new")]), NOW)
    log.roll()
    log.append_as_leader(kv_batch([(b"z", b"0")]), NOW)
    clean_log(log, NOW)
    data = log.read(0, 1 << 20).records.read_bytes()
    headers = [(h.base_offset, h.last_offset, h.records_count, h.compression, h.producer_id)
               for _, h in iter_batch_headers(data)]
    assert headers[:2] == [(2, 3, 0, 0, 44), (4, 5, 2, 0, -1)]
    # the producer's sequence survives a reload from the log alone
    assert {e.producer_id: e.last_data_offset for e in log.producer_states()} == {44: 3}


def test_tombstones_removed_after_delete_retention(make_log) -> None:
    log = _compacted(make_log, delete_retention_ms=DAY)
    log.append_as_leader(kv_batch([(b"a", b"1"), (b"b", b"1")]), NOW)
    log.append_as_leader(kv_batch([(b"a", None)]), NOW)
    log.roll()
    log.append_as_leader(kv_batch([(b"c", b"1")]), NOW)
    clean_log(log, NOW)
    assert _latest(log)[b"a"] == (2, None)  # tombstone kept for delete.retention.ms
    assert log.tombstone_horizon_ms == NOW + DAY
    assert clean_log(log, NOW + DAY - 1) is None  # nothing dirty, horizon not reached
    stats = clean_log(log, NOW + DAY)
    assert stats is not None and stats.tombstones_removed == 1
    assert b"a" not in _latest(log) and _latest(log)[b"b"] == (1, b"1")
    assert log.log_end_offset == 4


def test_min_compaction_lag_and_dirty_ratio(make_log) -> None:
    log = make_log(cleanup_policy="compact", segment_bytes=400, file_delete_delay_ms=0,
                   min_compaction_lag_ms=DAY, min_cleanable_dirty_ratio=0.5)
    for i in range(30):
        log.append_as_leader(kv_batch([(b"k", b"%d" % i)], ts=NOW), NOW)
    # records are younger than the lag: nothing is cleanable
    assert clean_log(log, NOW + 1000) is None
    assert len(read_all(log)) == 30
    stats = clean_log(log, NOW + DAY + 1)
    assert stats is not None and len(read_all(log)) < 30
    # right after a clean the dirty ratio is 0: below 0.5, nothing to do
    assert clean_log(log, NOW + DAY + 2) is None


def test_max_compaction_lag_cleans_below_the_dirty_ratio(make_log) -> None:
    # KIP-354: a dirty record older than max.compaction.lag.ms is compacted whatever min.cleanable.dirty.ratio
    # says (here 1.0, never reached otherwise); younger ones wait for the ratio as before.
    log = make_log(cleanup_policy="compact", segment_bytes=400, file_delete_delay_ms=0,
                   min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=60_000)
    for i in range(30):
        log.append_as_leader(kv_batch([(b"k", b"%d" % i)], ts=NOW), NOW)
    assert clean_log(log, NOW + 59_000) is None
    assert len(read_all(log)) == 30
    stats = clean_log(log, NOW + 61_000)
    assert stats is not None and len(read_all(log)) < 30
    assert [r.value for r in read_all(log)][-1] == b"29"
    # nothing dirty left before the active segment: no pass until new records get old
    assert clean_log(log, NOW + 62_000) is None


def test_max_compaction_lag_rolls_the_active_segment(make_log) -> None:
    # Kafka's LogConfig.maxSegmentMs: a compacted log rolls by min(segment.ms, max.compaction.lag.ms)
    log = make_log(cleanup_policy="compact", max_compaction_lag_ms=60_000)
    log.append_as_leader(kv_batch([(b"k", b"a")], ts=NOW), NOW)
    log.append_as_leader(kv_batch([(b"k", b"b")], ts=NOW + 30_000), NOW + 30_000)
    assert len(log.segments) == 1
    log.append_as_leader(kv_batch([(b"k", b"c")], ts=NOW + 61_000), NOW + 61_000)
    assert len(log.segments) == 2
    assert LogConfig(cleanup_policy="delete", max_compaction_lag_ms=60_000).max_segment_ms == LogConfig().segment_ms


def test_readers_of_replaced_segments_keep_their_bytes(make_log) -> None:
    log = make_log(cleanup_policy="compact", segment_bytes=400, file_delete_delay_ms=60_000,
                   min_cleanable_dirty_ratio=0.0)
    for i in range(30):
        log.append_as_leader(kv_batch([(b"k", b"%d" % i)]), NOW)
    in_flight = log.read(0, 1 << 20).records
    before = in_flight.read_bytes()
    clean_log(log, NOW)
    assert in_flight.read_bytes() == before
    assert list(log.dir.glob("*.deleted"))
    assert not list(log.dir.glob("*.cleaned")) and not list(log.dir.glob("*.swap"))


def test_cleaned_log_survives_restart_and_cleaner_thread(tmp_path: Path) -> None:
    cfg = LogConfig(cleanup_policy="compact", segment_bytes=400, file_delete_delay_ms=0,
                    min_cleanable_dirty_ratio=0.0)
    log = Log.open(tmp_path / "t-0", "t", 0, cfg, clean_shutdown=True)
    for i in range(40):
        log.append_as_leader(kv_batch([(b"k%d" % (i % 3), b"%d" % i)]), NOW)
    cleaner = LogCleaner(lambda: [log], backoff_ms=10)
    cleaner.start()
    try:
        import time

        deadline = time.time() + 5
        while log.cleaner_checkpoint == 0 and time.time() < deadline:
            time.sleep(0.01)
    finally:
        cleaner.shutdown()
    assert log.cleaner_checkpoint == log.active_segment.base_offset
    expected = _latest(log)
    leo = log.log_end_offset
    log.flush()
    log.close()
    log = Log.open(tmp_path / "t-0", "t", 0, cfg, clean_shutdown=False, recovery_point=0)
    try:
        assert log.log_end_offset == leo and _latest(log) == expected
    finally:
        log.close()


def test_concurrent_appends_reads_retention_and_cleaning(tmp_path: Path) -> None:
    import random
    import threading
    import time

    from kbroker.storage.errors import OffsetOutOfRangeError

    cfg = LogConfig(segment_bytes=3000, cleanup_policy="compact,delete", retention_bytes=10000, retention_ms=-1,
                    file_delete_delay_ms=20, min_cleanable_dirty_ratio=0.1, index_interval_bytes=200)
    log = Log.open(tmp_path / "t-0", "t", 0, cfg, clean_shutdown=True)
    stop = threading.Event()
    errors: list[str] = []
    rng = random.Random(7)

    def appender() -> None:
        i = 0
        while not stop.is_set():
            log.append_as_leader(kv_batch([(b"k%d" % rng.randrange(50), b"v" * rng.randrange(200))], ts=NOW + i), NOW)
            i += 1

    def reader() -> None:
        while not stop.is_set():
            try:
                off = rng.randrange(log.log_start_offset, log.log_end_offset + 1)
                info = log.read(off, 5000)
                if info.records is not None:
                    data = info.records.read_bytes()
                    validate_batches(data, from_client=False)
                    for pos, _ in iter_batch_headers(data):
                        decode_records(data, pos)
            except OffsetOutOfRangeError:
                pass  # retention moved the start under us
            except Exception as e:
                errors.append(repr(e))

    def background() -> None:
        while not stop.is_set():
            try:
                log.delete_old_segments()
                clean_log(log)
                log.delete_pending_files()
                log.flush()
            except Exception as e:
                errors.append("background: " + repr(e))

    threads = [threading.Thread(target=f) for f in (appender, reader, background)]
    for t in threads:
        t.start()
    # At least 0.8 s of all three together, and on until retention has moved the start (a slow machine appends
    # less, and the cleaner may keep the log under retention.bytes for a while).
    deadline = time.monotonic() + 20
    time.sleep(0.8)
    while time.monotonic() < deadline and not (log.log_end_offset > 100 and log.log_start_offset > 0):
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    leo = log.log_end_offset
    assert leo > 100 and log.log_start_offset > 0
    log.close()
    log = Log.open(tmp_path / "t-0", "t", 0, cfg, clean_shutdown=False)
    try:
        assert log.log_end_offset == leo
    finally:
        log.close()


def _lying_offsets_batch() -> bytes:
    """Two keyed records whose first record claims offset delta 23 in a batch of lastOffsetDelta 1, valid CRC."""
    from kbroker.protocol.records import BATCH_HEADER_SIZE, compute_crc

    raw = bytearray(build_batch([(b"a", b"1", [], NOW), (b"b", b"2", [], NOW)]))
    # record 0: length varint, attributes, timestampDelta varint (0), offsetDelta varint (0) -> zigzag(23) = 46
    first = BATCH_HEADER_SIZE
    assert raw[first + 3] == 0
    raw[first + 3] = 46
    raw[17:21] = compute_crc(raw, 0, len(raw)).to_bytes(4, "big")
    return bytes(raw)


def test_produce_refuses_records_outside_their_batch() -> None:
    import pytest
    from kbroker.protocol.records import InvalidRecordError

    raw = _lying_offsets_batch()
    assert list(iter_batch_headers(raw))  # header and CRC are fine: only the records lie
    with pytest.raises(InvalidRecordError, match="offset delta 23"):
        validate_batches(raw)


def test_compacted_append_rejects_records_outside_their_batch(make_log) -> None:
    import pytest
    from kbroker.protocol.records import InvalidRecordError

    log = _compacted(make_log)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(_lying_offsets_batch(), NOW)
    assert log.log_end_offset == 0


def test_cleaner_keeps_a_batch_whose_records_lie_about_offsets(log_dir: Path) -> None:
    # Written by an older kbroker, which walked no records of a topic that was not compacted then.
    write_legacy_segment(log_dir, [_lying_offsets_batch()])
    cfg = LogConfig(segment_bytes=400, file_delete_delay_ms=0, min_cleanable_dirty_ratio=0.0)
    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=False)
    for i in range(30):
        log.append_as_leader(kv_batch([(b"k%d" % (i % 3), b"v%d" % i)]), NOW)
    log.update_config(log.config.replace(cleanup_policy="compact"))
    assert clean_log(log, NOW, force=True) is not None  # before the fix: ValueError, log marked uncleanable
    try:
        assert [r.key for r in read_all(log)[:2]] == [b"a", b"b"]  # the lying batch is kept as it was
    finally:
        log.close()


def test_cleaning_merges_small_segments(make_log) -> None:
    # Kafka's groupSegmentsBySize: cleaned segments are grouped up to segment.bytes, so a compacted partition
    # does not keep one (mostly empty) segment per roll.
    log = make_log(cleanup_policy="compact", segment_bytes=10_000, file_delete_delay_ms=0,
                   min_cleanable_dirty_ratio=0.0)
    for i in range(60):
        log.append_as_leader(kv_batch([(b"k%d" % (i % 3), b"v%d" % i)]), NOW)
        log.roll()
    log.append_as_leader(kv_batch([(b"z", b"0")]), NOW)
    assert len(log.segments) == 61
    before = {r.key: (r.offset, r.value) for r in read_all(log)}
    stats = clean_log(log, NOW)
    assert stats is not None and stats.segments_merged == 59
    assert len(log.segments) == 2 and log.segments[0].base_offset == 0
    assert {r.key: (r.offset, r.value) for r in read_all(log)} == before
    assert [r.offset for r in read_all(log)] == [57, 58, 59, 60]


def test_merged_groups_stay_within_segment_bytes(make_log) -> None:
    log = make_log(cleanup_policy="compact", segment_bytes=400, file_delete_delay_ms=0, min_cleanable_dirty_ratio=0.0)
    for i in range(40):
        log.append_as_leader(kv_batch([(b"k%d" % i, b"v%d" % i)]), NOW)  # distinct keys: nothing is removed
        log.roll()
    log.append_as_leader(kv_batch([(b"z", b"0")]), NOW)
    sizes = [s.size for s in log.segments[:-1]]
    clean_log(log, NOW, force=True)
    assert 1 < len(log.segments) - 1 < len(sizes)
    assert all(s.size <= 400 for s in log.segments[:-1])
    assert len(read_all(log)) == 41


def test_merge_interrupted_after_the_swap_completes_on_load(log_dir: Path) -> None:
    cfg = LogConfig(cleanup_policy="compact", segment_bytes=4000, file_delete_delay_ms=60_000,
                    min_cleanable_dirty_ratio=0.0)
    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=True)
    for i in range(10):
        log.append_as_leader(kv_batch([(b"k%d" % (i % 3), b"v%d" % i)]), NOW)
        log.roll()
    log.append_as_leader(kv_batch([(b"z", b"0")]), NOW)
    expected = [(r.offset, r.value) for r in read_all(log)]
    log.close()
    # A crash right after the merged copy became .swap: the old segments are all still there.
    from kbroker.storage.cleaner import _clean_segments, group_segments_by_size

    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=True)
    [group] = group_segments_by_size(log, list(log.segments[:-1]), log.segments[-1].base_offset)
    new, _ = _clean_segments(log, group, lambda h, raw: (raw, None), CleanerStats())
    assert new is not None and len(group) == 10
    log.close()
    log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=False)
    try:
        assert [s.base_offset for s in log.segments] == [0, 10]
        assert [(r.offset, r.value) for r in read_all(log)] == expected
    finally:
        log.close()


def test_delete_horizon_with_extreme_record_timestamps(make_log) -> None:
    """A batch whose records sit at the bottom of the int64 range (accepted from a client, as Kafka accepts it)
    keeps its timestamps when the cleaner puts a delete horizon in its base timestamp: the deltas wrap around as
    Java's longs do, instead of the rebuild failing and the log being marked uncleanable (found by the batch
    fuzzer)."""
    low = -(2**63)
    log = _compacted(make_log, delete_retention_ms=DAY)
    records = [(b"a", None, [], low), (b"b", b"x", [], low + 67_108_863), (b"a", None, [], low + 242_435)]
    log.append_as_leader(build_batch(records), NOW)  # type: ignore[arg-type]
    log.roll()
    log.append_as_leader(kv_batch([(b"c", b"1")]), NOW)
    assert clean_log(log, NOW) is not None
    assert log.tombstone_horizon_ms == NOW + DAY
    assert [(r.key, r.timestamp) for r in read_all(log)][:2] == [(b"b", low + 67_108_863), (b"a", low + 242_435)]
    clean_log(log, NOW + 1)  # the batch with the horizon is rebuilt again
    assert [r.key for r in read_all(log)] == [b"b", b"a", b"c"]

"""ListOffsets v0's segment-based answers (storage/legacy_offsets.py, Kafka's legacyFetchOffsetsBefore), and magic
0/1 message sets appended as v2 batches."""

from __future__ import annotations

import os

import pytest
from kbroker.protocol.legacy_records import MessageTooLargeError, build_message_set
from kbroker.protocol.records import COMPRESSION_GZIP, Record, parse_batch_header
from kbroker.storage.legacy_offsets import legacy_offsets_before

from tests.storage.storage_helpers import NOW, batch, read_all


def test_segment_offsets_by_time(make_log) -> None:
    log = make_log(segment_bytes=100)
    for _ in range(3):
        log.append_as_leader(bytearray(batch(3, size=20)), NOW)
    bases = [s.base_offset for s in log.segments]
    assert bases == [0, 3, 6] and log.log_end_offset == 9
    for i, seg in enumerate(log.segments):  # segment i last written at t = 1000 * (i + 1) seconds
        os.utime(seg.log_path, (1000.0 * (i + 1), 1000.0 * (i + 1)))
    assert legacy_offsets_before(log, -1, 10, from_consumer=False) == [9, 6, 3, 0]
    assert legacy_offsets_before(log, -2, 10, from_consumer=False) == [0]
    assert legacy_offsets_before(log, 2_500_000, 10, from_consumer=False) == [3, 0]
    assert legacy_offsets_before(log, 2_500_000, 1, from_consumer=False) == [3]
    assert legacy_offsets_before(log, 999_999, 10, from_consumer=False) == []
    assert legacy_offsets_before(log, -1, 0, from_consumer=False) == []


def test_consumers_are_not_pointed_past_the_high_watermark(make_log) -> None:
    log = make_log(segment_bytes=100)
    log.set_hw_tracks_leo(False)  # a replicated partition whose followers have not caught up
    for _ in range(2):
        log.append_as_leader(bytearray(batch(3, size=20)), NOW)
    log.maybe_increment_high_watermark(4)
    assert legacy_offsets_before(log, -1, 10, from_consumer=False) == [6, 3, 0]
    assert legacy_offsets_before(log, -1, 10, from_consumer=True) == [4, 3, 0]


def test_legacy_sets_are_stored_as_v2_batches(make_log) -> None:
    log = make_log(max_message_bytes=1000, message_timestamp_type="LogAppendTime")
    v1 = build_message_set([Record(i, NOW + i, b"k", b"v%d" % i) for i in range(3)], magic=1,
                           compression=COMPRESSION_GZIP)
    info = log.append_as_leader(bytearray(v1), NOW + 500)
    assert (info.first_offset, info.last_offset, info.log_append_time) == (0, 2, NOW + 500)
    v0 = build_message_set([Record(0, -1, None, b"zero")], magic=0)
    assert log.append_as_leader(v0, NOW + 600).first_offset == 3
    recs = read_all(log)
    assert [(r.offset, r.value, r.timestamp) for r in recs] == [
        (0, b"v0", NOW + 500), (1, b"v1", NOW + 500), (2, b"v2", NOW + 500), (3, b"zero", NOW + 600)]
    first = log.read(0, 1 << 20).records.read_bytes()
    assert parse_batch_header(first).magic == 2 and parse_batch_header(first).compression == COMPRESSION_GZIP
    with pytest.raises(MessageTooLargeError):
        log.append_as_leader(build_message_set([Record(0, NOW, b"k", b"x" * 2000)], magic=1), NOW)

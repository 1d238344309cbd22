from __future__ import annotations

import gzip
import struct

import crc32c
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kbroker.protocol import records as r
from kbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    CorruptRecordError,
    InvalidRecordError,
    Record,
    build_batch,
    compress,
    decode_records,
    decompress,
    iter_batch_headers,
    parse_batch_header,
    read_uvarint,
    read_varint,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batches,
    write_uvarint,
    write_varint,
)

CODECS = [r.COMPRESSION_NONE, r.COMPRESSION_GZIP, r.COMPRESSION_SNAPPY, r.COMPRESSION_LZ4, r.COMPRESSION_ZSTD]

# One uncompressed batch, baseOffset 0, one record key=b"k" value=b"v", timestamp 1000, no
# producer, built by hand from the spec (not by build_batch) so encoder bugs cannot hide.
_RECORD_BODY = bytes([0x00, 0x00, 0x00, 0x02]) + b"k" + bytes([0x02]) + b"v" + bytes([0x00])
_RECORD = bytes([len(_RECORD_BODY) << 1]) + _RECORD_BODY
_AFTER_CRC = struct.pack(">hiqqqhii", 0, 0, 1000, 1000, -1, -1, -1, 1) + _RECORD
KNOWN_BATCH = (
    struct.pack(">qiib", 0, 4 + 1 + 4 + len(_AFTER_CRC), -1, 2)
    + struct.pack(">I", crc32c.crc32c(_AFTER_CRC))
    + _AFTER_CRC
)


def test_known_vector_matches_builder_and_decodes() -> None:
    assert KNOWN_BATCH == build_batch([(b"k", b"v", [], 1000)])
    assert len(KNOWN_BATCH) == BATCH_HEADER_SIZE + len(_RECORD) == 70
    h = parse_batch_header(KNOWN_BATCH)
    assert (h.base_offset, h.batch_length, h.magic, h.records_count) == (0, 58, 2, 1)
    assert h.size_in_bytes == 70 and h.last_offset == 0 and h.next_offset == 1
    assert decode_records(KNOWN_BATCH) == [Record(0, 1000, b"k", b"v", [], 0)]
    s = validate_batches(KNOWN_BATCH)
    assert s.num_batches == 1 and s.num_records == 1 and s.valid_bytes == 70 and s.max_timestamp == 1000


def test_known_crc_literal() -> None:
    # Frozen so a change to the header layout is caught even if builder and parser agree.
    assert KNOWN_BATCH.hex() == (
        "0000000000000000" "0000003a" "ffffffff" "02" "716a6189"  # offset, length, epoch, magic, crc
        "0000" "00000000" "00000000000003e8" "00000000000003e8"  # attrs, lastOffsetDelta, timestamps
        "ffffffffffffffff" "ffff" "ffffffff" "00000001"  # producer id/epoch, base sequence, count
        "10" "00" "00" "00" "02" "6b" "02" "76" "00"  # record: len 8, attrs, deltas, key, value, headers
    )


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_all_codecs(codec: int) -> None:
    recs = [(f"k{i}".encode(), (b"value-%d-" % i) * 50, [("h", b"x"), ("n", None)], 1_700_000_000_000 + i)
            for i in range(100)]
    recs.append((None, None, [], 1_700_000_000_500))
    batch = build_batch(recs, base_offset=42, compression=codec, producer_id=7, producer_epoch=3,
                        base_sequence=11, partition_leader_epoch=5)
    h = parse_batch_header(batch)
    assert h.compression == codec and h.producer_id == 7 and h.producer_epoch == 3 and h.base_sequence == 11
    assert h.records_count == 101 and h.last_offset_delta == 100 and h.partition_leader_epoch == 5
    assert h.max_timestamp == 1_700_000_000_500
    validate_batches(batch)
    out = decode_records(batch)
    assert [x.offset for x in out] == list(range(42, 143))
    assert [(x.key, x.value, x.headers, x.timestamp) for x in out] == [(k, v, list(hs), t) for k, v, hs, t in recs]
    if codec != r.COMPRESSION_NONE:
        assert len(batch) < sum(len(v) for _, v, _, _ in recs if v)


@pytest.mark.parametrize("codec", CODECS)
def test_decompress_bounds_output(codec: int) -> None:
    data = b"\0" * 200_000
    blob = compress(codec, data)
    assert decompress(codec, blob, 200_000) == data
    with pytest.raises(CorruptRecordError):
        decompress(codec, blob, 1000)


def test_snappy_xerial_and_raw_and_garbage() -> None:
    data = b"abc" * 30_000
    framed = compress(r.COMPRESSION_SNAPPY, data)
    assert framed.startswith(b"\x82SNAPPY\x00")
    assert decompress(r.COMPRESSION_SNAPPY, framed) == data
    assert decompress(r.COMPRESSION_SNAPPY, snappy.compress(data)) == data
    with pytest.raises(CorruptRecordError):
        decompress(r.COMPRESSION_SNAPPY, b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x10\x00zz")
    for codec in CODECS[1:]:
        with pytest.raises(CorruptRecordError):
            decompress(codec, b"definitely not compressed data")


def test_zstd_frame_without_content_size_and_multi_member_gzip() -> None:
    data = b"hello zstd " * 1000
    cobj = zstandard.ZstdCompressor().compressobj()
    streamed = cobj.compress(data) + cobj.flush()
    assert decompress(r.COMPRESSION_ZSTD, streamed) == data
    assert decompress(r.COMPRESSION_GZIP, gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"


def test_kafka_python_interop() -> None:
    drs = pytest.importorskip("kafka.record.default_records")
    for codec in CODECS:
        if codec == r.COMPRESSION_SNAPPY:
            continue  # kafka-python's snappy encoder uses its own framing options
        b = drs.DefaultRecordBatchBuilder(2, codec, False, 9, 1, 0, 1 << 20)
        for i in range(5):
            b.append(i, 1000 + i, b"k%d" % i, b"v%d" % i, [("a", b"b")])
        raw = bytes(b.build())
        validate_batches(raw)
        assert [(x.offset, x.key, x.value, x.timestamp, x.headers) for x in decode_records(raw)] == [
            (i, b"k%d" % i, b"v%d" % i, 1000 + i, [("a", b"b")]) for i in range(5)]
        ours = build_batch([(b"k", b"v", [("h", b"1")], 5)], compression=codec, base_offset=3)
        theirs = drs.DefaultRecordBatch(ours)
        assert theirs.validate_crc()
        rec = next(iter(theirs))
        assert (rec.offset, rec.key, rec.value, rec.timestamp) == (3, b"k", b"v", 5)


def test_validate_errors() -> None:
    good = build_batch([(b"a", b"b", [], 1), (b"c", b"d", [], 2)])
    with pytest.raises(InvalidRecordError):
        validate_batches(b"")
    with pytest.raises(CorruptRecordError, match="truncated batch header"):
        validate_batches(good[:30])
    with pytest.raises(CorruptRecordError, match="remain"):
        validate_batches(good[:-1])
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        validate_batches(flipped)
    bad_magic = bytearray(good)
    bad_magic[16] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        validate_batches(bad_magic)
    short = bytearray(good)
    struct.pack_into(">i", short, 8, 20)
    with pytest.raises(CorruptRecordError, match="batchLength"):
        validate_batches(short)
    # lastOffsetDelta inconsistent with recordsCount (CRC recomputed so that is the only fault).
    wrong = bytearray(build_batch([(b"a", b"b", [], 1)], last_offset_delta=3))
    with pytest.raises(InvalidRecordError, match="inconsistent"):
        validate_batches(wrong)
    assert validate_batches(wrong, from_client=False).num_records == 1
    control = build_batch([(b"\0\0\0\0", b"", [], 1)], is_control=True)
    with pytest.raises(InvalidRecordError, match="control"):
        validate_batches(control)
    empty = build_batch([], last_offset_delta=4, max_timestamp=10, producer_id=3)
    with pytest.raises(InvalidRecordError):
        validate_batches(empty)
    assert validate_batches(empty, from_client=False).batches[0][1].last_offset_delta == 4


def test_multi_batch_summary_and_partial_tail() -> None:
    b1 = build_batch([(b"a", b"1", [], 100), (b"b", b"2", [], 300)], producer_id=1, base_sequence=0)
    b2 = build_batch([(b"c", b"3", [], 200)], producer_id=2, base_sequence=5)
    s = validate_batches(memoryview(b1 + b2))
    assert s.num_batches == 2 and s.num_records == 3 and s.valid_bytes == len(b1) + len(b2)
    assert (s.first_timestamp, s.last_timestamp, s.max_timestamp, s.max_timestamp_batch) == (100, 200, 300, 0)
    assert s.producers == [(1, -1, 0, 1), (2, -1, 5, 0)]
    assert [p for p, _ in iter_batch_headers(b1 + b2 + b2[:40])] == [0, len(b1)]
    assert [p for p, _ in iter_batch_headers(b1 + b2[:-1])] == [0]


def test_in_place_rewrites() -> None:
    buf = bytearray(build_batch([(b"a", b"1", [], 100), (b"b", b"2", [], 300)]))
    set_base_offset(buf, 0, 1234)
    set_partition_leader_epoch(buf, 0, 9)
    validate_batches(buf)  # both fields are outside the CRC
    h = parse_batch_header(buf)
    assert h.base_offset == 1234 and h.partition_leader_epoch == 9
    set_log_append_time(memoryview(buf), 0, 5555)
    validate_batches(buf)
    h = parse_batch_header(buf)
    assert h.timestamp_type == r.TIMESTAMP_LOG_APPEND_TIME and h.max_timestamp == 5555
    assert [x.timestamp for x in decode_records(buf)] == [5555, 5555]
    assert [x.offset for x in decode_records(buf)] == [1234, 1235]


def test_preserved_offsets_and_delete_horizon() -> None:
    recs = [Record(10, 50, b"a", b"1"), Record(13, 70, b"b", None)]
    batch = build_batch(recs, base_offset=10, last_offset_delta=5, delete_horizon_ms=999, producer_id=4)
    h = parse_batch_header(batch)
    assert h.has_delete_horizon and h.delete_horizon_ms == 999 and h.last_offset == 15 and h.records_count == 2
    assert h.max_timestamp == 70
    assert decode_records(batch) == recs
    validate_batches(batch, from_client=False)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varint_round_trip(v: int) -> None:
    out = bytearray()
    write_varint(v, out)
    assert read_varint(out, 0) == (v, len(out))
    if v >= 0:
        out = bytearray()
        write_uvarint(v, out)
        assert read_uvarint(out, 0) == (v, len(out))


_headers = st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8))), max_size=3)
_rec = st.tuples(st.one_of(st.none(), st.binary(max_size=40)), st.one_of(st.none(), st.binary(max_size=200)),
                 _headers, st.integers(min_value=0, max_value=2**50))


@settings(max_examples=60, deadline=None)
@given(st.lists(_rec, min_size=1, max_size=20), st.sampled_from(CODECS), st.integers(0, 2**40))
def test_build_decode_property(recs: list, codec: int, base: int) -> None:
    batch = build_batch(recs, base_offset=base, compression=codec)
    s = validate_batches(batch)
    assert s.num_records == len(recs)
    out = decode_records(batch)
    assert [(x.key, x.value, x.headers, x.timestamp, x.offset) for x in out] == [
        (k, v, list(h), t, base + i) for i, (k, v, h, t) in enumerate(recs)]


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_never_crashes_validation(data: bytes) -> None:
    try:
        validate_batches(data)
    except (CorruptRecordError, InvalidRecordError):
        pass

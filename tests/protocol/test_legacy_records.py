"""Message formats v0/v1 (protocol/legacy_records.py), checked against kafka-python's own legacy codec
(kafka.record.legacy_records): sets it builds are read and converted here, and sets built here are read by it."""

from __future__ import annotations

import struct
import zlib

import lz4.frame
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kbroker.protocol.legacy_records import (
    UnsupportedCompressionTypeError,
    build_message_set,
    compress_lz4_legacy,
    decompress_lz4_legacy,
    down_convert,
    first_magic,
    read_message_set,
    scan_shallow_entries,
    to_record_batch,
    xxh32,
)
from kbroker.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CorruptRecordError,
    InvalidRecordError,
    Record,
    RecordValidationError,
    build_batch,
    decode_records,
    parse_batch_header,
    validate_batches,
)

TS0 = 1_700_000_000_000
CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4]


def kp_set(magic: int, codec: int, n: int = 5) -> bytes:
    """A message set as kafka-python 3 writes it for an old broker (null keys, a null value, timestamps in v1)."""
    b = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=TS0 + i if magic else None, key=b"k%d" % i if i % 2 else None,
                 value=None if i == 3 else b"v" * i)
    return bytes(b.build())


def kp_read(buf: bytes) -> list[tuple[int, int, bytes | None, bytes | None]]:
    mr = MemoryRecords(buf)
    out = []
    while mr.has_next():
        batch = mr.next_batch()
        if batch is None:
            break
        out.extend((r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value) for r in batch)
    return out


def expected(magic: int, n: int = 5, base: int = 0) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [(base + i, TS0 + i if magic else -1, b"k%d" % i if i % 2 else None, None if i == 3 else b"v" * i)
            for i in range(n)]


# kafka-python needs the xxhash package to write magic 0 lz4: that case is test_lz4_magic0_broken_checksum's.
@pytest.mark.parametrize(("magic", "codec"), [(m, c) for m in (0, 1) for c in CODECS if (m, c) != (0, COMPRESSION_LZ4)])
def test_produced_set_to_v2_and_back(magic: int, codec: int) -> None:
    buf = kp_set(magic, codec)
    assert first_magic(buf) == magic
    entries = scan_shallow_entries(buf)
    assert len(entries) == (5 if codec == COMPRESSION_NONE else 1)
    batch = to_record_batch(buf, entries)
    header = parse_batch_header(batch)
    assert header.magic == 2 and header.compression == codec and header.records_count == 5
    validate_batches(batch)  # what the log checks next
    recs = decode_records(batch)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in recs] == expected(magic)
    # As the log would store them at offset 100, then down-converted for an old consumer, read by kafka-python.
    stored = build_batch([Record(100 + r.offset, r.timestamp, r.key, r.value) for r in recs], base_offset=100,
                         compression=codec)
    back = down_convert(stored, magic, 100, 1 << 20)
    assert kp_read(back) == expected(magic, base=100)
    assert [(m.offset, m.timestamp, m.key, m.value) for m in read_message_set(back)] == expected(magic, base=100)


def test_v1_compressed_wrapper_relative_offsets() -> None:
    recs = [Record(40 + 2 * i, TS0 + i, b"k", b"v%d" % i) for i in range(4)]  # compaction left gaps
    out = build_message_set(recs, magic=1, compression=COMPRESSION_GZIP)
    wrapper_offset, size = struct.unpack_from(">qi", out)
    assert wrapper_offset == 46 and len(out) == 12 + size  # one wrapper, at the last inner offset
    inner = zlib.decompress(out[12 + 4 + 1 + 1 + 8 + 4 + 4:], wbits=31)
    assert [struct.unpack_from(">q", inner, p)[0] for p in _positions(inner)] == [0, 2, 4, 6]  # relative
    assert kp_read(out) == [(40 + 2 * i, TS0 + i, b"k", b"v%d" % i) for i in range(4)]
    out0 = build_message_set(recs, magic=0, compression=COMPRESSION_GZIP)
    inner0 = zlib.decompress(out0[12 + 4 + 1 + 1 + 4 + 4:], wbits=31)
    assert [struct.unpack_from(">q", inner0, p)[0] for p in _positions(inner0)] == [40, 42, 44, 46]  # absolute
    assert [m.offset for m in read_message_set(out0)] == [40, 42, 44, 46]


def _positions(buf: bytes) -> list[int]:
    pos, out = 0, []
    while pos < len(buf):
        out.append(pos)
        pos += 12 + struct.unpack_from(">i", buf, pos + 8)[0]
    return out


def test_bad_crc_is_corrupt_message() -> None:
    buf = bytearray(kp_set(1, COMPRESSION_NONE))
    buf[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="crc"):
        scan_shallow_entries(buf)
    assert CorruptRecordError.error_code == 2


def test_bad_inner_crc_is_corrupt_message() -> None:
    recs = [Record(i, TS0, b"k", b"v") for i in range(3)]
    inner = bytearray(build_message_set(recs, magic=1))
    inner[-1] ^= 0xFF
    wrapper = _wrap(bytes(inner), magic=1, codec=COMPRESSION_GZIP, payload=_gzip(bytes(inner)))
    with pytest.raises(CorruptRecordError):
        to_record_batch(wrapper, scan_shallow_entries(wrapper))


def _gzip(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=31)
    return c.compress(data) + c.flush()


def _wrap(inner: bytes, *, magic: int, codec: int, payload: bytes, offset: int = 2, ts_attr: int = 0) -> bytes:
    body = bytearray([magic, codec | ts_attr])
    if magic:
        body += struct.pack(">q", TS0)
    body += struct.pack(">i", -1) + struct.pack(">i", len(payload)) + payload
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(msg)) + msg


def test_truncated_sets() -> None:
    buf = kp_set(1, COMPRESSION_NONE)
    # A produced set cut short is corrupt ...
    with pytest.raises(CorruptRecordError):
        scan_shallow_entries(buf[:-3])
    # ... a fetched one ends at its last whole message.
    assert [m.offset for m in read_message_set(buf[:-3])] == [0, 1, 2, 3]
    assert read_message_set(buf[:7]) == []


def test_zstd_below_magic_2_is_invalid_record() -> None:
    payload = __import__("zstandard").ZstdCompressor().compress(build_message_set([Record(0, TS0, b"k", b"v")],
                                                                                  magic=1))
    wrapper = _wrap(b"", magic=1, codec=COMPRESSION_ZSTD, payload=payload, offset=0)
    with pytest.raises(InvalidRecordError, match="compressionType"):
        to_record_batch(wrapper, scan_shallow_entries(wrapper))
    with pytest.raises(UnsupportedCompressionTypeError):
        down_convert(build_batch([(b"k", b"v", (), TS0)], compression=COMPRESSION_ZSTD), 1, 0, 1 << 20)


def test_several_wrappers_and_nested_compression_are_invalid() -> None:
    one = build_message_set([Record(0, TS0, b"k", b"v")], magic=1, compression=COMPRESSION_GZIP)
    two = one + one
    with pytest.raises(InvalidRecordError, match="more than one batch"):
        to_record_batch(two, scan_shallow_entries(two))
    nested = _wrap(b"", magic=1, codec=COMPRESSION_GZIP, payload=_gzip(one), offset=0)
    with pytest.raises(RecordValidationError) as e:
        to_record_batch(nested, scan_shallow_entries(nested))
    assert e.value.error_code == 87 and e.value.record_errors[0].batch_index == 0


def test_log_append_time_from_a_producer_is_refused() -> None:
    recs = [Record(0, TS0, b"k", b"v")]
    inner = build_message_set(recs, magic=1)
    wrapper = _wrap(inner, magic=1, codec=COMPRESSION_GZIP, payload=_gzip(inner), offset=0, ts_attr=0x08)
    with pytest.raises(RecordValidationError) as e:
        to_record_batch(wrapper, scan_shallow_entries(wrapper))
    assert e.value.error_code == 32


def test_mixed_magics_are_invalid() -> None:
    buf = build_message_set([Record(0, -1, b"k", b"v")], magic=0) + build_message_set([Record(1, TS0, b"k", b"v")],
                                                                                       magic=1)
    with pytest.raises(InvalidRecordError, match="magic"):
        scan_shallow_entries(buf)
    # A v2 batch after a legacy message: the same refusal (Kafka checks the magic before the batch's CRC).
    with pytest.raises(InvalidRecordError, match="Batch magic 2"):
        scan_shallow_entries(build_message_set([Record(0, TS0, b"k", b"v")], magic=1) + build_batch(
            [(b"k", b"v", (), TS0)]))
    bad = bytearray(build_message_set([Record(0, TS0, b"k", b"v")], magic=1))
    bad[16] = 7
    with pytest.raises(CorruptRecordError, match="magic 7"):
        scan_shallow_entries(bytes(bad))


def test_xxh32_and_lz4_header_checksums() -> None:
    assert xxh32(b"") == 0x02CC5D05
    assert xxh32(b"a") == 0x550D7456
    assert xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F
    # python-lz4 writes standard frames: the header checksum is the second byte of XXH32 over FLG and BD.
    proper = lz4.frame.compress(b"x" * 1000, store_size=False, block_linked=False)
    assert proper[6] == (xxh32(proper[4:6]) >> 8) & 0xFF


def test_lz4_magic0_broken_checksum() -> None:
    data = b"hello kafka 0.9 " * 500
    v0 = compress_lz4_legacy(data, 0)
    v1 = compress_lz4_legacy(data, 1)
    assert v0[:6] == v1[:6] and v0[7:] == v1[7:]
    # Magic 1 frames are standard LZ4 frames; magic 0 ones carry the checksum over the frame magic number too.
    assert lz4.frame.decompress(v1) == data
    assert v0[6] == (xxh32(v0[:6]) >> 8) & 0xFF != v1[6]
    with pytest.raises(RuntimeError):
        lz4.frame.decompress(v0)
    assert decompress_lz4_legacy(v0, 0, 1 << 20) == data
    # Kafka checks the checksum from magic 1 on.
    with pytest.raises(CorruptRecordError):
        decompress_lz4_legacy(v0, 1, 1 << 20)
    recs = [Record(7 + i, -1, None, b"m%d" % i) for i in range(3)]
    out = build_message_set(recs, magic=0, compression=COMPRESSION_LZ4)
    assert [(m.offset, m.value) for m in read_message_set(out)] == [(7, b"m0"), (8, b"m1"), (9, b"m2")]
    assert decode_records(to_record_batch(out, scan_shallow_entries(out)))[2].value == b"m2"


def test_down_convert_drops_control_batches_headers_and_earlier_records() -> None:
    from kbroker.protocol.control_records import build_end_txn_marker_batch

    data = build_batch([(b"k", b"a%d" % i, [("h", b"x")], TS0 + i) for i in range(4)], base_offset=10,
                       compression=COMPRESSION_SNAPPY, producer_id=5, producer_epoch=0, base_sequence=0,
                       is_transactional=True)
    marker = bytearray(build_end_txn_marker_batch(5, 0, 0, True, TS0))
    struct.pack_into(">q", marker, 0, 14)
    more = build_batch([(None, b"b", (), TS0 + 9)], base_offset=15)
    out = down_convert(data + bytes(marker) + more, 1, 12, 1 << 20)
    assert kp_read(out) == [(12, TS0 + 2, b"k", b"a2"), (13, TS0 + 3, b"k", b"a3"), (15, TS0 + 9, None, b"b")]


def test_down_convert_log_append_time_and_limits() -> None:
    data = build_batch([(b"k", b"v%d" % i, (), TS0 + i) for i in range(3)], base_offset=0,
                       timestamp_type=1, max_timestamp=TS0 + 777)
    out = down_convert(data, 1, 0, 1 << 20)
    assert {m.timestamp for m in read_message_set(out)} == {TS0 + 777}
    assert all(m.attributes & 0x08 for m in read_message_set(out))
    two = data + build_batch([(b"k", b"w%d" % i, (), TS0 + i) for i in range(3)], base_offset=3)
    whole = down_convert(two, 1, 0, 1 << 20)
    assert len(read_message_set(whole)) == 6
    # Cut to the budget: a message cut at the end, which a consumer drops ...
    cut = down_convert(two, 1, 0, len(whole) - 5)
    assert cut == whole[:-5] and len(read_message_set(cut)) == 5
    # ... and before Fetch v3 even within the first batch (the client grows its buffer), from v3 the first
    # converted batch goes out whole.
    assert down_convert(two, 1, 0, 10, whole_first=False) == whole[:10]
    assert down_convert(two, 1, 0, 10) == out


@given(st.sampled_from([(m, c) for m in (0, 1) for c in CODECS]), st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4), st.integers(0, 10_000),
    st.booleans())
@settings(max_examples=300, deadline=None)
def test_mangled_sets_are_refused_with_kafka_errors(kind: tuple[int, int], flips: list[tuple[int, int]],
                                                    cut: int, fix_crc: bool) -> None:
    """Whatever a producer sends, the conversion answers with a Kafka error (CORRUPT_MESSAGE, INVALID_RECORD,
    INVALID_TIMESTAMP) or a valid batch, never another exception (which would be UNKNOWN_SERVER_ERROR)."""
    magic, codec = kind
    buf = bytearray(build_message_set([Record(i, TS0 + i, b"k%d" % i, b"v" * i) for i in range(4)], magic=magic,
                                      compression=codec))
    for pos, value in flips:
        buf[pos % len(buf)] = value
    if fix_crc and len(buf) > 16:
        # Past the CRC check, so the deeper checks get garbage too.
        buf[12:16] = zlib.crc32(bytes(buf[16:12 + int.from_bytes(buf[8:12], "big", signed=True)])).to_bytes(4, "big")
    data = bytes(buf[: max(1, len(buf) - cut % 8)])
    try:
        batch = to_record_batch(data, scan_shallow_entries(data))
    except (CorruptRecordError, InvalidRecordError):
        return
    validate_batches(batch)
    read_message_set(data)


def test_each_produced_message_must_fit_max_message_bytes() -> None:
    from kbroker.protocol.legacy_records import MessageTooLargeError, convert_produced_set

    plain = build_message_set([Record(i, TS0, b"k", b"x" * 300) for i in range(5)], magic=1)
    # Five messages of ~340 bytes: each fits 400 bytes although the set (and the v2 batch) does not.
    assert parse_batch_header(convert_produced_set(plain, max_message_bytes=400)).records_count == 5
    with pytest.raises(MessageTooLargeError):
        convert_produced_set(plain, max_message_bytes=300)
    wrapper = build_message_set([Record(i, TS0, b"k", bytes(range(256))) for i in range(5)], magic=1,
                                compression=COMPRESSION_GZIP)
    with pytest.raises(MessageTooLargeError) as e:
        convert_produced_set(wrapper, max_message_bytes=len(wrapper) - 1)
    assert e.value.error_code == 10

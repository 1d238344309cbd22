"""protocol.record_walk: the per-record structural walk behind validate_batches, checked against decode_records,
and its compiled form (protocol/_record_walk.c) against the Python one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kbroker.protocol import records as R
from kbroker.protocol.record_walk import COMPILED, walk_records, walk_records_py

NOW = 1_700_000_000_000

_key = st.none() | st.binary(max_size=300)
_headers = st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=20)), max_size=3)
_record = st.tuples(_key, st.none() | st.binary(max_size=300), _headers, st.integers(NOW - 10**6, NOW + 10**6))


def _body(batch: bytes) -> bytes:
    h = R.parse_batch_header(batch)
    body = batch[R.BATCH_HEADER_SIZE:]
    return R.decompress(h.compression, body) if h.compression else body


def _walk(body: bytes, count: int, **kw: object) -> object:
    args: dict[str, object] = {"consecutive": True, "last_offset_delta": count - 1, "need_keys": False,
                               "base_timestamp": NOW, "ts_bounds": None}
    args.update(kw)
    return walk_records(body, count, **args)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.lists(_record, min_size=1, max_size=20))
def test_walk_accepts_what_the_encoder_writes_and_finds_keyless_records(recs: list) -> None:
    batch = R.build_batch(recs)
    h = R.parse_batch_header(batch)
    found = _walk(_body(batch), h.records_count, need_keys=True, base_timestamp=h.base_timestamp)
    assert not isinstance(found, str), found
    assert found.keyless == [i for i, rec in enumerate(recs) if rec[0] is None]


@settings(max_examples=600, deadline=None)
@given(st.lists(_record, min_size=1, max_size=6), st.data())
def test_whatever_the_walk_accepts_decodes(recs: list, data: st.DataObject) -> None:
    body = bytearray(_body(R.build_batch(recs)))
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["set", "cut", "tail", "count"]))
        if kind == "set" and body:
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
        elif kind == "cut" and body:
            del body[data.draw(st.integers(0, len(body) - 1)):]
        elif kind == "tail":
            body += data.draw(st.binary(min_size=1, max_size=8))
    count = len(recs) + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    found = _walk(bytes(body), count)
    if isinstance(found, str):
        return
    # a sound structure is one decode_records reads to the end with exactly `count` records
    header = bytearray(R.build_batch(recs)[: R.BATCH_HEADER_SIZE])
    header[8:12] = (R.BATCH_OVERHEAD + len(body)).to_bytes(4, "big")
    header[57:61] = count.to_bytes(4, "big", signed=True)
    decoded = R.decode_records(bytes(header) + bytes(body))
    assert len(decoded) == count
    assert [rec.offset for rec in decoded] == list(range(count))


def test_structural_faults_have_kafka_messages() -> None:
    two = _body(R.build_batch([(b"a", b"1", (), NOW), (b"b", b"2", (), NOW)]))
    assert _walk(two, 3) == "Incorrect declared batch size, premature EOF reached"
    assert _walk(two, 1) == "Incorrect declared batch size, records still remaining in file"
    bad = bytearray(two)
    bad[0] += 2
    assert str(_walk(bytes(bad), 2)).startswith("Invalid record size")
    assert _walk(b"\xff" * 12, 1) == "Found invalid record structure"  # a varint longer than 10 bytes
    assert "offset delta" in str(_walk(two[: 1 + (two[0] >> 1)] * 2, 2))


def test_timestamp_bounds_collect_records_outside_and_spare_no_timestamp() -> None:
    stamps = [NOW, NOW - 5000, NOW + 5000, -1]
    batch = R.build_batch([(b"k", b"v", (), ts) for ts in stamps])
    h = R.parse_batch_header(batch)
    found = _walk(_body(batch), 4, base_timestamp=h.base_timestamp, ts_bounds=(NOW - 1000, NOW + 1000))
    assert not isinstance(found, str)
    assert found.bad_timestamps == [(1, NOW - 5000), (2, NOW + 5000)]


@pytest.mark.parametrize("codec", [R.COMPRESSION_NONE, R.COMPRESSION_GZIP, R.COMPRESSION_SNAPPY,
                                   R.COMPRESSION_LZ4, R.COMPRESSION_ZSTD])
def test_validate_batches_walks_inflated_records(codec: int) -> None:
    keys = [None, b"a", b"b", None]
    batch = R.build_batch([(k, b"v", (), NOW) for k in keys], compression=codec)
    R.validate_batches(batch)
    with pytest.raises(R.RecordValidationError) as e:
        R.validate_batches(batch, compacted=True, topic_partition="t-0")
    assert e.value.error_code == R.INVALID_RECORD
    assert [x.batch_index for x in e.value.record_errors] == [0, 3]
    # the count in the header says 5 while 4 records follow
    raw = bytearray(batch)
    raw[23:27] = (4).to_bytes(4, "big")
    raw[57:61] = (5).to_bytes(4, "big")
    raw[17:21] = R.compute_crc(raw, 0, len(raw)).to_bytes(4, "big")
    with pytest.raises(R.InvalidRecordError, match="premature EOF"):
        R.validate_batches(bytes(raw))


def _both(body: bytes, count: int, **kw: object) -> tuple[object, object]:
    args: dict[str, object] = {"consecutive": True, "last_offset_delta": count - 1, "need_keys": True,
                               "base_timestamp": NOW, "ts_bounds": None}
    args.update(kw)
    return walk_records(body, count, **args), walk_records_py(body, count, **args)  # type: ignore[arg-type]


def _same(a: object, b: object) -> None:
    # Messages may differ on the rarest faults; what is refused, and which records are reported, may not.
    assert isinstance(a, str) == isinstance(b, str), (a, b)
    if not isinstance(a, str):
        assert (a.keyless, a.bad_timestamps) == (b.keyless, b.bad_timestamps)  # type: ignore[union-attr]


@pytest.mark.skipif(not COMPILED, reason="protocol/_record_walk.c not built (python setup.py build_ext --inplace)")
@settings(max_examples=1500, deadline=None)
@given(st.lists(_record, min_size=1, max_size=6), st.data())
def test_compiled_walk_agrees_with_the_python_walk(recs: list, data: st.DataObject) -> None:
    batch = R.build_batch(recs)
    h = R.parse_batch_header(batch)
    body = bytearray(_body(batch))
    for _ in range(data.draw(st.integers(0, 3))):
        kind = data.draw(st.sampled_from(["set", "cut", "tail", "varint"]))
        if kind == "set" and body:
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
        elif kind == "cut" and body:
            del body[data.draw(st.integers(0, len(body) - 1)):]
        elif kind == "tail":
            body += data.draw(st.binary(min_size=1, max_size=8))
        elif body:
            # long and over-long varints (10 bytes with high bits, 11 bytes) where a field starts
            at = data.draw(st.integers(0, len(body) - 1))
            body[at:at + 1] = data.draw(st.sampled_from([b"\xff" * 9 + b"\x01", b"\xff" * 9 + b"\x7f",
                                                         b"\xff" * 11, b"\x80\x80\x01",
                                                         b"\x82\x80\x80\x80\x80\x00", b"\x82\x80\x80\x80\x10"]))
    count = len(recs) + data.draw(st.sampled_from([0, 0, -1, 1]))
    bounds = data.draw(st.sampled_from([None, (NOW - 1000, NOW + 1000), (-(2**63), 2**63 - 1)]))
    for consecutive in (True, False):
        _same(*_both(bytes(body), count, consecutive=consecutive, base_timestamp=h.base_timestamp,
                     ts_bounds=bounds))


@pytest.mark.skipif(not COMPILED, reason="protocol/_record_walk.c not built (python setup.py build_ext --inplace)")
def test_compiled_walk_reads_every_buffer_type() -> None:
    body = _body(R.build_batch([(None, b"v", (), NOW), (b"k", b"v", (), NOW - 10**9)]))
    for buf in (body, bytearray(body), memoryview(body), memoryview(bytearray(b"xx" + body))[2:]):
        found = walk_records(buf, 2, consecutive=True, last_offset_delta=1, need_keys=True, base_timestamp=NOW,
                             ts_bounds=(NOW - 1000, NOW + 1000))
        assert not isinstance(found, str)
        assert found.keyless == [0] and found.bad_timestamps == [(1, NOW - 10**9)]


# ---------------------------------------------------------------- over-long varints (issue 39 item 11)

VARINT_FIELDS = ("length", "timestamp", "offset", "key", "value", "headers", "header_key", "header_value")


def padded_varint(value: int, width: int) -> bytes:
    """The zigzag varint of value written in exactly `width` bytes (continuation bits on zero groups)."""
    raw = (value << 1) ^ (value >> 63)
    assert raw < 1 << (7 * width), (value, width)
    return bytes(((raw >> (7 * i)) & 0x7F) | (0x80 if i < width - 1 else 0) for i in range(width))


def record_with_widths(offset_delta: int, widths: dict[str, int], key: bytes = b"k", value: bytes = b"v",
                       header: tuple[bytes, bytes] = (b"h", b"x")) -> bytes:
    """One v2 record whose varint fields take the given widths (1 where not named): a valid record for a
    reader that allows any width, the way a careless or hostile producer may write it."""
    def v(field: str, n: int) -> bytes:
        return padded_varint(n, widths.get(field, 1))
    body = (b"\x00" + v("timestamp", 0) + v("offset", offset_delta) + v("key", len(key)) + key
            + v("value", len(value)) + value + v("headers", 1) + v("header_key", len(header[0])) + header[0]
            + v("header_value", len(header[1])) + header[1])
    return v("length", len(body)) + body


def _both_plain(body: bytes, count: int) -> tuple[object, object]:
    args = {"consecutive": True, "last_offset_delta": count - 1, "need_keys": False, "base_timestamp": NOW,
            "ts_bounds": None}
    return walk_records(body, count, **args), walk_records_py(body, count, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", VARINT_FIELDS)
def test_record_varints_longer_than_kafka_reads_are_refused(field: str) -> None:
    # Kafka's DefaultRecord reads every record varint with ByteUtils.readVarint (at most 5 bytes) except the
    # timestamp delta (readVarlong, at most 10); a Java consumer stops at anything longer.
    limit = 10 if field == "timestamp" else 5
    for width in range(1, 11):
        body = record_with_widths(0, {}) + record_with_widths(1, {field: width})
        for found in _both_plain(body, 2):
            if width <= limit:
                assert not isinstance(found, str), (field, width, found)
            else:
                assert found == "Found invalid record structure", (field, width, found)


def test_five_byte_record_varints_must_fit_32_bits() -> None:
    # Java keeps the low 32 bits of a fifth byte's 35; the walks refuse such a value instead of reading another
    # number than a Java consumer would. A 10-byte timestamp delta may use all 64 bits.
    ok = record_with_widths(0, {"key": 5})
    assert ok[4:9] == b"\x82\x80\x80\x80\x00"  # after the length, attributes, timestamp and offset delta
    wide = bytearray(ok)
    wide[8] = 0x10  # bit 32 of the raw key length
    for found in _both_plain(bytes(wide), 1):
        assert found == "Found invalid record structure"
    for found in _both_plain(ok, 1):
        assert not isinstance(found, str)


@pytest.mark.skipif(not COMPILED, reason="protocol/_record_walk.c not built (python setup.py build_ext --inplace)")
@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(VARINT_FIELDS), st.integers(1, 10)), max_size=4),
       st.integers(1, 4), st.data())
def test_compiled_and_python_walks_agree_on_varint_widths(widths: list, count: int, data: st.DataObject) -> None:
    # differential: records with any mix of field widths, some bytes then set at random
    body = bytearray(b"".join(record_with_widths(i, dict(widths) if i == count - 1 else {}) for i in range(count)))
    for _ in range(data.draw(st.integers(0, 2))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
    compiled, python = _both_plain(bytes(body), count)
    _same(compiled, python)

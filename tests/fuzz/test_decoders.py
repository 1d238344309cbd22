"""In-process fuzzing of the decoders: protocol.codec for every request and response class at every
version, the request header, and protocol.records (validate_batches, decode_records, decompress).

Only DecodeError (codec) or CorruptRecordError/InvalidRecordError (records) may escape."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from kbroker.protocol import codec
from kbroker.protocol import records as R

from tests.fuzz.common import ALL_CODEC_CASES, budget, record_batch, run_for
from tests.protocol.test_codec import instance_strategy

RECORD_ERRORS = (R.CorruptRecordError, R.InvalidRecordError)


@st.composite
def codec_input(draw: st.DrawFn) -> tuple[type, int, bytes]:
    cls, version = draw(st.sampled_from(ALL_CODEC_CASES))
    if draw(st.integers(0, 3)) == 0:
        return cls, version, draw(st.binary(max_size=200))
    buf = bytearray(codec.encode(draw(instance_strategy(cls, version)), version))
    how = draw(st.sampled_from(["flip", "set", "truncate", "tail", "int32"]))
    if how == "flip" and buf:
        for _ in range(draw(st.integers(1, 6))):
            buf[draw(st.integers(0, len(buf) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif how == "set" and buf:
        for _ in range(draw(st.integers(1, 3))):
            buf[draw(st.integers(0, len(buf) - 1))] = draw(st.sampled_from([0, 0x7F, 0x80, 0xFF]))
    elif how == "truncate":
        del buf[draw(st.integers(0, len(buf))):]
    elif how == "tail":
        buf += draw(st.binary(min_size=1, max_size=20))
    elif how == "int32" and len(buf) >= 4:
        i = draw(st.integers(0, len(buf) - 4))
        buf[i:i + 4] = draw(st.sampled_from([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\x80\x00\x00\x00",
                                             b"\xff\xff\xff\xff", b"\x00\x10\x00\x00"]))
    return cls, version, bytes(buf)


def test_codec_decode_raises_only_decode_error() -> None:
    def check(case: tuple[type, int, bytes]) -> None:
        cls, version, buf = case
        for b in (buf, memoryview(buf), bytearray(buf)):
            try:
                codec.decode(cls, version, b)
            except codec.DecodeError:
                pass
        try:
            codec.decode_request_header(buf)
        except codec.DecodeError:
            pass

    run_for(budget("decoders") * 0.8, codec_input(), check, chunk=200, min_chunks=2)


def test_request_header_random_bytes() -> None:
    def check(buf: bytes) -> None:
        try:
            codec.decode_request_header(buf)
        except codec.DecodeError:
            pass

    run_for(budget("decoders") * 0.2, st.binary(max_size=40), check, chunk=300)


@st.composite
def records_input(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=300))
    return draw(record_batch(corrupt=True))


def _decode_all(buf: Any) -> None:
    try:
        for pos, _ in R.iter_batch_headers(buf):
            R.decode_records(buf, pos, max_size=1 << 20)
    except RECORD_ERRORS:
        pass


def test_records_decoders_raise_only_record_errors() -> None:
    def check(buf: bytes) -> None:
        for from_client in (True, False):
            try:
                R.validate_batches(buf, from_client=from_client)
            except RECORD_ERRORS:
                pass
        _decode_all(buf)
        _decode_all(memoryview(buf))
        try:
            R.decode_records(buf, 0, max_size=1 << 16)
        except RECORD_ERRORS:
            pass

    run_for(budget("records") * 0.7, records_input(), check, chunk=200, min_chunks=2)


@st.composite
def compressed_garbage(draw: st.DrawFn) -> tuple[int, bytes]:
    compression = draw(st.integers(0, 7))
    data = bytearray(R.compress(min(compression, 4), draw(st.binary(max_size=200))))
    how = draw(st.sampled_from(["none", "flip", "truncate", "random", "tail"]))
    if how == "flip" and data:
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif how == "truncate":
        del data[draw(st.integers(0, len(data))):]
    elif how == "random":
        data = bytearray(draw(st.binary(max_size=100)))
    elif how == "tail":
        data += draw(st.binary(min_size=1, max_size=30))
    return compression, bytes(data)


def test_decompress_raises_only_record_errors() -> None:
    def check(case: tuple[int, bytes]) -> None:
        compression, data = case
        try:
            out = R.decompress(compression, data, max_size=100)
        except RECORD_ERRORS:
            return
        assert len(out) <= 100

    run_for(budget("records") * 0.3, compressed_garbage(), check, chunk=200)


def test_decompress_bombs_are_bounded() -> None:
    """Each codec's bomb (8 MB of zeros) against a 1 MB bound: CorruptRecordError, never the data."""
    for compression in range(1, 5):
        payload = R.compress(compression, bytes(8 << 20))
        try:
            R.decompress(compression, payload, max_size=1 << 20)
        except R.CorruptRecordError:
            continue
        raise AssertionError(f"codec {compression}: 8 MB decompressed past a 1 MB bound")

"""protocol/_batch_scan.c (the header pass of validate_batches) against its Python reference records.scan_batches_py:
the same payload in, the same headers, summary and first fault out, on generated, mutated and hostile payloads."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kbroker.protocol import records as R
from kbroker.protocol.accelerators import PURE_PYTHON_ENV

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_700_000_000_000

compiled = pytest.mark.skipif(
    not R.SCAN_COMPILED,
    reason="protocol/_batch_scan.c not built (python setup.py build_ext --inplace), or "
    f"{PURE_PYTHON_ENV} is set",
)

_record = st.tuples(
    st.none() | st.binary(max_size=20),
    st.none() | st.binary(max_size=60),
    st.just(()),
    st.integers(NOW - 10**6, NOW + 10**6),
)
_INT32 = st.sampled_from([-(2**31), -2, -1, 0, 1, 2, 48, 49, 50, 61, 2**31 - 1]) | st.integers(
    -(2**31), 2**31 - 1
)
_INT64 = st.sampled_from([-(2**63), -1, 0, 1, NOW, 2**63 - 1]) | st.integers(-(2**63), 2**63 - 1)
# Offset in a batch header and struct format of every field scan reads.
_FIELDS = [
    (0, ">q"),
    (8, ">i"),
    (12, ">i"),
    (16, ">b"),
    (17, ">I"),
    (21, ">h"),
    (23, ">i"),
    (27, ">q"),
    (35, ">q"),
    (43, ">q"),
    (51, ">h"),
    (53, ">i"),
    (57, ">i"),
]


@st.composite
def batch(draw: st.DrawFn) -> bytes:
    control = draw(st.booleans())
    return R.build_batch(
        draw(st.lists(_record, min_size=0 if control else 1, max_size=5)),
        compression=draw(st.sampled_from([R.COMPRESSION_NONE, R.COMPRESSION_GZIP, R.COMPRESSION_ZSTD])),
        producer_id=draw(st.sampled_from([-1, 0, 7])),
        producer_epoch=draw(st.sampled_from([-1, 0, 3])),
        base_sequence=draw(st.sampled_from([-1, 0, 2**31 - 2])),
        is_transactional=draw(st.booleans()),
        is_control=control,
        timestamp_type=draw(st.sampled_from([0, 1])),
        partition_leader_epoch=draw(st.sampled_from([-1, 0, 5])),
    )


def _recrc(buf: bytearray, pos: int) -> None:
    """Give the batch at pos a correct CRC again, so that the checks after the CRC are reached."""
    if len(buf) - pos >= R.BATCH_HEADER_SIZE:
        (length,) = struct.unpack_from(">i", buf, pos + 8)
        end = min(len(buf), pos + max(length, 0) + R.LOG_OVERHEAD)
        struct.pack_into(">I", buf, pos + 17, crc32c.crc32c(bytes(buf[pos + 21 : end])))


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    """Valid batches, then header fields set to edge values, bytes flipped, cut or appended, CRCs mended or not."""
    batches = draw(st.lists(batch(), min_size=1, max_size=3))
    buf = bytearray(b"".join(batches))
    starts = [sum(len(b) for b in batches[:i]) for i in range(len(batches))]
    for _ in range(draw(st.integers(0, 4))):
        how = draw(st.integers(0, 3))
        at = draw(st.sampled_from(starts))
        if how == 0:
            off, fmt = draw(st.sampled_from(_FIELDS))
            size = struct.calcsize(fmt)
            value = draw(_INT64 if size == 8 else _INT32)
            lo, hi = (
                (0, 2 ** (8 * size) - 1)
                if fmt[1].isupper()
                else (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1)
            )
            if at + off + size <= len(buf):
                struct.pack_into(fmt, buf, at + off, min(max(value, lo), hi))
        elif how == 1 and buf:
            buf[draw(st.integers(0, len(buf) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif how == 2:
            del buf[draw(st.integers(0, len(buf))) :]
        else:
            buf += draw(st.binary(max_size=80))
        if draw(st.booleans()):
            _recrc(buf, at)
    return bytes(buf)


def _both(buf: bytes, from_client: bool, replicated: bool) -> R.ScanResult:
    py = R.scan_batches_py(buf, from_client, replicated)
    c = R._scan_compiled.scan(buf, from_client, replicated)  # type: ignore[union-attr]
    assert c == py, (buf.hex(), from_client, replicated)
    for (_, hc), (_, hp) in zip(c[0], py[0], strict=True):  # the same class, not only equal fields
        assert type(hc) is type(hp) is R.RecordBatchHeader
    return c


_MODES = st.sampled_from([(True, False), (False, False), (False, True)])


@compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(batch(), min_size=1, max_size=3), _MODES)
def test_valid_batches_give_the_same_headers_and_summary(
    batches: list[bytes], mode: tuple[bool, bool]
) -> None:
    buf = b"".join(batches)
    result = _both(buf, *mode)
    if mode == (False, False) or mode[1]:  # an internal writer or a follower takes every well-formed batch
        assert result[-1] is None and result[2] == len(buf)


@compiled
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile(), _MODES)
def test_hostile_payloads_give_the_same_fault(buf: bytes, mode: tuple[bool, bool]) -> None:
    _both(buf, *mode)


@compiled
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), _MODES)
def test_arbitrary_bytes_give_the_same_fault(buf: bytes, mode: tuple[bool, bool]) -> None:
    _both(buf, *mode)


@compiled
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_crc32c_instruction_and_table_agree_with_the_crc32c_package(data: bytes) -> None:
    ext = R._scan_compiled
    assert ext is not None
    assert ext.crc32c(data) == ext.crc32c(data, True) == crc32c.crc32c(data)


@compiled
def test_scan_takes_any_buffer_and_leaves_it_unchanged() -> None:
    one = R.build_batch([(None, b"v", (), NOW)])
    for buf in (one, bytearray(one), memoryview(one), memoryview(bytearray(one + one))[len(one) :]):
        before = bytes(buf)
        assert _both(buf, True, False)[1] == 1
        assert bytes(buf) == before


@compiled
def test_large_batches_checked_without_the_gil_give_the_same_result() -> None:
    big = R.build_batch(
        [(None, bytes(range(256)) * 1024, (), NOW)] * 2
    )  # 512 KiB: over the GIL-free threshold
    assert len(big) > 64 * 1024
    assert _both(big + big, True, False)[1] == 4
    bad = bytearray(big)
    bad[-1] ^= 0x40
    assert _both(big + bytes(bad), True, False)[-1] == _both(big + bytes(bad), False, False)[-1]
    assert "batch at position" in _both(big + bytes(bad), True, False)[-1][1]


def test_validate_batches_reports_the_first_failing_batch_whichever_check_fails() -> None:
    """A batch whose records are bad before a batch whose header is bad: the records' error, as the one-pass loop
    of Kafka's LogValidator (the header pass runs first now, the walk after it, batch by batch)."""
    bad_records = bytearray(R.build_batch([(None, b"a", (), NOW), (None, b"b", (), NOW)]))
    bad_records[R.BATCH_HEADER_SIZE] = 0x7F  # the first record's length varint: -64
    _recrc(bad_records, 0)
    bad_crc = bytearray(R.build_batch([(None, b"c", (), NOW)]))
    bad_crc[-1] ^= 1
    with pytest.raises(R.InvalidRecordError) as first:
        R.validate_batches(bytes(bad_records + bad_crc))
    assert not isinstance(first.value, R.CorruptRecordError), first.value
    with pytest.raises(R.CorruptRecordError, match="batch at position 0 has CRC"):
        R.validate_batches(bytes(bad_crc + bad_records))


def test_pure_python_switch_selects_the_reference() -> None:
    code = "from kbroker.protocol import records as R; print(R.SCAN_IMPLEMENTATION)"
    env = {
        **os.environ,
        PURE_PYTHON_ENV: "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == f"pure Python ({PURE_PYTHON_ENV} set)"


@st.composite
def plain_batch(draw: st.DrawFn) -> bytes:
    """Mostly the leader's fast-path case (one uncompressed CreateTime batch), sometimes mutated or something else."""
    buf = bytearray(
        R.build_batch(
            draw(st.lists(_record, min_size=1, max_size=5)),
            producer_id=draw(st.sampled_from([-1, 0, 7])),
            producer_epoch=draw(st.sampled_from([-1, 0, 3])),
            base_sequence=draw(st.sampled_from([-1, 0, 2**31 - 2])),
            is_transactional=draw(st.sampled_from([False, False, False, True])),
            timestamp_type=draw(st.sampled_from([0, 0, 0, 1])),
            compression=draw(st.sampled_from([R.COMPRESSION_NONE] * 3 + [R.COMPRESSION_GZIP])),
        )
    )
    how = draw(st.sampled_from([None, None, "field", "flip", "cut", "append", "second"]))
    if how == "field":
        off, fmt = draw(st.sampled_from(_FIELDS))
        size = struct.calcsize(fmt)
        value = draw(_INT64 if size == 8 else _INT32)
        lo, hi = (
            (0, 2 ** (8 * size) - 1)
            if fmt[1].isupper()
            else (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1)
        )
        struct.pack_into(fmt, buf, off, min(max(value, lo), hi))
    elif how == "flip":
        buf[draw(st.integers(0, len(buf) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif how == "cut":
        del buf[draw(st.integers(0, len(buf) - 1)) :]
    elif how == "append":
        buf += draw(st.binary(min_size=1, max_size=80))
    elif how == "second":
        buf += draw(batch())
    if how in ("field", "flip") and draw(st.booleans()):
        _recrc(buf, 0)
    return bytes(buf)


_PLAIN_MODES = st.tuples(
    st.booleans(),
    st.sampled_from([None, (NOW - 1000, NOW + 1000), (NOW - 10**7, NOW + 10**7), (-(2**63), 2**63 - 1)]),
)


def _plain_both(buf: bytes, mode: tuple[bool, tuple[int, int] | None]) -> R.RecordBatchHeader | None:
    py = R.plain_client_batch_py(buf, *mode)
    c = R._plain_compiled(buf, *mode)
    assert c == py, (buf.hex(), mode)
    assert type(c) is type(py)
    return c


compiled_plain = pytest.mark.skipif(
    R.plain_client_batch is R.plain_client_batch_py,
    reason="protocol/_batch_scan.c or _record_walk.c not built",
)


@compiled_plain
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_batch(), _PLAIN_MODES)
def test_plain_batch_agrees_with_its_reference(buf: bytes, mode: tuple[bool, tuple[int, int] | None]) -> None:
    _plain_both(buf, mode)


@compiled_plain
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | hostile(), _PLAIN_MODES)
def test_plain_batch_on_hostile_bytes_agrees_with_its_reference(
    buf: bytes, mode: tuple[bool, tuple[int, int] | None]
) -> None:
    _plain_both(buf, mode)


@compiled_plain
def test_plain_batch_accepts_the_common_batch_and_any_buffer() -> None:
    raw = R.build_batch(
        [(b"k", b"v" * 100, (), NOW + i) for i in range(10)], producer_id=7, producer_epoch=0, base_sequence=0
    )
    for buf in (raw, bytearray(raw), memoryview(bytearray(raw)), memoryview(raw)):
        h = _plain_both(buf, (False, None))
        assert h is not None and (h.records_count, h.producer_id, h.base_sequence) == (10, 7, 0)
    # a key missing on a compacted topic, or a timestamp out of bounds: the general path answers
    assert _plain_both(R.build_batch([(None, b"v", (), NOW)]), (True, None)) is None
    assert _plain_both(raw, (False, (NOW + 100, NOW + 200))) is None
    big = R.build_batch([(b"k", b"v" * 1000, (), NOW)] * 100)  # CRC checked without the GIL
    assert _plain_both(big, (True, (NOW - 1, NOW + 1))) is not None

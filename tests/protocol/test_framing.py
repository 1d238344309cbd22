"""protocol/_frames.c's split against protocol/framing.split_py: the same frames and stopping point for any buffer,
and the connection's use of it (frames split in one call, then the Python loop for what stops the split)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kbroker.protocol import framing

compiled = pytest.mark.skipif(
    not framing.COMPILED,
    reason="protocol/_frames.c not built (python setup.py build_ext --inplace), or "
    "KBROKER_PURE_PYTHON is set",
)

_SIZES = st.sampled_from([-(2**31), -1, 0, 1, 7, 8, 9, 100, 2**31 - 1]) | st.integers(-(2**31), 2**31 - 1)


@st.composite
def stream(draw: st.DrawFn) -> bytes:
    """Frames back to back, some with a size that lies (too small, too large, negative), cut anywhere."""
    out = bytearray(draw(st.binary(max_size=6)))
    for _ in range(draw(st.integers(0, 6))):
        body = draw(st.binary(min_size=8, max_size=40) | st.binary(max_size=8))
        size = draw(st.just(len(body)) | _SIZES)
        out += struct.pack(">i", size) + body
    if draw(st.booleans()):
        del out[draw(st.integers(0, len(out))) :]
    return bytes(out)


def _both(buf: bytes | bytearray, start: int, end: int, max_request: int) -> tuple[list[bytearray], int]:
    py = framing.split_py(buf, start, end, max_request)
    c = framing._compiled.split(buf, start, end, max_request)  # type: ignore[union-attr]
    assert c == py, (bytes(buf).hex(), start, end, max_request)
    assert all(type(f) is bytearray for f in c[0])
    return c


@compiled
@settings(max_examples=250, deadline=None)
@given(stream(), st.data(), st.sampled_from([8, 20, 40, 100 * 1024 * 1024, 2**31 - 1]))
def test_split_agrees_with_its_reference(buf: bytes, data: st.DataObject, max_request: int) -> None:
    start = data.draw(st.integers(0, len(buf)))
    end = data.draw(st.integers(start, len(buf)))
    frames, stop = _both(buf, start, end, max_request)
    _both(bytearray(buf), start, end, max_request)
    _both(memoryview(buf), start, end, max_request)
    # What stops the split is exactly what the connection's loop must handle: fewer than 4 bytes, an incomplete
    # frame, or a size outside [8, max_request].
    assert start + sum(4 + len(f) for f in frames) == stop
    if end - stop >= 4:
        (size,) = struct.unpack_from(">i", buf, stop)
        assert size < 8 or size > max_request or size > end - stop - 4


@compiled
def test_split_refuses_a_range_outside_the_buffer_and_copies_frames() -> None:
    buf = bytearray(struct.pack(">i", 8) + bytes(range(8)) * 2)
    for bad in ((-1, 8), (4, 3), (0, len(buf) + 1)):
        for fn in (framing.split_py, framing._compiled.split):  # type: ignore[union-attr]
            with pytest.raises(ValueError):
                fn(buf, *bad, 100)
    frames, stop = _both(buf, 0, len(buf), 100)
    assert frames == [bytearray(range(8))] and stop == 12
    frames[0][0] = 99  # a private copy: the receive buffer is untouched
    assert buf[4] == 0

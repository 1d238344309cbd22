"""protocol/_produce.c's decode_frame (a whole Produce request frame: header and body in one call) against its Python
reference, produce_codec.decode_frame_py: the same frame in, the same tuple or None out, on generated frames (every
header version, client ids null, empty, long or not UTF-8, header tagged fields), on frames mutated in the header
(truncated, client id lengths that lie, another api key or version, a v1 header under a flexible version and the
reverse) and in the body, and on arbitrary bytes. Where it decodes, it agrees with what the general path reads:
codec.decode_request_header's header and produce_codec.decode's body."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kbroker.broker import produce_codec as pc
from kbroker.protocol import codec
from kbroker.protocol import records as R
from kbroker.protocol.accelerators import PURE_PYTHON_ENV
from kbroker.protocol.messages import ProduceRequest, RequestHeader
from kbroker.protocol.primitives import write_uvarint

from tests.broker.test_produce_codec import produce_frame

P = ProduceRequest
NOW = 1_700_000_000_000
pytestmark = pytest.mark.skipif(
    not pc.COMPILED,
    reason=f"protocol/_produce.c not built (python setup.py build_ext --inplace), or {PURE_PYTHON_ENV} is set",
)
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same(frame: Any) -> Any:
    c = pc._compiled.decode_frame(frame)  # type: ignore[union-attr]
    py = pc.decode_frame_py(frame)
    assert c == py, bytes(frame).hex()
    if c is not None:
        # What the general path reads of the same frame: its header decoder, then the direct body decode.
        header, pos = codec.decode_request_header(frame)
        assert (header.request_api_key, header.request_api_version) == (0, c[1])
        assert (header.correlation_id, header.client_id) == (c[0], c[2])
        assert c[3:] == pc._compiled.decode(frame, pos, c[1])  # type: ignore[union-attr]
        for _, parts in c[6]:
            for _, recs in parts:
                assert isinstance(recs, memoryview) and recs.obj is frame
    return c


_client_id = st.none() | st.sampled_from(["", "bench", "rdkafka", "é" * 3]) | st.text(max_size=40)


def _tagged(draw: st.DrawFn) -> bytes:
    """The header's tagged fields (v2 headers): none mostly, else some unknown tags the decoders skip."""
    fields = draw(st.lists(st.tuples(st.integers(0, 200), st.binary(max_size=6)), max_size=3))
    out = bytearray([len(fields)])
    for tag, data in fields:
        write_uvarint(out, tag)
        out += bytes([len(data)]) + data
    return bytes(out)


@st.composite
def whole_frame(draw: st.DrawFn) -> bytearray:
    """A Produce frame (no size prefix) with its own header: any client id and correlation id, tagged fields in a
    flexible header."""
    frame, pos, version = draw(produce_frame())
    client_id = draw(_client_id)
    encoded = None if client_id is None else client_id.encode()
    head = struct.pack(">hhi", 0, version, draw(st.integers(-(2**31), 2**31 - 1)))
    head += struct.pack(">h", -1) if encoded is None else struct.pack(">h", len(encoded)) + encoded
    if version >= 9:
        head += _tagged(draw)
    return bytearray(head) + frame[pos:]


@given(whole_frame())
@_SETTINGS
def test_decode_frame_agrees_on_generated_frames(frame: bytearray) -> None:
    decoded = _same(frame)
    _same(bytes(frame))
    assert _same(frame + b"\x00\x01") == decoded  # trailing bytes ignored, as the general path does


def test_decode_frame_takes_the_common_request() -> None:
    batch = R.build_batch(
        [(None, b"v" * 100, (), NOW)] * 10, producer_id=3, producer_epoch=0, base_sequence=0
    )
    req = P(
        acks=1,
        timeout_ms=30000,
        topic_data=[
            P.TopicProduceData(name="bench", partition_data=[P.PartitionProduceData(index=0, records=batch)])
        ],
    )
    for version in range(0, 13):
        header = RequestHeader(
            request_api_key=0, request_api_version=version, correlation_id=77, client_id="c"
        )
        frame = bytearray(codec.encode_request(header, req)[4:])
        decoded = _same(frame)
        if not 3 <= version <= 11:
            assert decoded is None  # the general path's versions (and its refusal of v12)
            continue
        assert (
            decoded is not None and decoded[:6] == (77, version, "c", None, 1, 30000) and decoded[7] is None
        )
        assert bytes(decoded[6][0][1][0][1]) == batch
    for key in (1, 3, 18, 0x100, -1):  # another api key: not the Produce frame path's
        frame = bytearray(struct.pack(">h", key)) + frame[2:]
        assert _same(frame) is None


_SPECIAL_INT16 = [-32768, -2, -1, 0, 1, 5, 0x7F, 0x7FFF]


@given(whole_frame(), st.data())
@_SETTINGS
def test_decode_frame_agrees_on_hostile_headers(frame: bytearray, data: st.DataObject) -> None:
    """The header broken: cut anywhere in it, a client id length that lies, bytes of the client id that are not
    UTF-8, another version (a v1 header read as v2 and the reverse), bytes set or flipped, varints inserted."""
    buf = bytearray(frame)
    (n,) = struct.unpack_from(">h", buf, 8)
    header_end = 10 + max(n, 0) + 3
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.integers(0, 6))
        if how == 0:
            del buf[data.draw(st.integers(0, min(len(buf), header_end))) :]
        elif how == 1 and len(buf) >= 10:
            struct.pack_into(">h", buf, 8, data.draw(st.sampled_from(_SPECIAL_INT16 + [n + 1, n - 1])))
        elif how == 2 and len(buf) > 10:
            buf[data.draw(st.integers(10, min(len(buf), header_end) - 1))] = data.draw(
                st.sampled_from([0x80, 0xC0, 0xED, 0xFF])
            )
        elif how == 3 and len(buf) >= 4:
            struct.pack_into(">h", buf, 2, data.draw(st.sampled_from([-1, 0, 2, 3, 8, 9, 11, 12, 0x7FFF])))
        elif how == 4 and len(buf) > 0:
            buf[data.draw(st.integers(0, min(len(buf), header_end) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        elif how == 5:
            at = data.draw(st.integers(min(len(buf), 8), min(len(buf), header_end)))
            buf[at:at] = data.draw(
                st.sampled_from([b"\xff" * 5, b"\x80\x80\x80\x80\x80\x01", b"\x01\x05\x7f", b"\x00"])
            )
        elif len(buf) >= 8:
            struct.pack_into(">i", buf, 4, data.draw(st.sampled_from([-(2**31), -1, 0, 2**31 - 1])))
    _same(buf)


@given(whole_frame(), st.data())
@_SETTINGS
def test_decode_frame_agrees_on_hostile_bodies(frame: bytearray, data: st.DataObject) -> None:
    buf = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.integers(0, 2))
        if how == 0:
            del buf[data.draw(st.integers(0, len(buf))) :]
        elif how == 1 and buf:
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(
                st.sampled_from([0, 1, 0x7F, 0x80, 0xFF])
            )
        elif len(buf) >= 4:
            at = data.draw(st.integers(0, len(buf) - 4))
            struct.pack_into(">i", buf, at, data.draw(st.sampled_from([-(2**31), -1, 0, 1, 2**31 - 1])))
    _same(buf)


@given(
    st.binary(max_size=120),
    st.sampled_from([b"", b"\x00\x00\x00\x03", b"\x00\x00\x00\x09", b"\x00\x00\x00\x0b"]),
)
@_SETTINGS
def test_decode_frame_agrees_on_arbitrary_bytes(data: bytes, prefix: bytes) -> None:
    _same(bytearray(prefix + data))
    _same(prefix + data)


def test_decode_frame_refuses_what_is_not_a_byte_buffer() -> None:
    for bad in (None, 3, "abc", [0, 0]):
        with pytest.raises(TypeError):
            pc._compiled.decode_frame(bad)  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        pc._compiled.decode_frame(memoryview(bytearray(16)).cast("I"))  # type: ignore[union-attr]


def test_decode_frame_names_each_request_its_own_strings() -> None:
    """Topic names and client ids are kept from the previous request with the same bytes (a producer repeats them):
    a name of the same length but other bytes, one longer than what is kept, bytes that are not UTF-8 after a valid
    name of the same length, and back, each decode to their own string, as the reference does."""
    batch = R.build_batch([(None, b"v", (), NOW)])
    names = ["abc", "abd", "abc", "n" * 70, "n" * 69 + "m", "n" * 70, "é", "\u00e8", "", "abc"]
    clients = ["c", "d", None, "", "c" * 80, "c" * 79 + "d", "c", "c", "ä", "c"]
    for name, client in zip(names, clients, strict=True):
        req = P(
            acks=1,
            timeout_ms=1,
            topic_data=[
                P.TopicProduceData(name=name, partition_data=[P.PartitionProduceData(index=0, records=batch)])
            ],
        )
        header = RequestHeader(request_api_key=0, request_api_version=9, correlation_id=1, client_id=client)
        frame = bytearray(codec.encode_request(header, req)[4:])
        decoded = _same(frame)
        assert decoded is not None and decoded[2] == client and decoded[6][0][0] == name
        bad = bytearray(frame)
        at = bytes(bad).index(name.encode(), 12) if name else None
        if at is not None:
            bad[at] = 0xFF  # the same length, not UTF-8: the general path refuses it
            assert _same(bad) is None

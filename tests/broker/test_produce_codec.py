"""protocol/_produce.c (the direct Produce decode and response encode) against its Python references in
broker/produce_codec.py: the same frame in, the same tuples or None out, on generated, mutated and hostile
requests; the same response bytes for the same answers, which are also what the generated encoder writes."""

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
from kbroker.protocol.messages import ProduceRequest, ProduceResponse, RequestHeader

from tests.txn_support import produce_request

NOW = 1_700_000_000_000
P = ProduceRequest

compiled = pytest.mark.skipif(
    not pc.COMPILED,
    reason=f"protocol/_produce.c not built (python setup.py build_ext --inplace), or {PURE_PYTHON_ENV} is set",
)
pytestmark = compiled

_SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_record = st.tuples(st.none() | st.binary(max_size=8), st.binary(max_size=40), st.just(()), st.just(NOW))


@st.composite
def records(draw: st.DrawFn) -> bytes | None:
    """Mostly the common case (one plain or transactional batch; the transactional ones of two producers or
    epochs now and then), else what sends a request the general way: two batches, zstd, a legacy magic, a partial
    batch after it (transactional or not), cut short, null."""
    kind = draw(
        st.sampled_from(
            ["plain"] * 6 + ["txn"] * 3 + ["two", "zstd", "magic1", "tail", "cut", "null", "empty"]
        )
    )
    if kind == "null":
        return None
    if kind == "empty":
        return b""
    idempotent = draw(st.booleans())
    one = R.build_batch(
        draw(st.lists(_record, min_size=1, max_size=3)),
        compression=R.COMPRESSION_GZIP if draw(st.booleans()) else R.COMPRESSION_NONE,
        producer_id=draw(st.sampled_from([7, 7, 7, 8])) if kind == "txn" else 7 if idempotent else -1,
        producer_epoch=draw(st.sampled_from([0, 0, 0, 1])) if kind == "txn" else 0 if idempotent else -1,
        base_sequence=0 if idempotent or kind == "txn" else -1,
        is_transactional=kind == "txn",
    )
    if kind == "two":
        return one + one
    if kind == "zstd":  # the codec bits only: validateRecords refuses it below v7 before anything reads it
        buf = bytearray(one)
        buf[22] = (buf[22] & ~R.ATTR_COMPRESSION_MASK) | R.COMPRESSION_ZSTD
        return bytes(buf)
    if kind == "magic1":
        buf = bytearray(one)
        buf[16] = draw(st.sampled_from([0, 1, 3, 0xFF]))
        return bytes(buf)
    if kind == "tail":
        txn = R.build_batch(
            [(None, b"x", (), NOW)],
            producer_id=9,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=draw(st.booleans()),
        )
        return one + txn[: draw(st.integers(0, len(txn) - 1))]
    if kind == "cut":
        return one[: draw(st.integers(0, len(one) - 1))]
    return one


_name = st.text(min_size=0, max_size=6) | st.sampled_from(["bench", "t", "é"])


@st.composite
def produce_frame(draw: st.DrawFn) -> tuple[bytearray, int, int]:
    """A whole Produce request frame (header and body, no size prefix), the body's position and its version."""
    version = draw(st.integers(3, 11))
    topics = draw(
        st.lists(st.tuples(_name, st.lists(st.tuples(st.integers(-1, 5), records()), max_size=3)), max_size=3)
    )
    req = P(
        transactional_id=draw(st.none() | st.sampled_from(["tx", ""])),
        acks=draw(st.sampled_from([-1, 0, 1, 2])),
        timeout_ms=draw(st.integers(-(2**31), 2**31 - 1)),
        topic_data=[
            P.TopicProduceData(
                name=n, partition_data=[P.PartitionProduceData(index=i, records=r) for i, r in parts]
            )
            for n, parts in topics
        ],
    )
    header = RequestHeader(request_api_key=0, request_api_version=version, correlation_id=5, client_id="c")
    frame = codec.encode_request(header, req)[4:]
    _, pos = codec.decode_request_header(frame)
    return bytearray(frame), pos, version


def _same(frame: Any, pos: int, version: int) -> Any:
    c = pc._compiled.decode(frame, pos, version)  # type: ignore[union-attr]
    py = pc.decode_py(frame, pos, version)
    assert c == py, (version, bytes(frame).hex())
    if c is not None:
        for _, parts in c[3]:
            for _, recs in parts:
                # Views of the frame itself (the log rewrites base offsets in place in a writable frame).
                assert isinstance(recs, memoryview) and recs.obj is frame
                assert recs.readonly == isinstance(frame, bytes)
    return c


@given(produce_frame())
@_SETTINGS
def test_decode_agrees_on_generated_requests(case: tuple[bytearray, int, int]) -> None:
    frame, pos, version = case
    decoded = _same(frame, pos, version)
    _same(bytes(frame), pos, version)
    # Trailing bytes are ignored, as the general path ignores them.
    assert _same(frame + b"\x00\x01\x02", pos, version) == decoded


def test_decode_takes_the_common_request() -> None:
    batch = R.build_batch(
        [(None, b"v" * 100, (), NOW)] * 10, producer_id=3, producer_epoch=0, base_sequence=0
    )
    for version in range(3, 12):
        req = P(
            acks=1,
            timeout_ms=30000,
            topic_data=[
                P.TopicProduceData(
                    name="bench", partition_data=[P.PartitionProduceData(index=0, records=batch)]
                )
            ],
        )
        header = RequestHeader(
            request_api_key=0, request_api_version=version, correlation_id=1, client_id="c"
        )
        frame = bytearray(codec.encode_request(header, req)[4:])
        _, pos = codec.decode_request_header(frame)
        decoded = _same(frame, pos, version)
        assert decoded is not None and decoded[:3] == (None, 1, 30000) and decoded[4] is None
        assert decoded[3][0][0] == "bench" and bytes(decoded[3][0][1][0][1]) == batch
    assert pc.decode(frame, pos, 2) is None and pc.decode(frame, pos, 12) is None


def _frame(txn_id: str | None, partitions: list[bytes], version: int = 9) -> tuple[bytearray, int]:
    req = produce_request(txn_id, "t", list(enumerate(partitions)))
    header = RequestHeader(request_api_key=0, request_api_version=version, correlation_id=1, client_id="c")
    frame = bytearray(codec.encode_request(header, req)[4:])
    _, pos = codec.decode_request_header(frame)
    return frame, pos


def test_decode_names_the_producer_of_transactional_batches() -> None:
    """Transactional batches of one producer take the direct path, with that producer named for the handler's
    checks; two producers (or epochs), or a transactional header after a partition's first batch, do not."""

    def txn(pid: int, epoch: int, seq: int = 0, codec_: int = R.COMPRESSION_NONE) -> bytes:
        return R.build_batch(
            [(None, b"v" * 20, (), NOW)] * 3,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            is_transactional=True,
            compression=codec_,
        )

    plain = R.build_batch([(None, b"v", (), NOW)], producer_id=7, producer_epoch=3, base_sequence=0)
    frame, pos = _frame("tx", [txn(7, 3), txn(7, 3, 5, R.COMPRESSION_GZIP), plain])
    decoded = _same(frame, pos, 9)
    assert decoded is not None and decoded[0] == "tx" and decoded[4] == (7, 3)
    frame, pos = _frame(None, [txn(2**62, 0)])  # no transactional id: still decoded, the handler refuses it
    assert _same(frame, pos, 9)[4] == (2**62, 0)
    for partitions in ([txn(7, 3), txn(8, 3)], [txn(7, 3), txn(7, 4)], [plain + txn(7, 3)[:70]]):
        frame, pos = _frame("tx", partitions)
        assert _same(frame, pos, 9) is None


@st.composite
def txn_records(draw: st.DrawFn) -> bytes:
    """A transactional producer's partition: its batch (of one of two producers, at one of two epochs), a plain
    idempotent one, or one with a partial transactional header after it."""
    kind = draw(st.sampled_from(["txn"] * 4 + ["plain", "tail"]))
    batch = R.build_batch(
        draw(st.lists(_record, min_size=1, max_size=3)),
        compression=draw(st.sampled_from([R.COMPRESSION_NONE, R.COMPRESSION_GZIP])),
        producer_id=draw(st.sampled_from([7, 7, 7, 8])),
        producer_epoch=draw(st.sampled_from([0, 0, 0, 1])),
        base_sequence=draw(st.integers(0, 9)),
        is_transactional=kind == "txn",
    )
    if kind == "tail":
        tail = R.build_batch(
            [(None, b"x" * 20, (), NOW)],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
        return batch + tail[: draw(st.integers(R.BATCH_HEADER_SIZE, len(tail) - 1))]
    return batch


@given(st.none() | st.just("tx"), st.lists(txn_records(), min_size=1, max_size=3), st.integers(3, 11))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decode_agrees_on_transactional_requests(
    txn_id: str | None, partitions: list[bytes], version: int
) -> None:
    frame, pos = _frame(txn_id, partitions, version)
    decoded = _same(frame, pos, version)
    producers = {struct.unpack_from(">qh", r, 43) for r in partitions if r[22] & R.ATTR_TRANSACTIONAL}
    if decoded is not None:
        assert decoded[4] == (next(iter(producers)) if producers else None)
        assert len(producers) <= 1


_SPECIAL_INT32 = [-(2**31), -2, -1, 0, 1, 0x7FFF, 0x8000, 2**31 - 1]


@given(produce_frame(), st.data())
@_SETTINGS
def test_decode_agrees_on_hostile_requests(case: tuple[bytearray, int, int], data: st.DataObject) -> None:
    frame, pos, version = case
    buf = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        how = data.draw(st.integers(0, 4))
        if how == 0 and len(buf) > pos:
            del buf[data.draw(st.integers(pos, len(buf) - 1)) :]  # truncated
        elif how == 1 and len(buf) > pos:
            buf[data.draw(st.integers(pos, len(buf) - 1))] = data.draw(
                st.sampled_from([0, 1, 0x7F, 0x80, 0xFE, 0xFF])
            )
        elif how == 2 and len(buf) - pos >= 4:
            at = data.draw(st.integers(pos, len(buf) - 4))
            struct.pack_into(
                ">i", buf, at, data.draw(st.sampled_from(_SPECIAL_INT32))
            )  # huge or negative lengths
        elif how == 3:
            at = data.draw(st.integers(pos, len(buf)))
            buf[at:at] = data.draw(
                st.sampled_from([b"\xff" * 5, b"\x80\x80\x80\x80\x80\x01", b"\x7f\xff", b"\x00"])
            )
        elif len(buf) > pos:
            buf[data.draw(st.integers(pos, len(buf) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    _same(buf, pos, version)
    _same(buf, data.draw(st.integers(-2, len(buf) + 2)), version)


@given(st.binary(max_size=200), st.integers(0, 12))
@_SETTINGS
def test_decode_agrees_on_arbitrary_bytes(data: bytes, version: int) -> None:
    _same(bytearray(data), 0, version)


_INT64 = st.sampled_from([-(2**63), -1, 0, 1, NOW, 2**63 - 1]) | st.integers(-(2**63), 2**63 - 1)
_answer = st.tuples(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([0, 1, 2, 3, 6, 10, 47, 87, -1, 2**15 - 1]),
    _INT64,
    _INT64,
    _INT64,
    st.none() | st.text(max_size=20),
    st.none()
    | st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.none() | st.text(max_size=10)), max_size=3),
)


@given(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(3, 11),
    st.integers(0, 2**31 - 1),
    st.lists(st.tuples(_name, st.lists(_answer, max_size=3)), max_size=3),
)
@_SETTINGS
def test_encode_agrees(correlation_id: int, version: int, throttle: int, answers: Any) -> None:
    c = pc._compiled.encode_response(correlation_id, version, throttle, answers)  # type: ignore[union-attr]
    assert type(c) is bytearray
    assert c == pc.encode_response_py(correlation_id, version, throttle, answers)
    # ... which is the generated codec's frame, and decodes back to the answers.
    corr, body = codec.decode_response(0, version, bytes(c[4:]))
    assert corr == correlation_id and body.throttle_time_ms == throttle
    assert len(body.responses) == len(answers)
    for (name, parts), t in zip(answers, body.responses, strict=True):
        assert t.name == name
        for a, p in zip(parts, t.partition_responses, strict=True):
            assert (p.index, p.error_code, p.base_offset, p.log_append_time_ms) == a[:4]
            if version >= 5:
                assert p.log_start_offset == a[4]
            if version >= 8:
                assert p.error_message == a[5]
                assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == list(
                    a[6] or ()
                )


def test_encode_is_the_generated_frame() -> None:
    R_ = ProduceResponse
    answers = [("t", [(0, 0, 41, -1, 0, None, None), (1, 87, -1, -1, 3, "bad", [(2, "no key")])])]
    for version in range(3, 12):
        body = pc.response_of(answers, 7, codec.tagged_default(R_.LeaderIdAndEpoch))
        assert pc._compiled.encode_response(9, version, 7, answers) == codec.encode_response(
            9, 0, version, body
        )  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "args, error",
    [
        ((1, 2, 0, []), ValueError),
        ((1, 12, 0, []), ValueError),
        ((1, 9, 0, ("t", [])), TypeError),
        ((1, 9, 0, [("t", [(0, 0, 0, 0, 0, None)])]), TypeError),
        ((1, 9, 0, [("t", [(2**31, 0, 0, 0, 0, None, None)])]), OverflowError),
        ((1, 9, 0, [("t", [(0, 2**15, 0, 0, 0, None, None)])]), OverflowError),
        ((1, 9, 0, [(None, [])]), TypeError),
        ((2**31, 9, 0, []), OverflowError),
    ],
)
def test_encode_refuses_bad_answers(args: tuple[Any, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        pc._compiled.encode_response(*args)  # type: ignore[union-attr]

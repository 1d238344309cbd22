"""broker/replica_fetch_codec.py against the generated codec, the reference: the follower's request bytes, the
decode of a leader's answer (equal fields, or None for what the generated decoder must read) and the leader's answer
to a follower (equal frames and file regions), on generated inputs and on hostile bytes. The real clusters of
tests/coordinator/test_replication_data.py run both paths end to end."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kbroker.broker.replica_fetch_codec import (
    FETCH_VERSION,
    decode_fetch_response,
    encode_fetch_answer,
    encode_fetch_request,
)
from kbroker.broker.replica_fetcher import _request_objects
from kbroker.protocol import codec
from kbroker.protocol.messages import FetchResponse, RequestHeader
from kbroker.storage.file_handles import OpenFile
from kbroker.storage.segment import FileRecordsSlice

R = FetchResponse
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(min_size=0, max_size=300)
entries = st.tuples(i32, i32, i64, i32, i64, i32)


@settings(max_examples=300, deadline=None)
@given(
    correlation_id=st.integers(0, 2**31 - 1),
    client_id=st.text(max_size=40),
    fixed=st.tuples(i32, i32, i32, i32),
    session=st.tuples(i32, i32),
    topics=st.dictionaries(names, st.lists(entries, max_size=4), max_size=4),
    forgotten=st.dictionaries(names, st.lists(i32, max_size=200), max_size=3),
)
def test_request_bytes_equal_the_generated_encoders(
    correlation_id: int,
    client_id: str,
    fixed: tuple[int, int, int, int],
    session: tuple[int, int],
    topics: dict[str, list[tuple[int, ...]]],
    forgotten: dict[str, list[int]],
) -> None:
    replica_id, max_wait, min_bytes, max_bytes = fixed
    header = RequestHeader(
        request_api_key=1,
        request_api_version=FETCH_VERSION,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    reference = codec.encode_request(
        header, _request_objects(replica_id, max_wait, min_bytes, max_bytes, *session, topics, forgotten)
    )  # type: ignore[arg-type]
    direct = encode_fetch_request(
        correlation_id,
        client_id.encode(),
        replica_id,
        max_wait,
        min_bytes,
        max_bytes,
        *session,
        list(topics.items()),
        list(forgotten.items()),
    )  # type: ignore[arg-type]
    assert bytes(direct) == bytes(reference)


# A partition of an answer: the common case, or one the direct decode must leave to the generated decoder.
common_partitions = st.builds(
    lambda index, hw, lso, start, records, empty_aborted: R.PartitionData(
        partition_index=index,
        error_code=0,
        high_watermark=hw,
        last_stable_offset=lso,
        log_start_offset=start,
        aborted_transactions=[] if empty_aborted else None,
        preferred_read_replica=-1,
        records=records,
    ),
    i32,
    i64,
    i64,
    i64,
    st.one_of(st.none(), st.binary(max_size=300)),
    st.booleans(),
)
unusual_partitions = st.one_of(
    st.builds(
        lambda index, code: R.PartitionData(partition_index=index, error_code=code, records=b""),
        i32,
        st.integers(1, 120),
    ),
    st.builds(
        lambda epoch, end: R.PartitionData(
            diverging_epoch=R.EpochEndOffset(epoch=epoch, end_offset=end), records=b""
        ),
        i32,
        i64,
    ),
    st.builds(
        lambda pid: R.PartitionData(
            aborted_transactions=[R.AbortedTransaction(producer_id=pid, first_offset=1)]
        ),
        i64,
    ),
    st.builds(
        lambda leader: R.PartitionData(current_leader=R.LeaderIdAndEpoch(leader_id=leader, leader_epoch=3)),
        i32,
    ),
)


def _answer(topics: list[tuple[str, list[R.PartitionData]]], session_id: int, error: int) -> bytes:
    body = R(
        throttle_time_ms=0,
        error_code=error,
        session_id=session_id,
        responses=[R.FetchableTopicResponse(topic=t, partitions=ps) for t, ps in topics],
    )
    frame = codec.encode_response(1234, 1, FETCH_VERSION, body)
    return bytes(frame[4:])


def _reference_fields(frame: bytes) -> tuple[int, list[tuple[str, int, int, int, bytes | None]]]:
    _, resp = codec.decode_response(1, FETCH_VERSION, frame)
    return resp.session_id, [
        (
            t.topic,
            pd.partition_index,
            pd.high_watermark,
            pd.log_start_offset,
            bytes(pd.records) if pd.records else None,
        )
        for t in resp.responses
        for pd in t.partitions
    ]


def _fields(
    decoded: tuple[int, list[tuple[str, int, int, int, memoryview | None]]],
) -> tuple[int, list[tuple[str, int, int, int, bytes | None]]]:
    session_id, parts = decoded
    return session_id, [(t, p, hw, start, bytes(r) if r else None) for t, p, hw, start, r in parts]


@settings(max_examples=300, deadline=None)
@given(topics=st.lists(st.tuples(names, st.lists(common_partitions, max_size=4)), max_size=4), session_id=i32)
def test_direct_decode_equals_the_generated_decoders_fields(
    topics: list[tuple[str, list[R.PartitionData]]], session_id: int
) -> None:
    frame = _answer(topics, session_id, 0)
    decoded = decode_fetch_response(frame)
    assert decoded is not None
    assert _fields(decoded) == _reference_fields(frame)


@settings(max_examples=200, deadline=None)
@given(
    before=st.lists(common_partitions, max_size=3),
    odd=unusual_partitions,
    after=st.lists(common_partitions, max_size=3),
    session_id=i32,
)
def test_an_unusual_partition_leaves_the_answer_to_the_generated_decoder(
    before: list[R.PartitionData], odd: R.PartitionData, after: list[R.PartitionData], session_id: int
) -> None:
    assert decode_fetch_response(_answer([("t", [*before, odd, *after])], session_id, 0)) is None


@given(code=st.integers(1, 120), session_id=i32)
def test_an_error_for_the_whole_fetch_leaves_it_to_the_generated_decoder(code: int, session_id: int) -> None:
    assert decode_fetch_response(_answer([], session_id, code)) is None


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_hostile_bytes_decode_to_none_or_to_what_the_generated_decoder_reads(data: bytes) -> None:
    decoded = decode_fetch_response(data)
    if decoded is None:
        return
    assert _fields(decoded) == _reference_fields(data)


@settings(max_examples=200, deadline=None)
@given(
    topics=st.lists(st.tuples(names, st.lists(common_partitions, max_size=4)), max_size=4),
    session_id=i32,
    cut=st.integers(0, 400),
)
def test_a_truncated_or_extended_answer_is_refused_or_read_the_same(
    topics: list[tuple[str, list[R.PartitionData]]], session_id: int, cut: int
) -> None:
    frame = _answer(topics, session_id, 0)
    for hostile in (frame[:cut], frame + b"\0" * (cut % 5 + 1)):
        decoded = decode_fetch_response(hostile)
        if decoded is not None:
            assert _fields(decoded) == _reference_fields(hostile)


file_or_bytes = st.one_of(st.none(), st.binary(max_size=200), st.integers(0, 4096))


@settings(max_examples=200, deadline=None)
@given(
    correlation_id=st.integers(0, 2**31 - 1),
    session_id=i32,
    topics=st.lists(
        st.tuples(names, st.lists(st.tuples(i32, i64, i64, i64, file_or_bytes), max_size=4)), max_size=3
    ),
)
def test_the_leaders_answer_equals_the_generated_encoders(
    correlation_id: int, session_id: int, topics: list[tuple[str, list[tuple[Any, ...]]]]
) -> None:
    # Records are bytes, none, or a region of a real file (an int here: that many bytes of it), as a segment read.
    with tempfile.TemporaryFile() as f:
        f.write(os.urandom(4096))
        f.flush()
        opened = OpenFile(os.dup(f.fileno()))

        def records(r: Any) -> Any:
            return FileRecordsSlice(opened, 4096 - r, r) if isinstance(r, int) else r

        parts = [(t, [(p, hw, lso, start, records(r)) for p, hw, lso, start, r in ps]) for t, ps in topics]
        body = R(
            throttle_time_ms=0,
            error_code=0,
            session_id=session_id,
            responses=[
                R.FetchableTopicResponse(
                    topic=t,
                    partitions=[
                        R.PartitionData(
                            partition_index=p,
                            error_code=0,
                            high_watermark=hw,
                            last_stable_offset=lso,
                            log_start_offset=start,
                            preferred_read_replica=-1,
                            records=r,
                        )
                        for p, hw, lso, start, r in ps
                    ],
                )
                for t, ps in parts
            ],
        )
        ext_ref: list[tuple[int, Any]] = []
        reference = codec.encode_response(correlation_id, 1, FETCH_VERSION, body, ext_ref)
        frame, ext = encode_fetch_answer(correlation_id, session_id, parts)
        assert bytes(frame) == bytes(reference)
        assert [(o, r.position, r.size) for o, r in ext] == [(o, r.position, r.size) for o, r in ext_ref]

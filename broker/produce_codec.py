"""The Produce request's direct decode and response encode (protocol/_produce.c) and their Python references.

The common Produce request (v3+, every partition one valid batch, the transactional ones of one producer) is
decoded straight into the tuples the handler needs and answered by a direct encoder, skipping the message objects,
the per-partition checks of handle_produce that could find nothing in it (the transactional ones are made on the
producer the decode returns) and the generic response build and encode. The references below
define what the compiled functions must return (tests/broker/test_produce_codec.py compares them); the broker uses
the direct path only when the C module is loaded, and the general path (messages, checks, codec) otherwise.
"""

from __future__ import annotations

import struct
from typing import Any

from kbroker.broker.produce_validation import validate_records
from kbroker.protocol import accelerators, codec
from kbroker.protocol.messages import ProduceRequest, ProduceResponse, RequestHeader
from kbroker.protocol.records import ATTR_TRANSACTIONAL, BATCH_HEADER_SIZE, LOG_OVERHEAD

MIN_VERSION, MAX_VERSION = 3, 11

# (index, error_code, base_offset, log_append_time_ms, log_start_offset, error_message, record_errors)
PartitionAnswer = tuple[int, int, int, int, int, "str | None", "list[tuple[int, str | None]] | None"]
TopicAnswers = list[tuple[str, list[PartitionAnswer]]]
# (transactional_id, acks, timeout_ms, [(name, [(index, records)])], (producer_id, producer_epoch) of the
# transactional batches or None)
DecodedProduce = tuple["str | None", int, int, list[tuple[str, list[tuple[int, Any]]]], "tuple[int, int] | None"]
# (correlation_id, version, client_id) + DecodedProduce: a whole request frame's header and body
DecodedFrame = tuple[int, int, "str | None", "str | None", int, int, list[tuple[str, list[tuple[int, Any]]]],
                     "tuple[int, int] | None"]

_compiled = accelerators.load("_produce")
COMPILED = _compiled is not None
IMPLEMENTATION = accelerators.describe("_produce", _compiled)

_Topic = ProduceResponse.TopicProduceResponse
_Part = ProduceResponse.PartitionProduceResponse
_Err = ProduceResponse.BatchIndexAndErrorMessage
_MAGIC = 16
_TXN_BYTE = 22  # the low byte of the attributes (int16 at 21)
_SIZE = struct.Struct(">i")
_PRODUCER = struct.Struct(">qh")  # a batch's producer id and epoch, at 43
_PRODUCER_AT = 43
_PY_DECODE_ERRORS = (codec.DecodeError, struct.error, IndexError, OverflowError, MemoryError, ValueError)


def transactional_headers(records: Any) -> list[int]:
    """Positions of the batch headers handle_produce's transactional scan reads as transactional: it steps by
    each batch's length while a whole header remains, as Kafka's ReplicaManager reads producer ids."""
    found = []
    pos, end = 0, len(records)
    while end - pos >= BATCH_HEADER_SIZE:
        if records[pos + _MAGIC] == 2 and records[pos + _TXN_BYTE] & ATTR_TRANSACTIONAL:
            found.append(pos)
        (size,) = _SIZE.unpack_from(records, pos + 8)
        if size <= 0:
            break
        pos += size + LOG_OVERHEAD
    return found


def direct_records(version: int, records: Any) -> tuple[int, int] | None | bool:
    """False unless validateRecords passes and no header handle_produce's transactional scans read is
    transactional but the first; else the first batch's (producer id, epoch) when it is transactional, or None."""
    if records is None or validate_records(version, records) is not None:
        return False
    found = transactional_headers(records)
    if not found:
        return None
    if found != [0]:
        return False
    producer: tuple[int, int] = _PRODUCER.unpack_from(records, _PRODUCER_AT)
    return producer


def decode_py(frame: Any, pos: int, version: int) -> DecodedProduce | None:
    """The reference of _produce.decode: the generated decoder's request as tuples and the producer of its
    transactional batches, None for anything but the common case (a refused partition, transactional batches of two
    producers or after a partition's first batch, a null name or records, bytes that do not decode)."""
    if not MIN_VERSION <= version <= MAX_VERSION or not 0 <= pos <= len(frame):
        return None
    try:
        req, _ = codec.py_decoder(ProduceRequest, version)(frame, pos)
    except _PY_DECODE_ERRORS:
        return None
    topics = []
    producer = None
    for t in req.topic_data:
        if t.name is None:
            return None
        parts = []
        for p in t.partition_data:
            found = direct_records(version, p.records)
            if found is False:
                return None
            if found is not None:
                if producer is not None and producer != found:
                    return None  # two producers: INVALID_PRODUCER_ID_MAPPING, the general path's answer
                producer = found
            parts.append((p.index, p.records))
        topics.append((t.name, parts))
    return req.transactional_id, req.acks, req.timeout_ms, topics, producer


_KEY_AND_VERSION = struct.Struct(">hh")
PRODUCE_KEY = 0
FLEXIBLE_VERSION = 9  # request header v2 (tagged fields) from here, v1 before


def decode_frame_py(frame: Any) -> DecodedFrame | None:
    """The reference of _produce.decode_frame: a whole Produce request frame (without its size) decoded in one call,
    the request header as the general path's decoder reads it (codec.decode_request_header) and then decode_py's
    body; None for another api key, a version decode_py does not serve, a header that does not decode, or a body
    decode_py answers None for. The general path then decides, as it does for a request the direct path hands on."""
    if len(frame) < 8:
        return None
    api_key, version = _KEY_AND_VERSION.unpack_from(frame, 0)
    if api_key != PRODUCE_KEY or not MIN_VERSION <= version <= MAX_VERSION:
        return None
    try:
        header, pos = codec.py_decoder(RequestHeader, 2 if version >= FLEXIBLE_VERSION else 1)(frame, 0)
    except _PY_DECODE_ERRORS:
        return None
    body = decode_py(frame, pos, version)
    if body is None:
        return None
    return (header.correlation_id, version, header.client_id, *body)


def response_of(answers: TopicAnswers, throttle_ms: int, current_leader: Any) -> ProduceResponse:
    """The message the answers stand for; current_leader: the tagged field's default object."""
    topics = []
    for name, parts in answers:
        responses = []
        for index, code, base, append_time, log_start, message, errors in parts:
            responses.append(
                _Part(
                    index=index,
                    error_code=code,
                    base_offset=base,
                    log_append_time_ms=append_time,
                    log_start_offset=log_start,
                    error_message=message,
                    current_leader=current_leader,
                    record_errors=[_Err(batch_index=i, batch_index_error_message=m) for i, m in errors]
                    if errors
                    else [],
                )
            )
        topics.append(_Topic(name=name, partition_responses=responses))
    return ProduceResponse(throttle_time_ms=throttle_ms, responses=topics)


def encode_response_py(
    correlation_id: int, version: int, throttle_ms: int, answers: TopicAnswers
) -> bytearray:
    """The reference of _produce.encode_response: the generated encoder's frame for the same response."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"encode_response: Produce v{version} is not encoded here")
    body = response_of(answers, throttle_ms, codec.tagged_default(ProduceResponse.LeaderIdAndEpoch))
    out = bytearray(8)
    struct.pack_into(">i", out, 4, correlation_id)
    if version >= 9:
        out.append(0)
    codec.py_encoder(ProduceResponse, version)(body, out, None)
    struct.pack_into(">i", out, 0, len(out) - 4)
    return out


decode = _compiled.decode if _compiled is not None else decode_py
decode_frame = _compiled.decode_frame if _compiled is not None else decode_frame_py
encode_response = _compiled.encode_response if _compiled is not None else encode_response_py

"""Replication's Fetch v12 without the generated message objects: the follower's request written and the leader's
answer read, and on the leader the answer to a follower written, straight from and into bytes.

Per replication round a follower builds one incremental Fetch (one or two partitions moved) and applies one answer;
the generated classes cost a FetchRequest, a FetchTopic and a FetchPartition per request, a FetchResponse, a topic
and a PartitionData with its three tagged structs per answer, and both generated codecs walking them: about a fifth
of a follower's CPU per round (docs/performance.md). The functions here cover the common case only and say so by
returning None for anything else (an error at any level, a diverging epoch or any other tagged field, aborted
transactions, bytes that do not parse): the caller then uses the generated codec, the reference, on the same bytes.
tests/broker/test_replica_fetch_codec.py compares both on generated inputs.
"""

from __future__ import annotations

import struct
from typing import Any

from kbroker.protocol.primitives import read_uvarint, write_uvarint

FETCH_VERSION = 12  # the fetcher's (replica_fetcher.FETCH_VERSION): replica_id in the body, topics by name

# A request's partition as the fetcher keeps it: (partition, current_leader_epoch, fetch_offset, last_fetched_epoch,
# log_start_offset, partition_max_bytes), FetchRequest.FetchPartition's v12 fields in their order.
Entry = tuple[int, int, int, int, int, int]
# What the direct decode gives per partition: (topic, partition, high_watermark, log_start_offset, records or None).
Fetched = tuple[str, int, int, int, memoryview | None]

_REQ_HEAD = struct.Struct(">ihhih")  # size, api key, version, correlation id, client id length
# replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level, session id and epoch
_BODY_HEAD = struct.Struct(">iiiibii")
_PARTITION = struct.Struct(">iiqiqi")
_I32 = struct.Struct(">i")
_RESP_HEAD = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
# partition_index, error_code, high_watermark, last_stable_offset, log_start_offset
_PART_HEAD = struct.Struct(">ihqqq")
_ANSWER_HEAD = struct.Struct(">iiBihi")  # size, correlation id, header tags, throttle, error, session id
_PART_FIELDS = struct.Struct(">ihqqqBi")  # ... log_start_offset, aborted (length), preferred_read_replica


def _put_uv(out: bytearray, n: int) -> None:
    if n < 0x80:
        out.append(n)  # every count and length of a follower's fetch: no call
    else:
        write_uvarint(out, n)


def _put_compact_string(out: bytearray, s: str) -> None:
    b = s.encode()
    _put_uv(out, len(b) + 1)
    out += b


def encode_fetch_request(
    correlation_id: int,
    client_id: bytes,
    replica_id: int,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    session_id: int,
    session_epoch: int,
    topics: list[tuple[str, list[Entry]]],
    forgotten: list[tuple[str, list[int]]],
) -> bytearray:
    """A size-prefixed Fetch v12 request frame (request header v2), byte for byte what codec.encode_request writes
    for the same fields (isolation level 0, rack id "", no cluster id)."""
    out = bytearray(_REQ_HEAD.pack(0, 1, FETCH_VERSION, correlation_id, len(client_id)))
    out += client_id
    out.append(0)  # the header's tagged fields
    out += _BODY_HEAD.pack(replica_id, max_wait_ms, min_bytes, max_bytes, 0, session_id, session_epoch)
    _put_uv(out, len(topics) + 1)
    pack = _PARTITION.pack
    for topic, entries in topics:
        _put_compact_string(out, topic)
        _put_uv(out, len(entries) + 1)
        for e in entries:
            out += pack(*e)
            out.append(0)
        out.append(0)
    _put_uv(out, len(forgotten) + 1)
    for topic, parts in forgotten:
        _put_compact_string(out, topic)
        _put_uv(out, len(parts) + 1)
        for p in parts:
            out += _I32.pack(p)
        out.append(0)
    out += b"\x01\x00"  # rack_id "" (compact), the body's tagged fields
    _I32.pack_into(out, 0, len(out) - 4)
    return out


def decode_fetch_response(frame: bytes | bytearray | memoryview) -> tuple[int, list[Fetched]] | None:
    """(session id, partitions) of a Fetch v12 answer frame (without its size prefix: correlation id first), or None
    when it is not the common case (see the module doc) or does not parse: the generated decoder then reads it."""
    view = memoryview(frame)
    try:
        if view[4] != 0:  # the response header's tagged fields
            return None
        _, error, session_id = _RESP_HEAD.unpack_from(view, 5)
        if error:
            return None
        pos = 15
        ntopics, pos = read_uvarint(view, pos)
        if ntopics == 0:
            return None  # a null array: the generated decoder's to judge
        out: list[Fetched] = []
        unpack = _PART_HEAD.unpack_from
        for _ in range(ntopics - 1):
            n, pos = read_uvarint(view, pos)
            if n == 0:
                return None
            end = pos + n - 1
            if end > len(view):
                return None
            topic = str(view[pos:end], "utf-8")
            pos = end
            nparts, pos = read_uvarint(view, pos)
            if nparts == 0:
                return None
            for _ in range(nparts - 1):
                partition, perr, hw, _, log_start = unpack(view, pos)
                pos += 30
                # Aborted transactions null or empty, any preferred read replica, then the records.
                if perr or view[pos] > 1:
                    return None
                pos += 5
                n, pos = read_uvarint(view, pos)
                records = None
                if n > 1:
                    end = pos + n - 1
                    if end > len(view):
                        return None
                    records = view[pos:end]
                    pos = end
                if view[pos] != 0:  # tagged fields: a diverging epoch, a leader, a snapshot id
                    return None
                pos += 1
                out.append((topic, partition, hw, log_start, records))
            if view[pos] != 0:
                return None
            pos += 1
        if view[pos] != 0 or pos + 1 != len(view):
            return None
        return session_id, out
    except (IndexError, ValueError, struct.error, UnicodeDecodeError):
        return None


def encode_fetch_answer(
    correlation_id: int, session_id: int, topics: list[tuple[str, list[tuple[int, int, int, int, Any]]]]
) -> tuple[bytearray, list[tuple[int, Any]]]:
    """A leader's Fetch v12 answer to a follower with no error: (frame, file regions), as
    codec.encode_response(..., ext) writes it. Each partition is (partition, high_watermark, last_stable_offset,
    log_start_offset, records): bytes, or a segment's file region (an object with `size`), which is not copied but
    spliced in by the sender (the frame's size counts it)."""
    ext: list[tuple[int, Any]] = []
    out = bytearray(_ANSWER_HEAD.pack(0, correlation_id, 0, 0, 0, session_id))
    _put_uv(out, len(topics) + 1)
    pack = _PART_FIELDS.pack
    file_bytes = 0
    for topic, parts in topics:
        _put_compact_string(out, topic)
        _put_uv(out, len(parts) + 1)
        for partition, hw, lso, log_start, records in parts:
            # Aborted transactions [] (length 1), as the general path's answer to a follower.
            out += pack(partition, 0, hw, lso, log_start, 1, -1)
            if records is None:
                out.append(0)
            elif isinstance(records, bytes | bytearray | memoryview):
                _put_uv(out, len(records) + 1)
                out += records
            else:
                size = records.size
                _put_uv(out, size + 1)
                ext.append((len(out), records))
                file_bytes += size
            out.append(0)
        out.append(0)
    out.append(0)
    _I32.pack_into(out, 0, len(out) - 4 + file_bytes)
    return out, ext

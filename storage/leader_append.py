"""The leader's append of one plain client batch (Log._append_plain) after its check, in two calls: the producer's
sequence check, which also builds the metadata its entry gains (next_batch), and the offset assignment, segment
write and index bookkeeping (write_plain); and the common case of all three steps, the batch check included, in one
call (append_plain: a batch without a transaction into the active segment without a roll).

next_batch_py, write_plain_py and append_plain_py are the references for protocol/_batch_scan.c's next_batch,
write_plain and append_plain, which run unless KBROKER_PURE_PYTHON is set or the C is not built
(tests/storage/test_leader_append.py compares them): same results, same errors, same bytes.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

from kbroker.protocol import accelerators, record_walk
from kbroker.protocol.records import ATTR_TRANSACTIONAL, plain_client_batch_py
from kbroker.storage.producer_state import NO_SEQUENCE, BatchMetadata, ProducerStateEntry, in_sequence

__all__ = [
    "APPEND_WALK",
    "COMPILED",
    "PlainWritten",
    "WriteResult",
    "append_plain",
    "append_plain_py",
    "next_batch",
    "next_batch_py",
    "write_plain",
    "write_plain_py",
]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MAX = 2**63 - 1
_LOG_OVERHEAD = 12
_HEADER_SIZE = 61
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_OFF_BATCH_LENGTH = 8
_OFF_LEADER_EPOCH = 12
_OFF_LAST_OFFSET_DELTA = 23
_OFF_MAX_TIMESTAMP = 35

# (last offset, bytes since the last index entry, whether the offset and time indexes get an entry at position,
# the segment's largest timestamp, the last offset of its batch)
WriteResult = tuple[int, int, bool, int, int]


def _check_numbers(
    name: str, fd: int, position: int, base_offset: int, max_base: int, leader_epoch: int | None
) -> None:
    """The C's write_args range checks, shared by write_plain_py and append_plain_py (ValueError as the C's)."""
    if not (0 <= fd <= _INT32_MAX and position >= 0 and 0 <= base_offset <= max_base) or (
        leader_epoch is not None and not _INT32_MIN <= leader_epoch <= _INT32_MAX
    ):
        raise ValueError(f"{name}: fd, position, base_offset or leader_epoch out of range")


def write_plain_py(
    buf: bytearray | memoryview,
    fd: int,
    position: int,
    base_offset: int,
    leader_epoch: int | None,
    since: int,
    interval: int,
    max_ts: int,
    max_ts_offset: int,
) -> WriteResult:
    """Assign base_offset (and leader_epoch) to buf, one whole batch the leader's fast path passed (both fields are
    outside the CRC); write it at position of fd (a short write continues; on an error the file is cut back to
    position and OSError raised, so readers never see a partial batch); then LogSegment._index_batches for this one
    batch: the segment's largest timestamp and its batch's last offset, whether the indexes get an entry (more than
    interval bytes since the last), and the bytes since the last entry after this batch."""
    _check_numbers("write_plain", fd, position, base_offset, _INT64_MAX, leader_epoch)
    view = memoryview(buf)
    if view.readonly:
        raise BufferError("Object is not writable.")
    view = view.cast("B")
    size = len(view)
    if size < _HEADER_SIZE or _I32.unpack_from(view, _OFF_BATCH_LENGTH)[0] + _LOG_OVERHEAD != size:
        raise ValueError("write_plain: buf is not one whole batch")
    (lod,) = _I32.unpack_from(view, _OFF_LAST_OFFSET_DELTA)
    if base_offset > _INT64_MAX - max(lod, 0):
        raise ValueError("write_plain: base_offset out of range")
    if since <= interval and since > _INT64_MAX - size:
        raise ValueError("write_plain: since out of range")
    _I64.pack_into(view, 0, base_offset)
    if leader_epoch is not None:
        _I32.pack_into(view, _OFF_LEADER_EPOCH, leader_epoch)
    done = 0
    try:
        while done < size:  # a short write (rare): the rest
            n = os.pwrite(fd, view[done:], position + done)
            if n == 0:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            done += n
    except OSError:
        try:
            os.ftruncate(fd, position)
        except OSError:
            pass  # the next append overwrites the tail at position anyway
        raise
    last = base_offset + lod
    (batch_max_ts,) = _I64.unpack_from(view, _OFF_MAX_TIMESTAMP)
    if batch_max_ts > max_ts:
        max_ts, max_ts_offset = batch_max_ts, last
    indexed = since > interval
    return last, (0 if indexed else since) + size, indexed, max_ts, max_ts_offset


def next_batch_py(
    batches: Sequence[BatchMetadata],
    base_sequence: int,
    last_offset_delta: int,
    first_offset: int,
    max_timestamp: int,
) -> BatchMetadata | None:
    """The metadata a producer's entry gains (after the write) for its next batch at first_offset, when the batch's
    base sequence follows the entry's last (batches: its retained ones, oldest first; sequences wrap from Int32 max
    to 0) and its sequence range is none of the retained batches' (Kafka's duplicate check); None for anything else
    (a gap, a retry, no sequence), which the general path then answers."""
    if not (
        base_sequence <= _INT32_MAX
        and _INT32_MIN <= last_offset_delta <= _INT32_MAX
        and 0 <= first_offset <= _INT64_MAX - _INT32_MAX
    ):
        raise ValueError("next_batch: base_sequence, last_offset_delta or first_offset out of range")
    last_seq = batches[-1].last_seq if batches else NO_SEQUENCE
    if base_sequence < 0 or not in_sequence(last_seq, base_sequence):
        return None
    last = (base_sequence + last_offset_delta) % (_INT32_MAX + 1)  # sequences wrap as the Java client's do
    for m in batches:
        if m.first_seq == base_sequence and m.last_seq == last:
            return None
    return BatchMetadata(base_sequence, last, first_offset, first_offset + last_offset_delta, max_timestamp)


# write_plain's result, then the batch's max timestamp and record count, the producer's entry (None without a
# producer id) and the BatchMetadata it gains (None with it)
PlainWritten = tuple[int, int, bool, int, int, int, int, ProducerStateEntry | None, BatchMetadata | None]


def append_plain_py(
    buf: bytearray | memoryview,
    walk: Any,
    compacted: bool,
    check_ts: bool,
    ts_low: int,
    ts_high: int,
    producers: dict[int, ProducerStateEntry],
    fd: int,
    position: int,
    base_offset: int,
    leader_epoch: int | None,
    since: int,
    interval: int,
    max_ts: int,
    max_ts_offset: int,
    room: int,
    max_delta: int,
) -> PlainWritten | None:
    """Log._append_plain's common case in one step: plain_client_batch (walk: the compiled record walk, which the
    C takes; unused here), the producer's checks and next_batch, then write_plain at base_offset. None, with nothing
    written or changed, when a step declines: not a plain batch, a transactional one (its transaction's checks stay
    in Python), more than room bytes or a last offset delta above max_delta (the active segment would roll first),
    a producer unknown in producers or at another epoch or inside a transaction, a batch out of sequence or a
    retry. The arguments are checked first (ValueError, BufferError for a read-only buf), as the C does."""
    if type(producers) is not dict:
        raise TypeError("append_plain: producers must be a dict")
    _check_numbers("append_plain", fd, position, base_offset, _INT64_MAX - _INT32_MAX, leader_epoch)
    view = memoryview(buf)
    if view.readonly:
        raise BufferError("Object is not writable.")
    if since <= interval and since > _INT64_MAX - view.nbytes:
        raise ValueError("append_plain: since out of range")
    h = plain_client_batch_py(buf, compacted, (ts_low, ts_high) if check_ts else None)
    if (
        h is None
        or h.attributes & ATTR_TRANSACTIONAL
        or view.nbytes > room
        or h.last_offset_delta > max_delta
    ):
        return None
    entry = added = None
    if h.producer_id >= 0:
        entry = producers.get(h.producer_id)
        if (
            entry is None
            or entry.producer_epoch != h.producer_epoch
            or entry.current_txn_first_offset is not None
        ):
            return None
        added = next_batch_py(
            entry.batch_metadata, h.base_sequence, h.last_offset_delta, base_offset, h.max_timestamp
        )
        if added is None:
            return None
    last, since, indexed, max_ts, max_ts_offset = write_plain_py(
        buf, fd, position, base_offset, leader_epoch, since, interval, max_ts, max_ts_offset
    )
    return last, since, indexed, max_ts, max_ts_offset, h.max_timestamp, h.records_count, entry, added


_compiled = accelerators.load("_batch_scan")
COMPILED = _compiled is not None
if _compiled is not None:
    _compiled.configure_metadata(BatchMetadata)
next_batch: Callable[[Sequence[BatchMetadata], int, int, int, int], BatchMetadata | None] = (
    _compiled.next_batch if _compiled is not None else next_batch_py
)
write_plain: Callable[
    [bytearray | memoryview, int, int, int, int | None, int, int, int, int], WriteResult
] = _compiled.write_plain if _compiled is not None else write_plain_py
# The compiled record walk append_plain passes to the C (None without it: then append_plain is None too).
APPEND_WALK = record_walk.compiled_walk()
# Log._append_plain's one call: None without the C, and the Log then takes its steps one by one (the reference).
append_plain: Callable[..., PlainWritten | None] | None = (
    _compiled.append_plain if _compiled is not None and APPEND_WALK is not None else None
)

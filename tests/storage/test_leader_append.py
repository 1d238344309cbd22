"""protocol/_batch_scan.c's write_plain against its reference storage/leader_append.write_plain_py: the same batch,
file and segment state in give the same result or error, the same buffer bytes and the same file bytes out."""

from __future__ import annotations

import errno
import os
import struct
import tempfile
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kbroker.protocol.records import build_batch
from kbroker.storage import leader_append
from kbroker.storage.producer_state import BatchMetadata, ProducerStateEntry

pytestmark = pytest.mark.skipif(
    not leader_append.COMPILED, reason="protocol/_batch_scan.c not built or switched off"
)

NOW = 1_700_000_000_000
INT64_MAX = 2**63 - 1


def _batch(n: int, shift: int) -> bytes:
    return build_batch(
        [(b"k", b"v" * i, (), NOW + shift * i) for i in range(n)],
        producer_id=7,
        producer_epoch=0,
        base_sequence=3,
    )


def _outcome(write: Any, buf: Any, fd: int, args: tuple[Any, ...]) -> Any:
    try:
        return write(buf, fd, *args)
    except BufferError as e:  # a read-only buffer: the message names the buffer's type in C only
        return type(e).__name__
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return type(e).__name__, str(e)


def write_both(
    data: bytes, make_buf: Any, prefix: bytes, args: tuple[Any, ...], open_flags: int = os.O_RDWR
) -> None:
    """One write_plain call with each implementation on its own copy of the buffer and the file: results, errors,
    the buffers after and the files after must be equal. args: everything after fd."""
    outs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, write in (("c", leader_append._compiled.write_plain), ("py", leader_append.write_plain_py)):  # type: ignore[union-attr]
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(prefix)
            buf = make_buf(data)
            fd = os.open(path, open_flags)
            try:
                result = _outcome(write, buf, fd, args)
            finally:
                os.close(fd)
            with open(path, "rb") as f:
                outs.append((result, bytes(buf), f.read()))
    assert outs[0] == outs[1], (data.hex(), prefix.hex(), args)


BUFFERS = (
    bytearray,
    lambda b: memoryview(bytearray(b)),
    bytes,
    memoryview,
    lambda b: memoryview(bytearray(b))[1:],
)
int64 = st.integers(-(2**63), INT64_MAX)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 5),
    shift=st.sampled_from((0, 1, -1, -(10**15))),
    mutation=st.one_of(st.none(), st.tuples(st.integers(0, 70), st.integers(0, 255)), st.integers(0, 80)),
    make_buf=st.sampled_from(BUFFERS),
    prefix=st.binary(max_size=40),
    position=st.one_of(st.integers(0, 50), st.sampled_from((-1, 5000))),
    base_offset=st.one_of(st.integers(0, 10**6), st.sampled_from((-1, INT64_MAX, INT64_MAX - 3, 2**62))),
    leader_epoch=st.one_of(st.none(), st.sampled_from((0, 1, -1, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1))),
    since=st.one_of(st.integers(0, 5000), st.sampled_from((INT64_MAX, INT64_MAX - 10, -(2**63)))),
    interval=st.one_of(st.sampled_from((4096, 1, 0, -1)), int64),
    max_ts=st.one_of(st.sampled_from((-1, NOW, NOW + 3, -(2**63), INT64_MAX)), int64),
    max_ts_offset=st.one_of(st.integers(0, 100), int64),
)
def test_write_plain_matches_reference(
    n: int,
    shift: int,
    mutation: Any,
    make_buf: Any,
    prefix: bytes,
    position: int,
    base_offset: int,
    leader_epoch: int | None,
    since: int,
    interval: int,
    max_ts: int,
    max_ts_offset: int,
) -> None:
    data = bytearray(_batch(n, shift))
    if isinstance(mutation, tuple):  # a byte set: batchLength, lastOffsetDelta, maxTimestamp and the rest
        at, value = mutation
        if at < len(data):
            data[at] = value
    elif isinstance(mutation, int):  # cut or grown: no longer one whole batch
        data = data[:mutation] if mutation < len(data) else data + b"\0" * (mutation - len(data) + 1)
    write_both(
        bytes(data),
        make_buf,
        prefix,
        (position, base_offset, leader_epoch, since, interval, max_ts, max_ts_offset),
    )


def test_write_plain_writes_the_batch_with_its_offsets() -> None:
    """What the leader's fast path relies on, without the reference: Kafka's header fields set, the bytes at position,
    an index entry only past the interval, the largest timestamp kept."""
    data = _batch(3, 1)
    buf = bytearray(data)
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * 10)
        f.flush()
        result = leader_append.write_plain(buf, f.fileno(), 10, 500, 4, 4097, 4096, NOW + 10, 7)
        f.seek(0)
        assert f.read() == b"x" * 10 + bytes(buf)
    assert struct.unpack_from(">qiI", buf) == (500, len(data) - 12, 4)
    assert buf[16:] == data[16:]  # the CRC'd part is untouched
    assert result == (502, len(data), True, NOW + 10, 7)
    result = leader_append.write_plain(
        bytearray(data), os.open(os.devnull, os.O_WRONLY), 0, 0, None, 0, 4096, -1, 0
    )
    assert result == (2, len(data), False, NOW + 2, 2)


@pytest.mark.parametrize(
    "path, flags, code",
    [
        (os.devnull, os.O_RDONLY, errno.EBADF),  # not open for writing
        ("/dev/full", os.O_WRONLY, errno.ENOSPC),  # the disk is full
    ],
)
def test_write_plain_errors_are_oserrors(path: str, flags: int, code: int) -> None:
    if not os.path.exists(path):
        pytest.skip(f"no {path}")
    for write in (leader_append._compiled.write_plain, leader_append.write_plain_py):  # type: ignore[union-attr]
        fd = os.open(path, flags)
        try:
            with pytest.raises(OSError) as info:
                write(bytearray(_batch(2, 0)), fd, 0, 5, 1, 0, 4096, -1, 0)
        finally:
            os.close(fd)
        assert info.value.errno == code


def test_write_plain_cuts_a_failed_write_back() -> None:
    """A file opened read-only fails the write: both leave its bytes as they were, as LogSegment.append did."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "seg")
        with open(path, "wb") as f:
            f.write(b"y" * 20)
        write_both(_batch(2, 0), bytearray, b"y" * 20, (20, 5, 1, 0, 4096, -1, 0), os.O_RDONLY)
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(OSError):
                leader_append.write_plain(bytearray(_batch(2, 0)), fd, 20, 5, 1, 0, 4096, -1, 0)
        finally:
            os.close(fd)
        with open(path, "rb") as f:
            assert f.read() == b"y" * 20


def test_write_plain_refuses_closed_and_hostile_descriptors() -> None:
    r, w = os.pipe()
    try:  # a pipe cannot be written at a position (ESPIPE), in both
        for write in (leader_append._compiled.write_plain, leader_append.write_plain_py):  # type: ignore[union-attr]
            with pytest.raises(OSError) as info:
                write(bytearray(_batch(1, 0)), w, 0, 0, None, 0, 4096, -1, 0)
            assert info.value.errno == errno.ESPIPE
    finally:
        os.close(r)
        os.close(w)
    for fd in (-1, 2**31):
        for write in (leader_append._compiled.write_plain, leader_append.write_plain_py):  # type: ignore[union-attr]
            with pytest.raises(ValueError):
                write(bytearray(_batch(1, 0)), fd, 0, 0, None, 0, 4096, -1, 0)


def _next_outcome(fn: Any, batches: Any, args: tuple[int, ...]) -> Any:
    try:
        m = fn(batches, *args)
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return type(e).__name__, str(e)
    return (
        None
        if m is None
        else (type(m), m.first_seq, m.last_seq, m.first_offset, m.last_offset, m.max_timestamp)
    )


def next_both(batches: Any, args: tuple[int, ...]) -> None:
    """One next_batch call with each implementation: the same metadata (or None, or error); batches unchanged."""
    before = list(batches)
    c = _next_outcome(leader_append._compiled.next_batch, batches, args)  # type: ignore[union-attr]
    assert list(batches) == before
    assert c == _next_outcome(leader_append.next_batch_py, batches, args), (before, args)


seqs = st.one_of(st.integers(0, 40), st.sampled_from((-1, -2, 2**31 - 1, 2**31 - 2, 2**31, -(2**31))))


@settings(max_examples=400, deadline=None)
@given(
    retained=st.lists(st.tuples(seqs, st.integers(0, 5)), max_size=5),
    consecutive=st.booleans(),
    step=st.sampled_from((1, 1, 1, 0, 2, -3)),
    base_sequence=st.one_of(st.none(), seqs),
    lod=st.one_of(st.integers(0, 5), st.sampled_from((-1, 2**31 - 1, -(2**31), 2**31))),
    first_offset=st.one_of(
        st.integers(0, 1000), st.sampled_from((-1, 2**63 - 1 - (2**31 - 1), 2**63 - 2**31))
    ),
    max_timestamp=st.sampled_from((-1, NOW, 2**63 - 1, -(2**63))),
    container=st.sampled_from((list, tuple, lambda x: deque(x, maxlen=5))),
    plant=st.integers(-1, 9),
)
def test_next_batch_matches_reference(
    retained: list[tuple[int, int]],
    consecutive: bool,
    step: int,
    base_sequence: int | None,
    lod: int,
    first_offset: int,
    max_timestamp: int,
    container: Any,
    plant: int,
) -> None:
    """Retained batches in sequence (what the log keeps) or arbitrary (a snapshot says what it says); the next batch
    in sequence, repeated (a retry of the last or of an older one), gapped, wrapped at Int32 max or without one."""
    batches = []
    seq = retained[0][0] if retained else 0
    for i, (first, n) in enumerate(retained):
        start = seq if consecutive else first
        end = (start + n) % 2**31 if 0 <= start < 2**31 else start + n
        batches.append(BatchMetadata(start, end, 10 * i, 10 * i + n, NOW + i))
        seq = end + 1 if end < 2**31 - 1 else 0
    if base_sequence is None:  # the step after the last retained batch, the common case
        last = batches[-1].last_seq if batches else -1
        base_sequence = last + step if last + step < 2**31 else 0
        if step == -3 and batches:  # a retry of a retained batch: its own range again
            base_sequence, lod = batches[0].first_seq, batches[0].last_seq - batches[0].first_seq
    if 0 <= plant // 2 < len(batches) - 1 and 0 <= base_sequence < 2**31:
        # An older retained batch with the next batch's own range (in sequence, and yet a retry, after a wrap), or
        # with its first sequence only (no retry).
        batches[plant // 2] = BatchMetadata(
            base_sequence, (base_sequence + lod + plant % 2) % 2**31, 1, 2, NOW
        )
    next_both(container(batches), (base_sequence, lod, first_offset, max_timestamp))


def test_next_batch_refuses_what_is_no_metadata() -> None:
    for bad in ([object()], [(0, 1, 0, 1, 0)], 5, None):
        for fn in (leader_append._compiled.next_batch, leader_append.next_batch_py):  # type: ignore[union-attr]
            with pytest.raises((TypeError, AttributeError)):
                fn(bad, 0, 0, 0, 0)
    half = BatchMetadata.__new__(BatchMetadata)  # slots never set
    for fn in (leader_append._compiled.next_batch, leader_append.next_batch_py):  # type: ignore[union-attr]
        with pytest.raises(AttributeError):
            fn([half], 0, 0, 0, 0)


def test_next_batch_follows_the_last_and_refuses_retries() -> None:
    batches = deque([BatchMetadata(0, 2, 0, 2, NOW), BatchMetadata(3, 5, 3, 5, NOW)], maxlen=5)
    m = leader_append.next_batch(batches, 6, 2, 6, NOW + 1)
    assert m == BatchMetadata(6, 8, 6, 8, NOW + 1) and type(m) is BatchMetadata
    assert leader_append.next_batch(batches, 3, 2, 6, NOW) is None  # a retry of a retained batch
    assert leader_append.next_batch(batches, 7, 2, 6, NOW) is None  # a gap
    assert leader_append.next_batch(batches, -1, 2, 6, NOW) is None  # no sequence
    wrapped = [BatchMetadata(2**31 - 3, 2**31 - 1, 0, 2, NOW)]
    assert leader_append.next_batch(wrapped, 0, 4, 3, NOW) == BatchMetadata(0, 4, 3, 7, NOW)
    assert leader_append.next_batch([], 0, 0, 0, NOW) == BatchMetadata(0, 0, 0, 0, NOW)


def test_next_batch_after_extreme_snapshot_values() -> None:
    """A snapshot can hold any int64 (the sanitized fuzz found last_seq + 1 overflowing in C): same answers."""
    for last_seq in (2**63 - 1, -(2**63), 2**31 - 1, 2**31):
        for base in (0, 2**31 - 1, -1):
            next_both([BatchMetadata(-(2**63), last_seq, 0, 1, 2**63 - 1)], (base, 0, 0, 0))


# -- append_plain: the batch check, the producer's checks and the write in one call --------------------------------


def _producers(spec: Any) -> dict[int, ProducerStateEntry]:
    """Producer 7's entry from spec: None (unknown), or (epoch, retained (first_seq, last_seq) pairs, open txn)."""
    if spec is None:
        return {}
    epoch, retained, txn = spec
    batches: deque[BatchMetadata] = deque(maxlen=5)
    for i, (first, last) in enumerate(retained):
        batches.append(BatchMetadata(first, last, i, i + 1, NOW))
    return {7: ProducerStateEntry(7, epoch, batches, NOW, -1, 3 if txn else None)}


def append_both(
    data: bytes,
    make_buf: Any,
    prefix: bytes,
    spec: Any,
    walk_args: tuple[Any, ...],
    args: tuple[Any, ...],
    open_flags: int = os.O_RDWR,
) -> Any:
    """One append_plain call with each implementation on its own copy of the buffer, the file and the producers:
    results (the entry returned compared by value), errors, the buffers, files and producers after must be equal.
    walk_args: (compacted, check_ts, ts_low, ts_high); args: position and everything after it. The C's outcome."""
    outs = []
    with tempfile.TemporaryDirectory() as tmp:
        implementations = (("c", leader_append._compiled.append_plain), ("py", leader_append.append_plain_py))  # type: ignore[union-attr]
        for name, append in implementations:
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(prefix)
            buf = make_buf(data)
            producers = _producers(spec)
            fd = os.open(path, open_flags)
            try:
                try:
                    result = append(buf, leader_append.APPEND_WALK, *walk_args, producers, fd, *args)
                    if result is not None:
                        assert result[7] is producers.get(7) or result[7] is None
                except BufferError as e:  # a read-only buffer: the message names the buffer's type in C only
                    result = type(e).__name__
                except Exception as e:  # noqa: BLE001 - the error is the outcome compared
                    result = (type(e).__name__, str(e))
            finally:
                os.close(fd)
            with open(path, "rb") as f:
                outs.append((result, bytes(buf), f.read(), producers))
    assert outs[0] == outs[1], (data.hex(), prefix.hex(), spec, walk_args, args)
    return outs[0][0]


def _plain_batch(
    n: int, shift: int, pid: int, epoch: int, seq: int, txn: bool = False, keyed: bool = True
) -> bytes:
    return build_batch(
        [(b"k" if keyed else None, b"v" * i, (), NOW + shift * i) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=txn,
    )


@settings(max_examples=400, deadline=None)
@given(
    n=st.integers(1, 4),
    shift=st.sampled_from((0, 1, -1, -(10**13))),
    pid=st.sampled_from((7, 7, 7, -1, 8)),
    epoch=st.sampled_from((0, 0, 0, 1)),
    seq=st.sampled_from((3, 3, 3, 0, 2, 4, -1, 2**31 - 1)),
    txn=st.sampled_from((False, False, False, True)),
    keyed=st.sampled_from((True, True, False)),
    mutation=st.one_of(st.none(), st.tuples(st.integers(0, 70), st.integers(0, 255)), st.integers(0, 80)),
    make_buf=st.sampled_from(BUFFERS),
    prefix=st.binary(max_size=20),
    spec=st.one_of(
        st.none(),
        st.tuples(
            st.sampled_from((0, 0, 1)),
            st.sampled_from(([(0, 2)], [], [(1, 1), (2, 2)], [(0, 2), (3, 5)], [(2**31 - 5, 2**31 - 1)])),
            st.sampled_from((False, False, True)),
        ),
    ),
    walk_args=st.sampled_from(
        (
            (False, False, 0, 0),
            (True, False, 0, 0),
            (False, True, NOW - 10, NOW + 10),
            (False, True, NOW, NOW),
        )
    ),
    position=st.one_of(st.integers(0, 30), st.sampled_from((-1,))),
    base_offset=st.one_of(
        st.integers(0, 10**6), st.sampled_from((-1, INT64_MAX - 2**31 + 1, INT64_MAX - 2**31 + 2))
    ),
    leader_epoch=st.one_of(st.none(), st.sampled_from((0, 1, 2**31 - 1, 2**31, -(2**31) - 1))),
    since=st.one_of(st.integers(0, 5000), st.sampled_from((INT64_MAX, -(2**63)))),
    interval=st.sampled_from((4096, 1, 0, -1, INT64_MAX)),
    max_ts=st.sampled_from((-1, NOW, NOW + 3, -(2**63), INT64_MAX)),
    room=st.sampled_from((INT64_MAX, 0, 100, 200, -1)),
    max_delta=st.sampled_from((INT64_MAX, 0, 1, 2, -1)),
)
def test_append_plain_matches_reference(
    n: int,
    shift: int,
    pid: int,
    epoch: int,
    seq: int,
    txn: bool,
    keyed: bool,
    mutation: Any,
    make_buf: Any,
    prefix: bytes,
    spec: Any,
    walk_args: tuple[Any, ...],
    position: int,
    base_offset: int,
    leader_epoch: int | None,
    since: int,
    interval: int,
    max_ts: int,
    room: int,
    max_delta: int,
) -> None:
    data = bytearray(_plain_batch(n, shift, pid, epoch, seq, txn, keyed))
    if isinstance(mutation, tuple):  # a byte set: the CRC fails unless it is outside it
        at, value = mutation
        if at < len(data):
            data[at] = value
    elif isinstance(mutation, int):  # cut or grown: no longer one whole batch
        data = data[:mutation] if mutation < len(data) else data + b"\0" * (mutation - len(data) + 1)
    append_both(
        bytes(data),
        make_buf,
        prefix,
        spec,
        walk_args,
        (position, base_offset, leader_epoch, since, interval, max_ts, 5, room, max_delta),
    )


def test_append_plain_takes_the_next_batch_and_declines_the_rest() -> None:
    """The common case is taken (the write, the entry and its new metadata returned); each reason to decline leaves
    buffer and file unchanged."""
    spec = (0, [(0, 2)], False)
    walk = (False, False, 0, 0)
    args = (0, 100, 4, 0, 4096, -1, 0, INT64_MAX, INT64_MAX)
    data = _plain_batch(3, 1, 7, 0, 3)
    taken = append_both(data, bytearray, b"", spec, walk, args)
    assert taken is not None and taken[:7] == (102, len(data), False, NOW + 2, 102, NOW + 2, 3)
    assert taken[8] == BatchMetadata(3, 5, 100, 102, NOW + 2)
    assert append_both(_plain_batch(3, 1, -1, -1, -1), bytearray, b"", None, walk, args)[7] is None
    for batch, producers, a in (
        (_plain_batch(3, 1, 7, 0, 3, txn=True), spec, args),  # transactional
        (_plain_batch(3, 1, 7, 0, 4), spec, args),  # a gap
        (_plain_batch(3, 1, 7, 0, 0), spec, args),  # a retry
        (_plain_batch(3, 1, 7, 1, 3), spec, args),  # another epoch
        (data, None, args),  # an unknown producer
        (data, (0, [(0, 2)], True), args),  # inside a transaction
        (data, spec, (*args[:7], len(data) - 1, INT64_MAX)),  # the segment would roll: its size
        (data, spec, (*args[:7], INT64_MAX, 1)),  # its relative offsets
        (_plain_batch(3, 1, 7, 0, 3, keyed=False), spec, args),  # keyless on a compacted topic
    ):
        assert append_both(batch, bytearray, b"xy", producers, (True, False, 0, 0), a) is None


def test_append_plain_errors() -> None:
    """A failing write (a read-only descriptor) is the OSError after the checks, the file cut back; hostile
    numbers and a read-only buffer are refused before anything."""
    spec = (0, [(0, 2)], False)
    walk = (False, False, 0, 0)
    args = (0, 100, 4, 0, 4096, -1, 0, INT64_MAX, INT64_MAX)
    data = _plain_batch(3, 1, 7, 0, 3)
    assert append_both(data, bytearray, b"abc", spec, walk, args, open_flags=os.O_RDONLY)[0] == "OSError"
    assert append_both(data, bytes, b"", spec, walk, args) == "BufferError"
    assert append_both(data, bytearray, b"", spec, walk, (0, -1, *args[2:]))[0] == "ValueError"
    for fn in (leader_append._compiled.append_plain, leader_append.append_plain_py):  # type: ignore[union-attr]
        with pytest.raises(TypeError):
            fn(bytearray(data), leader_append.APPEND_WALK, *walk, [], 0, *args)


def test_append_plain_walks_alike_through_any_walk_object() -> None:
    """_batch_scan.c calls the compiled walk's C function directly (its _walk_api capsule) and any other walk as the
    object it is: both give the same outcome, a fault, keyless records and timestamps out of bounds included."""
    spec = (0, [(0, 2)], False)
    args = (0, 100, 4, 0, 4096, -1, 0, INT64_MAX, INT64_MAX)
    walk = leader_append.APPEND_WALK
    assert walk is not None
    through_python = lambda *a: walk(*a)  # noqa: E731 - another object than the compiled walk itself
    for data, walk_args in (
        (_plain_batch(3, 1, 7, 0, 3), (False, False, 0, 0)),
        (_plain_batch(3, 1, 7, 0, 3, keyed=False), (True, False, 0, 0)),
        (_plain_batch(3, 1, 7, 0, 3), (False, True, NOW, NOW)),
        (_plain_batch(3, 1, 7, 0, 3), (True, True, NOW - 5, NOW + 5)),
    ):
        outcomes = []
        for w in (walk, through_python):
            with tempfile.TemporaryFile() as f:
                written = leader_append._compiled.append_plain(  # type: ignore[union-attr]
                    bytearray(data), w, *walk_args, _producers(spec), f.fileno(), *args
                )
                f.seek(0)
                outcomes.append((written, f.read()))
        assert outcomes[0] == outcomes[1]

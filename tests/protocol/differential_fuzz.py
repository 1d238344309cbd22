"""A seeded, time-boxed differential fuzz of the compiled accelerators against their Python twins.

protocol/_codec.c against codec.py's generated functions (encode every request and response at every version the
broker advertises, then decode mutated encodings with both) and protocol/_record_walk.c against
record_walk.walk_records_py (record bodies with any varint widths, then mutated) and protocol/_batch_scan.c against
records.scan_batches_py (batch sets with mutated headers, CRCs mended or not; its plain against
records.plain_client_batch_py, one batch mutated; its write_plain, next_batch and append_plain against storage/leader_append.py's references,
write_plain also as a follower's one-batch append writes a fetched batch),
protocol/_frames.c against framing.split_py and
protocol/_produce.c against broker/produce_codec.py's references (Produce requests, then mutated, and their answers): the two must agree on every
accept/refuse and on what they return. Run by tools/sanitize_build.py on ASan/UBSan builds of the accelerators
(the point: a memory error in C shows up there, not as a wrong answer), and importable for a plain run.
"""

from __future__ import annotations

import argparse
import random
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from crc32c import crc32c as ext_crc
from kbroker.broker import produce_codec
from kbroker.protocol import codec, framing, record_walk
from kbroker.protocol import records as R
from kbroker.protocol.messages import ProduceRequest, RequestHeader
from kbroker.storage.producer_state import BatchMetadata

from tests.protocol.test_codec import CASES, _cls, filled, normalize
from tests.protocol.test_record_walk import NOW, VARINT_FIELDS, record_with_widths
from tests.storage.test_leader_append import append_both, next_both, write_both

_PY_DECODE_ERRORS = (codec.DecodeError, struct.error, IndexError, OverflowError, MemoryError, ValueError)
_SPECIAL = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        how = rng.randrange(5)
        if how == 0 and buf:
            buf[rng.randrange(len(buf))] = rng.choice(_SPECIAL)
        elif how == 1 and buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif how == 2 and buf:
            del buf[rng.randrange(len(buf)) :]
        elif how == 3:
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = rng.choice([b"\xff" * 5, b"\x80\x80\x80\x80\x80\x01", b"\x7f\xff", rng.randbytes(3)])
        elif len(buf) >= 4:
            at = rng.randrange(len(buf) - 3)
            buf[at : at + 4] = struct.pack(">i", rng.choice([-1, -2, 0x7FFF, 0x8000, 2**31 - 1, -(2**31)]))
    return bytes(buf)


def _decode_both(cls: type, version: int, buf: bytes) -> None:
    try:
        py = codec.py_decoder(cls, version)(buf, 0)
    except _PY_DECODE_ERRORS:
        try:
            codec.plan(cls, version).decode(buf, 0)
        except codec.DecodeError:
            return
        raise AssertionError(
            f"{cls.__name__} v{version}: C accepts what Python refuses: {buf.hex()}"
        ) from None
    try:
        c = codec.plan(cls, version).decode(buf, 0)
    except codec.DecodeError as e:
        raise AssertionError(
            f"{cls.__name__} v{version}: C refuses ({e}) what Python accepts: {buf.hex()}"
        ) from None
    assert c[1] == py[1], f"{cls.__name__} v{version}: ends differ: {buf.hex()}"
    if normalize(c[0]) != normalize(py[0]):
        # NaN floats compare unequal: the same bytes when encoded again is what counts
        again_c, again_py = bytearray(), bytearray()
        codec.py_encoder(cls, version)(c[0], again_c, None)
        codec.py_encoder(cls, version)(py[0], again_py, None)
        assert again_c == again_py, f"{cls.__name__} v{version}: decoded values differ: {buf.hex()}"


def codec_round(rng: random.Random) -> None:
    kind, api_key, version = rng.choice(CASES).values
    cls = _cls(kind, api_key)
    obj = filled(cls, version, salt=rng.randint(1, 1000))
    out_c, out_py = bytearray(), bytearray()
    codec.plan(cls, version).encode(obj, out_c, None)
    codec.py_encoder(cls, version)(obj, out_py, None)
    assert out_c == out_py, f"{cls.__name__} v{version}: encodings differ"
    for _ in range(8):
        _decode_both(cls, version, _mutate(rng, bytes(out_c)))


def _walk_both(body: bytes, count: int, consecutive: bool) -> None:
    args: dict[str, Any] = {
        "consecutive": consecutive,
        "last_offset_delta": count,
        "need_keys": True,
        "base_timestamp": NOW,
        "ts_bounds": (NOW - 1000, NOW + 1000),
    }
    c = record_walk.walk_records(body, count, **args)
    py = record_walk.walk_records_py(body, count, **args)
    assert isinstance(c, str) == isinstance(py, str), (c, py, body.hex())
    if not isinstance(c, str):
        assert not isinstance(py, str)
        assert (c.keyless, c.bad_timestamps) == (py.keyless, py.bad_timestamps), body.hex()


def walk_round(rng: random.Random) -> None:
    count = rng.randint(1, 5)
    if rng.random() < 0.5:
        recs = [
            (rng.choice([None, b"k"]), rng.randbytes(rng.randint(0, 30)), (), NOW + rng.randint(-2000, 2000))
            for _ in range(count)
        ]
        body = R.build_batch(recs)[R.BATCH_HEADER_SIZE :]
    else:
        body = b"".join(
            record_with_widths(
                i, {rng.choice(VARINT_FIELDS): rng.randint(1, 11) for _ in range(rng.randint(0, 3))}
            )
            for i in range(count)
        )
    _walk_both(body, count, rng.random() < 0.7)
    for _ in range(8):
        _walk_both(_mutate(rng, body), count + rng.choice([0, 0, -1, 1]), rng.random() < 0.7)


def _scan_both(buf: bytes) -> None:
    ext = R._scan_compiled
    assert ext is not None
    for from_client, replicated in ((True, False), (False, False), (False, True)):
        c = ext.scan(buf, from_client, replicated)
        py = R.scan_batches_py(buf, from_client, replicated)
        assert c == py, (from_client, replicated, buf.hex())


def scan_round(rng: random.Random) -> None:
    # Now and then a batch over 64 KiB: the C scan checks those with the GIL released.
    big = rng.random() < 0.05
    batches = [
        R.build_batch(
            [
                (rng.choice([None, b"k"]), rng.randbytes(70_000 if big else rng.randint(0, 40)), (), NOW)
                for _ in range(rng.randint(1, 4))
            ],
            compression=rng.choice([R.COMPRESSION_NONE, R.COMPRESSION_GZIP]),
            producer_id=rng.choice([-1, 5]),
            base_sequence=rng.choice([-1, 0]),
            is_control=rng.random() < 0.1,
        )
        for _ in range(rng.randint(1, 3))
    ]
    buf = b"".join(batches)
    _scan_both(buf)
    for _ in range(8):
        bad = bytearray(_mutate(rng, buf))
        if rng.random() < 0.5 and len(bad) >= R.BATCH_HEADER_SIZE:
            # Mend the first batch's CRC, so that the checks after it see the mutated fields.
            (length,) = struct.unpack_from(">i", bad, 8)
            end = min(len(bad), max(length, 0) + R.LOG_OVERHEAD)
            struct.pack_into(">I", bad, 17, ext_crc(bytes(bad[21:end])))
        _scan_both(bytes(bad))
    data = rng.randbytes(rng.randint(0, 2000))
    ext = R._scan_compiled
    assert ext is not None and ext.crc32c(data) == ext.crc32c(data, True) == ext_crc(data)


def _plain_both(buf: bytes | bytearray) -> None:
    for compacted in (False, True):
        for bounds in (None, (NOW - 5, NOW + 5)):
            c = R._plain_compiled(buf, compacted, bounds)
            py = R.plain_client_batch_py(buf, compacted, bounds)
            assert c == py, (compacted, bounds, bytes(buf).hex())


def plain_round(rng: random.Random) -> None:
    """The leader's fast-path check (_batch_scan.c's plain): one batch, mostly of its case, then mutated."""
    big = rng.random() < 0.05
    buf = R.build_batch(
        [
            (
                rng.choice([None, b"k", b"k"]),
                rng.randbytes(70_000 if big else rng.randint(0, 40)),
                (),
                NOW + rng.choice([0, 0, 0, 100]),
            )
            for _ in range(rng.randint(1, 4))
        ],
        compression=rng.choice([R.COMPRESSION_NONE] * 4 + [R.COMPRESSION_GZIP]),
        producer_id=rng.choice([-1, 5]),
        base_sequence=rng.choice([-1, 0]),
        is_transactional=rng.random() < 0.1,
    )
    _plain_both(buf)
    for _ in range(8):
        bad = bytearray(_mutate(rng, buf))
        if rng.random() < 0.5 and len(bad) >= R.BATCH_HEADER_SIZE:
            (length,) = struct.unpack_from(">i", bad, 8)
            end = min(len(bad), max(length, 0) + R.LOG_OVERHEAD)
            struct.pack_into(">I", bad, 17, ext_crc(bytes(bad[21:end])))
        _plain_both(bad)


def write_round(rng: random.Random) -> None:
    """The leader's fast-path write (_batch_scan.c's write_plain): one batch, mostly whole, at edge positions,
    offsets, epochs and index state; the buffers and files after must match the reference's."""
    data = bytearray(
        R.build_batch(
            [
                (b"k", rng.randbytes(rng.randint(0, 40)), (), NOW + rng.choice([0, 5, -5]))
                for _ in range(rng.randint(1, 4))
            ],
            producer_id=5,
            base_sequence=0,
        )
    )
    if rng.random() < 0.3:
        data = bytearray(_mutate(rng, bytes(data)))
    edge = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
    args = (
        rng.choice([0, 0, 7, 4096, -1]),
        rng.choice([0, 1, 10**6, 2**63 - 1, 2**63 - 2, -1]),
        rng.choice([None, None, 0, 3, 2**31 - 1, -(2**31), 2**31]),
        rng.choice([0, 100, 5000, *edge]),
        rng.choice([4096, 1, 0, *edge]),
        rng.choice([-1, NOW, NOW + 10, *edge]),
        rng.choice([0, 3, *edge]),
    )
    make_buf = rng.choice(
        [bytearray, bytes, lambda b: memoryview(bytearray(b)), lambda b: memoryview(bytearray(b))[2:]]
    )
    write_both(bytes(data), make_buf, rng.randbytes(rng.randint(0, 30)), args)


def follower_round(rng: random.Random) -> None:
    """A follower's one-batch append (storage/log_replica.py's append_fetched): a fetch answer's records, mostly one
    whole batch at the leader's offset and epoch, sometimes several, cut or mutated, checked by the compiled scan and
    its reference (records.one_replicated_batch's test), then, when one batch passes, written by write_plain with its
    own base offset and no epoch, as that path does, in C and in Python."""
    batches = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        raw = bytearray(
            R.build_batch(
                [(b"k", rng.randbytes(rng.randint(0, 40)), (), NOW) for _ in range(rng.randint(1, 4))],
                compression=rng.choice([R.COMPRESSION_NONE] * 3 + [R.COMPRESSION_GZIP]),
                producer_id=rng.choice([-1, -1, 5]),
                base_sequence=rng.choice([-1, 0]),
            )
        )
        R.set_base_offset(raw, 0, rng.choice([0, 17, 2**31, 2**63 - 10]))
        R.set_partition_leader_epoch(raw, 0, rng.choice([0, 3, -1, 2**31 - 1]))
        batches.append(bytes(raw))
    buf = b"".join(batches)
    if rng.random() < 0.2:
        buf = buf[: rng.randint(0, len(buf))]
    if rng.random() < 0.3:
        buf = _mutate(rng, buf)
    ext = R._scan_compiled
    assert ext is not None
    c = ext.scan(buf, False, True)
    py = R.scan_batches_py(buf, False, True)
    assert c == py, buf.hex()
    h = R.one_replicated_batch(buf)
    if h is not None:
        assert len(c[0]) == 1 and c[1:3] == (h.records_count, len(buf)) and c[-1] is None, buf.hex()
        args = (rng.choice([0, 61, 4096]), h.base_offset, None, rng.choice([0, 5000]), 4096, NOW, 0)
        write_both(buf, bytearray, rng.randbytes(rng.randint(0, 30)), args)


def next_batch_round(rng: random.Random) -> None:
    """The leader's fast-path producer check (_batch_scan.c's next_batch): retained batches in sequence or not,
    the next batch after them, a retry, a gap, a wrap at Int32 max."""
    edge = [0, 1, -1, 2**31 - 1, 2**31 - 2, -(2**31), 2**31, 2**63 - 1, -(2**63)]
    batches = []
    seq = rng.choice([0, 5, 2**31 - 3])
    for i in range(rng.randint(0, 5)):
        first = seq if rng.random() < 0.8 else rng.choice(edge)
        last = rng.choice(
            [min(first + rng.randint(0, 3), 2**63 - 1), rng.choice(edge)]
        )  # int64s, as in snapshots
        batches.append(BatchMetadata(first, last, i, i + 1, rng.choice(edge)))
        seq = last + 1 if last < 2**31 - 1 else 0
    base = rng.choice([seq, seq, seq, seq - 1, seq + 1, 0, *edge])
    if batches and rng.random() < 0.2:
        base = rng.choice(batches).first_seq
    args = (base, rng.choice([0, 1, 3, *edge]), rng.choice([0, 7, 2**63 - 2**31, *edge]), rng.choice(edge))
    next_both(rng.choice([list, tuple, deque])(batches), args)


def append_round(rng: random.Random) -> None:
    """The leader's one-call append (_batch_scan.c's append_plain): producer 7's next batch mostly, mutated or not,
    against retained batches in sequence or not, at edge positions, offsets, epochs, index state and roll limits."""
    edge = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
    data = R.build_batch(
        [
            (
                rng.choice([b"k"] * 5 + [None]),
                rng.randbytes(rng.randint(0, 40)),
                (),
                NOW + rng.choice([0, 0, 5, -5]),
            )
            for _ in range(rng.randint(1, 4))
        ],
        producer_id=rng.choice([7, 7, 7, -1, 8]),
        producer_epoch=rng.choice([0, 0, 1]),
        base_sequence=rng.choice([3] * 8 + [0, 4, -1, 2**31 - 1]),
        is_transactional=rng.random() < 0.1,
    )
    if rng.random() < 0.2:
        data = _mutate(rng, data)
    retained = rng.choice([[(0, 2)]] * 8 + [[], [(1, 1), (2, 2)], [(2**31 - 5, 2**31 - 1)], [(0, 2**63 - 1)]])
    spec = rng.choice([None, (0, retained, False), (0, retained, False), (0, retained, rng.random() < 0.3)])
    walk_args = rng.choice(
        [(False, False, 0, 0), (True, False, 0, 0), (False, True, NOW - 3, NOW + 3), (True, True, *edge[5:])]
    )

    def pick(
        sane: list[Any], hostile: list[Any]
    ) -> Any:  # hostile one time in 25: many calls reach the write
        return rng.choice(hostile if rng.random() < 0.04 else sane)

    args = (
        pick([0, 7, 4096], [-1]),
        pick([0, 1, 10**6], [2**63 - 2**31, 2**63 - 2**31 + 1, -1]),
        pick([None, 0, 3], [2**31 - 1, -(2**31), 2**31]),
        pick([0, 100, 5000], edge),
        pick([4096, 1, 0], edge),
        pick([-1, NOW, NOW + 10], edge),
        pick([0, 3], edge),
        pick([2**63 - 1, 60, 100], edge),
        pick([2**63 - 1, 0, 1, 3], edge),
    )
    make_buf = rng.choice(
        [
            bytearray,
            bytearray,
            bytearray,
            bytes,
            lambda b: memoryview(bytearray(b)),
            lambda b: memoryview(bytearray(b))[2:],
        ]
    )
    append_both(bytes(data), make_buf, rng.randbytes(rng.randint(0, 30)), spec, walk_args, args)


def framing_round(rng: random.Random) -> None:
    """protocol/_frames.c's split: frames back to back, sizes that lie, cut anywhere, any range of the buffer."""
    out = bytearray(rng.randbytes(rng.randint(0, 6)))
    for _ in range(rng.randint(0, 6)):
        body = rng.randbytes(rng.choice([0, 3, 8, 20, 300]))
        size = rng.choice([len(body)] * 4 + [-1, 0, 7, 8, 2**31 - 1, rng.randint(-(2**31), 2**31 - 1)])
        out += struct.pack(">i", size) + body
    del out[rng.randint(0, len(out)) :]
    start = rng.randint(0, len(out))
    end = rng.randint(start, len(out))
    _split_both(out, start, end, rng.choice([8, 30, 2**31 - 1]))


def _split_both(buf: bytearray, start: int, end: int, max_request: int) -> None:
    c = framing._compiled.split(buf, start, end, max_request)  # type: ignore[union-attr]
    assert c == framing.split_py(buf, start, end, max_request), (buf.hex(), start, end, max_request)


def _produce_frame(rng: random.Random, version: int) -> tuple[bytes, int]:
    P = ProduceRequest
    topics = []
    for t in range(rng.randint(0, 3)):
        parts = []
        for i in range(rng.randint(0, 3)):
            batch = R.build_batch(
                [(None, rng.randbytes(rng.randint(0, 30)), (), NOW) for _ in range(rng.randint(1, 3))],
                producer_id=rng.choice([-1, 5]),
                producer_epoch=0,
                base_sequence=0,
                is_transactional=rng.random() < 0.1,
            )
            parts.append(P.PartitionProduceData(index=i, records=batch * rng.choice([1, 1, 1, 2])))
        topics.append(P.TopicProduceData(name=f"t{t}", partition_data=parts))
    req = P(
        transactional_id=rng.choice([None, "tx"]), acks=rng.choice([-1, 1]), timeout_ms=100, topic_data=topics
    )
    header = RequestHeader(request_api_key=0, request_api_version=version, correlation_id=1, client_id="c")
    frame = bytes(codec.encode_request(header, req)[4:])
    return frame, codec.decode_request_header(frame)[1]


def _produce_both(frame: bytes, pos: int, version: int) -> None:
    for buf in (frame, bytearray(frame)):
        c = produce_codec._compiled.decode(buf, pos, version)  # type: ignore[union-attr]
        assert c == produce_codec.decode_py(buf, pos, version), (version, frame.hex())


def _produce_frame_both(frame: bytes) -> None:
    for buf in (frame, bytearray(frame)):
        c = produce_codec._compiled.decode_frame(buf)  # type: ignore[union-attr]
        assert c == produce_codec.decode_frame_py(buf), frame.hex()


def produce_frame_round(rng: random.Random) -> None:
    """Whole Produce frames (decode_frame): any version 0-12, client ids of any length or none, header tagged
    fields, then mutated anywhere, the header above all (cut, lengths that lie, another version)."""
    version = rng.randint(3, 11)
    frame, pos = _produce_frame(rng, version)
    client = rng.choice([None, b"", b"rdkafka", rng.randbytes(rng.randint(0, 12))])
    head = struct.pack(">hhi", 0, rng.choice([version] * 6 + [0, 2, 12]), rng.randint(-(2**31), 2**31 - 1))
    head += struct.pack(">h", -1) if client is None else struct.pack(">h", len(client)) + client
    if version >= 9:
        head += rng.choice([b"\x00", b"\x00", b"\x01\x00\x02ab", b"\x02\x05\x00\x01\x01x"])
    whole = head + frame[pos:]
    _produce_frame_both(whole)
    for _ in range(6):
        if rng.random() < 0.5:
            cut = rng.randint(0, len(head) + 2)
            _produce_frame_both(_mutate(rng, whole[:cut]) + whole[cut:])
        else:
            _produce_frame_both(_mutate(rng, whole))


def produce_round(rng: random.Random) -> None:
    version = rng.randint(3, 11)
    frame, pos = _produce_frame(rng, version)
    _produce_both(frame, pos, version)
    for _ in range(8):
        _produce_both(frame[:pos] + _mutate(rng, frame[pos:]), pos, version)
    answers = [
        (
            f"t{t}",
            [
                (
                    i,
                    rng.choice([0, 2, 87]),
                    rng.randint(-1, 2**40),
                    -1,
                    rng.randint(-1, 9),
                    rng.choice([None, "m"]),
                    rng.choice([None, [(rng.randint(0, 9), rng.choice([None, "k"]))]]),
                )
                for i in range(rng.randint(0, 3))
            ],
        )
        for t in range(rng.randint(0, 3))
    ]
    c = produce_codec._compiled.encode_response(3, version, 0, answers)  # type: ignore[union-attr]
    assert c == produce_codec.encode_response_py(3, version, 0, answers), (version, answers)


class _Evil:
    """A bool field's value that changes the list holding its struct while it is being encoded."""

    def __init__(self, victim: list[Any], grow: bool) -> None:
        self.victim, self.grow = victim, grow

    def __bool__(self) -> bool:
        if self.grow:
            if len(self.victim) < 64:
                self.victim.extend(self.victim[1:2] * 64)
        else:
            self.victim.clear()
        return True


def encode_hazard_round(rng: random.Random) -> None:
    from kbroker.protocol.messages import MetadataResponse as M

    version = rng.choice([1, 9, 12])
    for encode in (codec.plan(M, version).encode, codec.py_encoder(M, version)):
        topics = [M.MetadataResponseTopic(name=f"t{i}", partitions=[]) for i in range(rng.randint(2, 6))]
        topics[rng.randrange(len(topics) - 1)].is_internal = _Evil(topics, rng.random() < 0.5)
        try:
            encode(M(topics=topics), bytearray(), None)
        except RuntimeError:
            continue
        raise AssertionError("an array changed during encoding was encoded")


ROUNDS: list[tuple[str, Callable[[random.Random], None], int]] = [
    ("codec", codec_round, 6),
    ("record walk", walk_round, 3),
    ("encode hazard", encode_hazard_round, 1),
    ("batch scan", scan_round, 2),
    ("produce", produce_round, 2),
    ("produce frame", produce_frame_round, 1),
    ("plain batch", plain_round, 1),
    ("framing", framing_round, 1),
    ("plain write", write_round, 1),
    ("next batch", next_batch_round, 1),
    ("plain append", append_round, 1),
    ("follower batch", follower_round, 1),
]


def run(seconds: float, seed: int = 0) -> dict[str, int]:
    """Rounds until `seconds` have passed (at least one of each); the same seed replays the same inputs."""
    if not (
        codec.COMPILED
        and record_walk.COMPILED
        and R.SCAN_COMPILED
        and produce_codec.COMPILED
        and framing.COMPILED
    ):
        raise RuntimeError("the compiled accelerators are not loaded (python setup.py build_ext --inplace)")
    rng = random.Random(seed)
    done = {name: 0 for name, _, _ in ROUNDS}
    schedule = [(name, fn) for name, fn, weight in ROUNDS for _ in range(weight)]
    deadline = time.monotonic() + seconds
    while min(done.values()) == 0 or time.monotonic() < deadline:
        name, fn = rng.choice(schedule)
        fn(rng)
        done[name] += 1
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    done = run(args.seconds, args.seed)
    print("differential fuzz: " + ", ".join(f"{n} {name} rounds" for name, n in done.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

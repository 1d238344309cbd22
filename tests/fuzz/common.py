"""Shared pieces of the fuzzers: time budget, request-frame strategies, mutators, raw round trips.

The strategies reuse tests/protocol/test_codec.py's generic `instance_strategy`, which builds random
instances of any generated message class from its FIELDS schema facts.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from kbroker.broker.handlers import all_handlers
from kbroker.protocol import codec
from kbroker.protocol import records as R
from kbroker.protocol.messages import FetchRequest, ProduceRequest, RequestHeader

from tests.protocol.test_codec import instance_strategy
from tests.protocol.test_record_walk import VARINT_FIELDS, record_with_widths

# ---------------------------------------------------------------- time budget

# Total wall-clock seconds for the whole tests/fuzz run; each fuzzer takes a share of it.
TOTAL_SECONDS = float(os.environ.get("KBROKER_FUZZ_SECONDS", "60"))
SHARES = {"decoders": 0.16, "records": 0.10, "requests": 0.46, "batches": 0.28, "sasl": 0.12}


def budget(name: str) -> float:
    return TOTAL_SECONDS * SHARES[name]


def run_for(seconds: float, strategy: st.SearchStrategy[Any], check: Callable[[Any], None],
            chunk: int = 40, min_chunks: int = 1) -> int:
    """Run `check` on examples of `strategy` in chunks of `chunk` examples, each chunk with a fixed seed
    (0, 1, 2...), until `seconds` have passed (at least `min_chunks` chunks). Deterministic for a given
    number of chunks; a failure is shrunk by hypothesis inside its chunk and re-raised. Returns chunks run."""
    deadline = time.monotonic() + seconds
    n = 0
    while n < min_chunks or time.monotonic() < deadline:
        test = seed(n)(settings(
            max_examples=chunk, deadline=None, database=None, derandomize=False,
            suppress_health_check=list(HealthCheck), print_blob=True,
        )(given(strategy)(check)))
        test()
        n += 1
    return n


# ---------------------------------------------------------------- what the broker advertises

ADVERTISED: list[tuple[int, int, int]] = sorted((h.api_key, h.min_version, h.max_version) for h in all_handlers())
SUPPORTED = {k: (lo, hi) for k, lo, hi in ADVERTISED}
REQUEST_CASES = [(k, v) for k, lo, hi in ADVERTISED for v in range(lo, hi + 1)]
ALL_CODEC_CASES = [
    (cls, v)
    for table in (codec.REQUESTS, codec.RESPONSES)
    for cls in table.values()
    for v in range(cls.VALID_VERSIONS[0], cls.VALID_VERSIONS[1] + 1)  # type: ignore[attr-defined]
]

# Topics the fuzzers steer some requests at so that handlers go past "unknown topic".
PLAIN_TOPIC = "fuzz-plain"
COMPACT_TOPIC = "fuzz-compact"
HEALTH_TOPIC = "fuzz-health"
KNOWN_TOPICS = [PLAIN_TOPIC, COMPACT_TOPIC]  # not the health topic: the fuzzer may delete these

_TOPIC_ATTRS = {"name", "topic", "topic_name", "resource_name"}
_PARTITION_ATTRS = {"index", "partition_index", "partition"}


# ---------------------------------------------------------------- record batches


@st.composite
def record_batch(draw: st.DrawFn, corrupt: bool = True) -> bytes:
    """A v2 batch (codec 0-4) with random keyed records, then optionally corrupted."""
    compression = draw(st.integers(0, 4))
    n = draw(st.integers(1, 5))
    recs = [
        (draw(st.binary(min_size=1, max_size=8)), draw(st.none() | st.binary(max_size=40)),
         tuple(draw(st.lists(st.tuples(st.text(max_size=4), st.binary(max_size=4)), max_size=2))),
         draw(st.integers(0, 2**41)))
        for _ in range(n)
    ]
    idempotent = draw(st.booleans())
    batch = bytearray(R.build_batch(
        recs, compression=compression,
        producer_id=draw(st.integers(0, 5)) if idempotent else -1,
        producer_epoch=0 if idempotent else -1,
        base_sequence=draw(st.integers(0, 3)) if idempotent else -1,
    ))
    if not corrupt:
        return bytes(batch)
    how = draw(st.sampled_from(["none", "bad_crc", "payload_garbage", "payload_flip", "length_lies",
                                "count_lies", "header_field", "truncate", "tail", "codec_swap", "two",
                                "overlong_varint"]))
    body_start = R.BATCH_HEADER_SIZE

    def fix_crc() -> None:
        struct.pack_into(">I", batch, 17, R.compute_crc(batch, 0, len(batch)))

    if how == "bad_crc":
        i = draw(st.integers(R.BATCH_HEADER_SIZE - 40, len(batch) - 1))
        batch[i] ^= 1 << draw(st.integers(0, 7))
    elif how == "payload_garbage":
        # A payload that is not valid for its codec, with a correct CRC: reaches the decompressor.
        garbage = draw(st.binary(min_size=0, max_size=64))
        if draw(st.booleans()) and len(batch) > body_start + 4:
            garbage = bytes(batch[body_start:body_start + 4]) + garbage  # keep the codec's magic
        del batch[body_start:]
        batch += garbage
        struct.pack_into(">i", batch, 8, len(batch) - R.LOG_OVERHEAD)
        fix_crc()
    elif how == "payload_flip":
        if len(batch) > body_start:
            for _ in range(draw(st.integers(1, 4))):
                i = draw(st.integers(body_start, len(batch) - 1))
                batch[i] = draw(st.integers(0, 255))
        fix_crc()
    elif how == "length_lies":
        struct.pack_into(">i", batch, 8, draw(st.sampled_from(
            [-1, 0, 48, 49, len(batch) - 13, len(batch) - 11, 2**31 - 1, -(2**31)])))
    elif how == "count_lies":
        struct.pack_into(">i", batch, 57, draw(st.sampled_from([0, -1, n + 1, 2**31 - 1, -(2**31)])))
        if draw(st.booleans()):
            struct.pack_into(">i", batch, 23, draw(st.sampled_from([0, -1, n, 2**31 - 1])))
        fix_crc()
    elif how == "header_field":
        # magic, attributes (codec 5-7, control, transactional), timestamps, producer fields
        off, fmt = draw(st.sampled_from([(16, ">b"), (21, ">h"), (27, ">q"), (35, ">q"), (43, ">q"),
                                         (51, ">h"), (53, ">i")]))
        size = struct.calcsize(fmt)
        bits = size * 8
        struct.pack_into(fmt, batch, off, draw(st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)))
        if draw(st.booleans()):
            fix_crc()
    elif how == "truncate":
        del batch[draw(st.integers(0, len(batch) - 1)):]
    elif how == "tail":
        batch += draw(st.binary(min_size=1, max_size=80))
    elif how == "codec_swap":
        # Declare another codec than the payload was written with (CRC fixed).
        attrs = struct.unpack_from(">h", batch, 21)[0]
        struct.pack_into(">h", batch, 21, (attrs & ~7) | draw(st.integers(0, 7)))
        fix_crc()
    elif how == "two":
        batch += draw(record_batch(corrupt=True))
    elif how == "overlong_varint":
        # Record varints written wider than Kafka reads them (5 bytes, 10 for the timestamp delta), CRC fixed.
        widths = draw(st.dictionaries(st.sampled_from(VARINT_FIELDS), st.integers(1, 11), max_size=3))
        body = b"".join(record_with_widths(i, widths if draw(st.booleans()) else {}) for i in range(n))
        del batch[body_start:]
        batch += R.compress(compression, body) if compression else body
        struct.pack_into(">i", batch, 8, len(batch) - R.LOG_OVERHEAD)
        fix_crc()
    return bytes(batch)


def bomb_batch(compression: int, size: int, *, key: bytes | None = b"k") -> bytes:
    """One record whose value is `size` zero bytes, compressed: a small batch that inflates hugely."""
    return R.build_batch([(key, bytes(size), (), int(time.time() * 1000))], compression=compression)


# ---------------------------------------------------------------- request frames


def _steer(obj: Any, topic: str, partition: int, records: bytes | None) -> None:
    """Point topic names, partition indexes and record sets of a generated request at real things."""
    if not is_dataclass(obj):
        return
    for f in fields(obj):
        v = getattr(obj, f.name)
        if f.name in _TOPIC_ATTRS and isinstance(v, str):
            setattr(obj, f.name, topic)
        elif f.name in _PARTITION_ATTRS and isinstance(v, int) and not isinstance(v, bool):
            setattr(obj, f.name, partition)
        elif f.name == "records" and records is not None:
            setattr(obj, f.name, records)
        elif isinstance(v, list):
            for x in v:
                _steer(x, topic, partition, records)
        else:
            _steer(v, topic, partition, records)


@dataclass
class Frame:
    data: bytes
    framing_intact: bool = True  # False: the size prefix lies; nothing may follow it on the connection
    note: str = ""


@dataclass
class Expect:
    """What a response to an intact frame must decode as."""

    by_cid: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    lenient: bool = False  # a framing lie may make the broker parse a frame we did not build


# The seed corpus: whole request frames that once got a wrong answer (tests/fuzz/test_seed_corpus.py replays them
# as they are; the request fuzzer starts from them too).
SEED_FRAMES = [p.read_bytes() for p in sorted(Path(__file__).with_name("corpus").glob("*.bin"))]

_INTERESTING_I32 = [0, -1, 1, 2**31 - 1, -(2**31), 2**24, 0x7FFFFFF0, 65536]
_INTERESTING_I16 = [0, -1, 1, 2**15 - 1, -(2**15)]


@st.composite
def request_frame(draw: st.DrawFn, cid: int, allow_framing_lie: bool) -> Frame:
    if SEED_FRAMES and draw(st.integers(0, 7)) == 0:
        # A frame of the seed corpus (tests/fuzz/corpus, seed_corpus.py) under this correlation id, then mutated.
        buf = bytearray(draw(st.sampled_from(SEED_FRAMES)))
        struct.pack_into(">i", buf, 8, cid)
        api_key, version = struct.unpack_from(">hh", buf, 4)
        note = f"seed frame api {api_key} v{version}"
    else:
        api_key, version = draw(st.sampled_from(REQUEST_CASES))
        cls = codec.REQUESTS[api_key]
        body = draw(instance_strategy(cls, version))
        if draw(st.integers(0, 2)) > 0:
            records = draw(record_batch(corrupt=draw(st.booleans()))) if api_key == 0 else None
            _steer(body, draw(st.sampled_from(KNOWN_TOPICS)), draw(st.integers(-1, 2)), records)
        if api_key == 0 and draw(st.booleans()):
            body.acks = draw(st.sampled_from([-1, 1, 0, 2, -2]))
            body.timeout_ms = draw(st.sampled_from([0, 100, 1000]))
        if api_key == 1:
            body.max_wait_ms = min(body.max_wait_ms, 200) if draw(st.booleans()) else body.max_wait_ms
        header = RequestHeader(api_key, version, cid, draw(st.none() | st.text(max_size=10)))
        buf = bytearray(codec.encode_request(header, body))
        note = f"{cls.__name__} v{version}"

    def fix_size() -> None:
        struct.pack_into(">i", buf, 0, len(buf) - 4)

    how = draw(st.sampled_from(["none", "none", "bitflip", "bytes", "truncate", "int_window", "tail",
                                "version", "api_key", "framing"]))
    note += f" {how}"
    if how == "bitflip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(4, len(buf) - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
    elif how == "bytes":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(12, max(12, len(buf) - 1)))
            if i < len(buf):
                buf[i] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]))
    elif how == "truncate":
        del buf[draw(st.integers(12, len(buf))):]
        fix_size()
    elif how == "int_window" and len(buf) >= 16:
        # A length/count field set to a huge or negative value (whatever field it lands on).
        if draw(st.booleans()):
            i = draw(st.integers(12, len(buf) - 4))
            struct.pack_into(">i", buf, i, draw(st.sampled_from(_INTERESTING_I32)))
        else:
            i = draw(st.integers(12, len(buf) - 2))
            struct.pack_into(">h", buf, i, draw(st.sampled_from(_INTERESTING_I16)))
    elif how == "tail":
        buf += draw(st.binary(min_size=1, max_size=64))
        fix_size()
    elif how == "version":
        lo, hi = SUPPORTED.get(api_key, (0, 0))
        struct.pack_into(">h", buf, 6, draw(st.sampled_from([lo - 1, hi + 1, -1, 2**15 - 1, lo, hi])))
    elif how == "api_key":
        struct.pack_into(">h", buf, 4, draw(st.sampled_from([-1, 4, 5, 6, 7, 17, 24, 57, 67, 999, 2**15 - 1])))
    elif how == "framing" and allow_framing_lie:
        size = draw(st.sampled_from([-1, -(2**31), 0, 7, 2**31 - 1, 200 * 1024 * 1024, len(buf) + 10,
                                     len(buf) - 8]))
        struct.pack_into(">i", buf, 0, size)
        return Frame(bytes(buf), framing_intact=False, note=note + f" size={size}")
    return Frame(bytes(buf), note=note)


@st.composite
def connection_script(draw: st.DrawFn) -> list[Frame]:
    """Frames pipelined on one connection; a lying size prefix can only come last."""
    n = draw(st.integers(1, 6))
    out: list[Frame] = []
    for i in range(n):
        fr = draw(request_frame(cid=1000 + i, allow_framing_lie=(i == n - 1)))
        out.append(fr)
    return out


def expected_responses(frames: list[Frame]) -> Expect:
    exp = Expect()
    for fr in frames:
        if not fr.framing_intact:
            exp.lenient = True
            continue
        if len(fr.data) < 12:
            continue
        api_key, version, cid = struct.unpack_from(">hhi", fr.data, 4)
        versions = [version]
        if api_key == 18:
            versions.append(0)  # KIP-511: an unsupported ApiVersions version is answered as v0
        exp.by_cid.setdefault(cid, []).extend((api_key, v) for v in versions)
    return exp


def check_response(frame: bytes, exp: Expect) -> str | None:
    """None if the response decodes for one of the requests that carried its correlation id."""
    if len(frame) < 4:
        return f"response of {len(frame)} bytes"
    (cid,) = struct.unpack_from(">i", frame, 0)
    cands = exp.by_cid.get(cid)
    if not cands:
        return None if exp.lenient else f"response with unknown correlation id {cid}"
    errors = []
    for api_key, version in cands:
        if api_key not in codec.RESPONSES:
            continue
        cls = codec.RESPONSES[api_key]
        lo, hi = cls.VALID_VERSIONS  # type: ignore[attr-defined]
        if not lo <= version <= hi:
            continue
        try:
            hv = codec.response_header_version(api_key, version)
            _, pos = codec.decode(codec.ResponseHeader, hv, frame, 0)
            _, end = codec.decode(cls, version, frame, pos)
        except codec.DecodeError as e:
            errors.append(f"{cls.__name__} v{version}: {e}")
            continue
        if end == len(frame):
            return None
        errors.append(f"{cls.__name__} v{version}: {len(frame) - end} trailing bytes")
    return f"response cid={cid} does not decode: {errors}"


def exchange(bootstrap: str, frames: list[Frame], idle: float = 0.25, cap: float = 3.0) -> list[str]:
    """Send the frames pipelined on one connection; read responses until all came, the peer closed,
    or `idle` seconds pass without one. Returns problems found in the responses."""
    host, port = bootstrap.rsplit(":", 1)
    exp = expected_responses(frames)
    want = sum(1 for f in frames if f.framing_intact and len(f.data) >= 12)
    problems: list[str] = []
    with socket.create_connection((host, int(port)), timeout=5) as s:
        try:
            s.sendall(b"".join(f.data for f in frames))
        except OSError:
            return problems  # closed while we were still sending: allowed
        buf = bytearray()
        got = 0
        end = time.monotonic() + cap
        s.settimeout(idle)
        while got < want and time.monotonic() < end:
            try:
                chunk = s.recv(1 << 16)
            except TimeoutError:
                break
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 4:
                (size,) = struct.unpack_from(">i", buf, 0)
                if size < 4:
                    problems.append(f"response size prefix {size}")
                    return problems
                if len(buf) < 4 + size:
                    break
                resp = bytes(buf[4:4 + size])
                del buf[:4 + size]
                got += 1
                err = check_response(resp, exp)
                if err:
                    problems.append(err)
    return problems


# ---------------------------------------------------------------- raw client round trip


class Raw:
    """A tiny blocking Kafka client over protocol.codec."""

    def __init__(self, bootstrap: str, timeout: float = 10.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.cid = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by broker")
            buf += chunk
        return bytes(buf)

    def request(self, api_key: int, version: int, body: Any) -> Any:
        self.cid += 1
        self.sock.sendall(codec.encode_request(RequestHeader(api_key, version, self.cid, "fuzz-health"), body))
        (size,) = struct.unpack(">i", self._recv_exact(4))
        cid, resp = codec.decode_response(api_key, version, self._recv_exact(size))
        assert cid == self.cid
        return resp

    def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1) -> Any:
        P = ProduceRequest
        req = P(acks=acks, timeout_ms=10000, topic_data=[P.TopicProduceData(
            name=topic, partition_data=[P.PartitionProduceData(index=partition, records=batch)])])
        resp = self.request(0, 9, req)
        return resp.responses[0].partition_responses[0]

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20) -> Any:
        F = FetchRequest
        req = F(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes, isolation_level=0, topics=[
            F.FetchTopic(topic=topic, partitions=[F.FetchPartition(
                partition=partition, fetch_offset=offset, log_start_offset=-1, partition_max_bytes=max_bytes)])])
        resp = self.request(1, 12, req)
        return resp.responses[0].partitions[0]


_health_round = iter(range(10**9))


def round_trip(bootstrap: str, topic: str = HEALTH_TOPIC) -> None:
    """A raw Produce + Fetch of one fresh record: the broker still serves normal clients."""
    value = f"health-{next(_health_round)}".encode()
    with Raw(bootstrap) as raw:
        p = raw.produce(topic, 0, R.build_batch([(b"h", value, (), int(time.time() * 1000))]))
        assert p.error_code == 0, f"health produce failed with error {p.error_code}"
        f = raw.fetch(topic, 0, p.base_offset)
        assert f.error_code == 0, f"health fetch failed with error {f.error_code}"
        recs = R.decode_records(bytes(f.records))
        assert recs[0].offset == p.base_offset and recs[0].value == value


def vm_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def vm_hwm_mb(pid: int) -> float:
    """Peak RSS (VmHWM) of the process so far."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0

"""Requests generated from the message schemas (the Kafka 3.9 JSON specs, as protocol/messages.py's FIELDS), biased
towards values that reach the broker's checks: existing and unknown topics, groups and transactional ids, negative,
zero and huge numbers, wrong epochs and sequences, valid, corrupt and empty record batches."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import strategies as st
from kbroker.protocol import codec
from kbroker.protocol import records as R
from kbroker.protocol.fieldspec import NEW_STRUCT, FieldSpec

# Topics the session creates on both brokers before generated requests run (name -> partitions).
TOPICS = {"diff-a": 1, "diff-b": 3}
NAMES = ["diff-a", "diff-b", "diff-missing", "", "bad/name", "__consumer_offsets", "g1", "tx1", "x" * 250]
INTS = {
    "int8": [-1, 0, 1, 127, -128],
    "int16": [-1, 0, 1, 2, 32767, -32768],
    "int32": [-1, 0, 1, 2, 3, 100, 2**31 - 1, -(2**31)],
    "int64": [-1, 0, 1, 2, 2**63 - 1, -(2**63)],
    "uint16": [0, 1, 65535],
    "uint32": [0, 1, 2**32 - 1],
}
BOUNDS = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}
# Fields that make a broker wait: kept short so a request answers in well under the harness's socket timeout.
WAITS = {
    "timeout_ms": [0, 100, 1000],
    "max_wait_ms": [0, 50],
    "rebalance_timeout_ms": [0, 100],
    "session_timeout_ms": [-1, 0, 6000, 10000],
    "transaction_timeout_ms": [-1, 0, 60000, 2**31 - 1],
}
NAME_ATTRS = ("name", "topic", "topic_name", "group_id", "transactional_id", "resource_name", "key")

# Not generated: inter-broker and controller messages (only a controller may send them), SASL (needs a SASL
# listener), ApiVersions (compared by itself), and requests that create or delete state at random (they run in
# the stateful scenarios instead, where both brokers see the same history).
EXCLUDED = {4, 5, 6, 7, 17, 18, 19, 20, 27, 36, 37, 43, 45, 46, 56, 57, 58, 67}


def _ints(type_name: str) -> st.SearchStrategy[int]:
    if type_name in BOUNDS:
        b = BOUNDS[type_name]
        return st.sampled_from(INTS[type_name]) | st.integers(-(2**b), 2**b - 1)
    return st.sampled_from(INTS[type_name])


@st.composite
def record_batches(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.sampled_from(["valid", "valid", "idempotent", "corrupt", "empty", "none"]))
    if kind == "none":
        return None
    if kind == "empty":
        return b""
    if kind == "corrupt":
        return draw(st.binary(min_size=1, max_size=80))
    now = int(time.time() * 1000)
    records = [(b"k%d" % i, b"v%d" % i, [], now) for i in range(draw(st.integers(1, 3)))]
    if kind == "idempotent":
        return R.build_batch(
            records,
            producer_id=draw(st.sampled_from([0, 1, 1000])),
            producer_epoch=draw(st.sampled_from([0, 1, -1])),
            base_sequence=draw(st.sampled_from([0, 1, 5, -1])),
        )
    return R.build_batch(records, compression=draw(st.sampled_from([0, 0, 1, 2, 3, 4])))


def _type(cls: type, type_name: str, version: int, attr: str) -> st.SearchStrategy[Any]:
    if type_name == "bool":
        return st.booleans()
    if attr in WAITS and type_name == "int32":
        return st.sampled_from(WAITS[attr])
    if attr == "acks" and type_name == "int16":
        return st.sampled_from([-1, 1, 1, 2, -2])  # never 0: an acks=0 Produce has no answer to compare
    if type_name in INTS:
        return _ints(type_name)
    if type_name == "float64":
        return st.sampled_from([0.0, 1.0, -1.0, 1e12])
    if type_name == "string":
        if attr in NAME_ATTRS:
            return st.sampled_from(NAMES)
        return st.sampled_from(["", "a", "diff-a"]) | st.text(max_size=8)
    if type_name == "records":
        return record_batches()
    if type_name == "bytes":
        return st.binary(max_size=16)
    if type_name == "uuid":
        return st.sampled_from([bytes(16), b"\x01" * 16])
    if type_name.startswith("[]"):
        return st.lists(_type(cls, type_name[2:], version, attr), max_size=3)
    return message(codec._struct_class(cls, type_name), version)


def _field(cls: type, f: FieldSpec, version: int) -> st.SearchStrategy[Any]:
    s = _type(cls, f.type, version, f.attr)
    if f.nullable_in(version) and f.type != "records":
        s = st.none() | s
    if f.tagged_in(version):
        default = codec._struct_class(cls, f.type)() if f.default is NEW_STRUCT else f.default
        s = st.just([] if isinstance(default, list) else default) | s
    return s


def message(cls: type, version: int) -> st.SearchStrategy[Any]:
    """Instances of a request (or request struct) class valid at `version`, biased as described above."""
    kwargs = {f.attr: _field(cls, f, version) for f in cls.FIELDS if f.in_versions(version)}  # type: ignore[attr-defined]
    return st.builds(cls, **kwargs)


def cases(ours: dict[int, tuple[int, int]], theirs: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """Every (api key, version) both brokers advertise, minus EXCLUDED."""
    out = []
    for key, (lo, hi) in sorted(ours.items()):
        if key in EXCLUDED or key not in theirs or key not in codec.REQUESTS:
            continue
        for v in range(max(lo, theirs[key][0]), min(hi, theirs[key][1]) + 1):
            if key == 24 and v >= 4:
                continue  # broker-to-broker verification; Kafka 3.9 never answers one naming no transaction
            out.append((key, v))
    return out

"""Property tests for protocol/codec.py: encode/decode round trips for every advertised API version.

The strategies are built generically from each generated class's FIELDS schema facts, so every
request and response class the broker advertises (broker.handlers.all_handlers()) is covered at
every version in its advertised range, including nested structs, nullable fields and tagged fields.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kbroker.broker.handlers import all_handlers
from kbroker.protocol import codec
from kbroker.protocol.fieldspec import NEW_STRUCT, FieldSpec
from kbroker.protocol.messages import RequestHeader, ResponseHeader

SETTINGS = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}


# ---------------------------------------------------------------- generic strategies


def _default_value(cls: type, f: FieldSpec) -> Any:
    if f.default is NEW_STRUCT:
        return codec._struct_class(cls, f.type)()
    if isinstance(f.default, list):
        return []
    return f.default


def _type_strategy(cls: type, type_name: str, version: int) -> st.SearchStrategy[Any]:
    if type_name == "bool":
        return st.booleans()
    if type_name in _INT_RANGES:
        lo, hi = _INT_RANGES[type_name]
        return st.integers(lo, hi)
    if type_name == "float64":
        return st.floats(allow_nan=False)
    if type_name == "string":
        return st.text(max_size=12)
    if type_name in ("bytes", "records"):
        return st.binary(max_size=24)
    if type_name == "uuid":
        return st.binary(min_size=16, max_size=16)
    if type_name.startswith("[]"):
        return st.lists(_type_strategy(cls, type_name[2:], version), max_size=3)
    return instance_strategy(codec._struct_class(cls, type_name), version)


def _field_strategy(cls: type, f: FieldSpec, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    s = _type_strategy(cls, f.type, version)
    if f.nullable_in(version):
        s = st.none() | s
    if flexible and f.tagged_in(version):
        # A tagged field equal to its default is left off the wire; exercise both paths.
        s = st.just(_default_value(cls, f)) | s
    return s


@functools.cache
def instance_strategy(cls: type, version: int) -> st.SearchStrategy[Any]:
    """Random instances of `cls` valid at `version`: fields absent from the version keep defaults."""
    flexible = codec._flexible(cls, version)
    kwargs = {
        f.attr: _field_strategy(cls, f, version, flexible)
        for f in cls.FIELDS  # type: ignore[attr-defined]
        if f.in_versions(version)
    }
    return st.builds(cls, **kwargs)


def normalize(value: Any) -> Any:
    """A comparable form: records/bytes views become bytes, structs become (name, field values)."""
    fields = getattr(type(value), "FIELDS", None)
    if fields is not None:
        return (type(value).__qualname__, tuple((f.attr, normalize(getattr(value, f.attr))) for f in fields))
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return value


def assert_round_trip(obj: Any, version: int) -> bytes:
    encoded = bytes(codec.encode(obj, version))
    decoded, end = codec.decode(type(obj), version, encoded)
    assert end == len(encoded), f"decode consumed {end} of {len(encoded)} bytes"
    assert normalize(decoded) == normalize(obj)
    # The encoding is canonical: re-encoding the decoded object gives the same bytes.
    assert bytes(codec.encode(decoded, version)) == encoded
    # Decoding at an offset inside a larger buffer works too and reports the absolute end.
    padded = b"\xaa" * 3 + encoded + b"\x55" * 2
    decoded2, end2 = codec.decode(type(obj), version, padded, 3)
    assert end2 == 3 + len(encoded)
    assert normalize(decoded2) == normalize(obj)
    return encoded


# ---------------------------------------------------------------- which APIs


def _advertised() -> list[tuple[int, int, int]]:
    return sorted((h.api_key, h.min_version, h.max_version) for h in all_handlers())


ADVERTISED = _advertised()


def _cls(kind: str, api_key: int) -> type:
    return (codec.REQUESTS if kind == "request" else codec.RESPONSES)[api_key]


CASES = [
    pytest.param(kind, api_key, v, id=f"{_cls(kind, api_key).__name__}-v{v}")
    for api_key, lo, hi in ADVERTISED
    for v in range(lo, hi + 1)
    for kind in ("request", "response")
]


def test_advertised_apis_exist_in_codec() -> None:
    assert ADVERTISED, "the broker advertises no APIs"
    for api_key, lo, hi in ADVERTISED:
        for table in (codec.REQUESTS, codec.RESPONSES):
            cls = table[api_key]
            vlo, vhi = cls.VALID_VERSIONS
            assert vlo <= lo <= hi <= vhi, (cls.__name__, lo, hi)
    assert 18 in {k for k, _, _ in ADVERTISED}, "ApiVersions must be advertised"


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize(("kind", "api_key", "version"), CASES)
def test_round_trip(kind: str, api_key: int, version: int) -> None:
    cls = _cls(kind, api_key)

    @SETTINGS
    @given(instance_strategy(cls, version))
    def check(obj: Any) -> None:
        assert_round_trip(obj, version)

    check()


@pytest.mark.parametrize(("kind", "api_key", "version"), CASES)
def test_default_instance_round_trips(kind: str, api_key: int, version: int) -> None:
    assert_round_trip(_cls(kind, api_key)(), version)


# ---------------------------------------------------------------- truncation and corruption


def filled(cls: type, version: int, salt: int = 1) -> Any:
    """A deterministic instance with every field of `version` set to a non-default value.

    Lists get two elements and nullable fields are set, so the encoding touches every field.
    """
    kwargs = {}
    for i, f in enumerate(cls.FIELDS):  # type: ignore[attr-defined]
        if f.in_versions(version):
            kwargs[f.attr] = _filled_value(cls, f.type, version, salt + i)
    return cls(**kwargs)


def _filled_value(cls: type, type_name: str, version: int, salt: int) -> Any:
    if type_name == "bool":
        return True
    if type_name in _INT_RANGES:
        lo, hi = _INT_RANGES[type_name]
        return lo + (0x5A5A5A5A5A5A5A5A * salt + 7) % (hi - lo + 1)
    if type_name == "float64":
        return salt + 0.25
    if type_name == "string":
        return f"s{salt}-é"
    if type_name in ("bytes", "records"):
        return bytes(range(salt % 7, salt % 7 + 5))
    if type_name == "uuid":
        return bytes((salt + k) % 256 for k in range(16))
    if type_name.startswith("[]"):
        return [_filled_value(cls, type_name[2:], version, salt + k) for k in (11, 23)]
    return filled(codec._struct_class(cls, type_name), version, salt + 31)


TRUNCATION_CASES = [
    pytest.param(kind, api_key, v, id=f"{_cls(kind, api_key).__name__}-v{v}")
    for api_key, lo, hi in ADVERTISED
    for v in sorted({lo, hi})
    for kind in ("request", "response")
]


@pytest.mark.parametrize(("kind", "api_key", "version"), TRUNCATION_CASES)
def test_every_prefix_raises_decode_error(kind: str, api_key: int, version: int) -> None:
    cls = _cls(kind, api_key)
    obj = filled(cls, version)
    encoded = assert_round_trip(obj, version)
    for n in range(len(encoded)):
        with pytest.raises(codec.DecodeError):
            codec.decode(cls, version, encoded[:n])
        with pytest.raises(codec.DecodeError):
            codec.decode(cls, version, memoryview(encoded)[:n])


@pytest.mark.parametrize(("kind", "api_key", "version"), TRUNCATION_CASES)
def test_corrupted_bytes_raise_only_decode_error(kind: str, api_key: int, version: int) -> None:
    """Flipping bytes of a valid encoding either decodes or raises DecodeError, nothing else."""
    cls = _cls(kind, api_key)

    @SETTINGS
    @given(instance_strategy(cls, version), st.data())
    def check(obj: Any, data: st.DataObject) -> None:
        buf = bytearray(codec.encode(obj, version))
        if not buf:
            return
        for _ in range(data.draw(st.integers(1, 3))):
            i = data.draw(st.integers(0, len(buf) - 1))
            buf[i] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]))
        try:
            codec.decode(cls, version, bytes(buf))
        except codec.DecodeError:
            pass

    check()


def test_hostile_lengths_raise_decode_error() -> None:
    # MetadataRequest v4: topics is a nullable int32-length array; a huge count cannot fit.
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.REQUESTS[3], 4, struct.pack(">i", 2**31 - 1) + b"\x00")
    # A negative count other than -1 is invalid even where the array is nullable.
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.REQUESTS[3], 4, struct.pack(">i", -2) + b"\x00")
    # ApiVersions v3 (flexible): a compact string longer than the buffer.
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.REQUESTS[18], 3, b"\x7f" + b"abc")
    # A varint with more than five bytes.
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.REQUESTS[18], 3, b"\xff\xff\xff\xff\xff\xff\x01")
    # Invalid UTF-8 in a string.
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.REQUESTS[18], 3, b"\x02\xff\x01\x00\x00")
    # A tagged field whose size runs past the end of the frame.
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.REQUESTS[18], 3, b"\x01\x01" + b"\x01" + b"\x00\x05" + b"ab")


def test_unknown_tagged_fields_are_skipped() -> None:
    req = codec.REQUESTS[18](client_software_name="kb", client_software_version="1")
    encoded = bytes(codec.encode(req, 3))
    assert encoded[-1] == 0  # no tagged fields
    with_unknown = encoded[:-1] + b"\x02" + b"\x07\x03abc" + b"\x09\x00"
    decoded, end = codec.decode(codec.REQUESTS[18], 3, with_unknown)
    assert end == len(with_unknown)
    assert decoded == req


# ---------------------------------------------------------------- headers


def _flexible(api_key: int, version: int) -> bool:
    rng = codec.REQUESTS[api_key].FLEXIBLE_VERSIONS
    return rng is not None and rng[0] <= version <= rng[1]


HEADER_CASES = [
    pytest.param(api_key, v, id=f"{codec.REQUESTS[api_key].__name__}-v{v}")
    for api_key, lo, hi in ADVERTISED
    for v in range(lo, hi + 1)
]


@pytest.mark.parametrize(("api_key", "version"), HEADER_CASES)
def test_request_header_versions(api_key: int, version: int) -> None:
    hv = codec.request_header_version(api_key, version)
    if (api_key, version) == (7, 0):
        # ControlledShutdown v0 predates the client id: header v0 (api key, version, correlation id).
        assert hv == 0
        frame = bytes(codec.encode_request(RequestHeader(api_key, version, 0x01020304, None),
                                           codec.REQUESTS[api_key]()))
        assert frame[4:12] == struct.pack(">hhi", api_key, version, 0x01020304)
        decoded, pos = codec.decode_request_header(frame[4:])
        assert (decoded.request_api_key, decoded.correlation_id, pos) == (api_key, 0x01020304, 8)
        return
    assert hv == (2 if _flexible(api_key, version) else 1)
    header = RequestHeader(api_key, version, 0x01020304, "client-é")
    body = codec.REQUESTS[api_key]()
    frame = bytes(codec.encode_request(header, body))
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    payload = frame[4:]
    # Common prefix of header v1 and v2: api key, version, correlation id, int16-length client id.
    client = "client-é".encode()
    prefix = struct.pack(">hhih", api_key, version, 0x01020304, len(client)) + client
    assert payload.startswith(prefix)
    body_bytes = bytes(codec.encode(body, version))
    if hv == 2:
        assert payload == prefix + b"\x00" + body_bytes  # empty tagged-field section
    else:
        assert payload == prefix + body_bytes
    decoded, pos = codec.decode_request_header(payload)
    assert decoded == header
    assert pos == len(prefix) + (1 if hv == 2 else 0)
    body2, end = codec.decode(codec.REQUESTS[api_key], version, payload, pos)
    assert end == len(payload)
    assert normalize(body2) == normalize(body)


@SETTINGS
@given(
    st.sampled_from(HEADER_CASES).map(lambda p: p.values),
    st.integers(-(2**31), 2**31 - 1),
    st.none() | st.text(max_size=20),
)
def test_request_header_round_trip(case: tuple[int, int], correlation_id: int, client_id: str | None) -> None:
    api_key, version = case
    header = RequestHeader(api_key, version, correlation_id, client_id)
    frame = bytes(codec.encode_request(header, codec.REQUESTS[api_key]()))
    decoded, _ = codec.decode_request_header(frame[4:])
    assert decoded == header


def test_request_header_null_client_id_bytes() -> None:
    frame = bytes(codec.encode_request(RequestHeader(18, 0, 7, None), codec.REQUESTS[18]()))
    assert frame == struct.pack(">ihhih", 10, 18, 0, 7, -1)
    frame = bytes(codec.encode_request(RequestHeader(18, 3, 7, None), codec.REQUESTS[18]()))
    # header v2: null client id is still int16 -1, then an empty tag section; body: two empty
    # compact strings and an empty tag section.
    assert frame == struct.pack(">ihhih", 14, 18, 3, 7, -1) + b"\x00" + b"\x01\x01\x00"


def test_request_header_rejects_short_frames() -> None:
    for n in range(10):
        with pytest.raises(codec.DecodeError):
            codec.decode_request_header(struct.pack(">hhih", 18, 3, 1, 5)[:n])
    # Header v2 without its tagged-field section.
    with pytest.raises(codec.DecodeError):
        codec.decode_request_header(struct.pack(">hhih", 18, 3, 1, -1))


def test_request_header_unknown_api_key_uses_v1() -> None:
    payload = struct.pack(">hhih", 999, 5, 42, 2) + b"id" + b"rest"
    header, pos = codec.decode_request_header(payload)
    assert header == RequestHeader(999, 5, 42, "id")
    assert pos == 12


def test_controlled_shutdown_v0_header_round_trip() -> None:
    header = RequestHeader(7, 0, 9, "")
    body = codec.REQUESTS[7](broker_id=3)
    frame = bytes(codec.encode_request(header, body))
    assert frame == struct.pack(">ihhii", 12, 7, 0, 9, 3)
    decoded, pos = codec.decode_request_header(frame[4:])
    assert (decoded.request_api_key, decoded.request_api_version, decoded.correlation_id) == (7, 0, 9)
    assert pos == 8


@pytest.mark.parametrize(("api_key", "version"), HEADER_CASES)
def test_response_header_versions(api_key: int, version: int) -> None:
    hv = codec.response_header_version(api_key, version)
    if api_key == 18:
        assert hv == 0, "ApiVersionsResponse always uses response header v0"
    else:
        assert hv == (1 if _flexible(api_key, version) else 0)
    body = codec.RESPONSES[api_key]()
    frame = bytes(codec.encode_response(-5, api_key, version, body))
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    body_bytes = bytes(codec.encode(body, version))
    expected_header = struct.pack(">i", -5) + (b"\x00" if hv == 1 else b"")
    assert frame[4:] == expected_header + body_bytes
    correlation_id, decoded = codec.decode_response(api_key, version, frame[4:])
    assert correlation_id == -5
    assert normalize(decoded) == normalize(body)
    header, pos = codec.decode(ResponseHeader, hv, frame[4:])
    assert header.correlation_id == -5 and pos == len(expected_header)


@pytest.mark.parametrize(("api_key", "version"), HEADER_CASES)
def test_response_frame_round_trip(api_key: int, version: int) -> None:
    @SETTINGS
    @given(instance_strategy(codec.RESPONSES[api_key], version), st.integers(-(2**31), 2**31 - 1))
    def check(body: Any, correlation_id: int) -> None:
        frame = bytes(codec.encode_response(correlation_id, api_key, version, body))
        assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
        cid, decoded = codec.decode_response(api_key, version, frame[4:])
        assert cid == correlation_id
        assert normalize(decoded) == normalize(body)
        for n in range(4, len(frame) - 1):
            with pytest.raises(codec.DecodeError):
                codec.decode_response(api_key, version, frame[4:n])

    check()


def test_api_versions_response_v3_header_is_v0() -> None:
    resp_cls = codec.RESPONSES[18]
    body = resp_cls(error_code=0, api_keys=[resp_cls.ApiVersion(18, 0, 4)], throttle_time_ms=0)
    frame = bytes(codec.encode_response(1, 18, 3, body))
    # size, correlation id (no tag byte), error code, compact array of one ApiVersion with its
    # empty tag section, throttle time, the body's tag section.
    expected_payload = (
        struct.pack(">ih", 1, 0)
        + b"\x02"
        + struct.pack(">hhh", 18, 0, 4)
        + b"\x00"
        + struct.pack(">i", 0)
        + b"\x00"
    )
    assert frame == struct.pack(">i", len(expected_payload)) + expected_payload


def test_multi_byte_varint_lengths_round_trip() -> None:
    """Compact lengths and tagged-field sizes past 127 need multi-byte varints."""
    req_cls = codec.REQUESTS[3]  # MetadataRequest, flexible from v9
    topics = [req_cls.MetadataRequestTopic(name="t" * 200) for _ in range(130)]
    req = req_cls(topics=topics, allow_auto_topic_creation=True)
    encoded = assert_round_trip(req, 12)
    assert encoded[:2] == bytes([0x83, 0x01])  # 131 = 130 elements + 1
    resp_cls = codec.RESPONSES[18]  # ApiVersionsResponse v3: supported_features is tagged (tag 0)
    features = [
        resp_cls.SupportedFeatureKey(name=f"feature-{i}", min_version=1, max_version=2) for i in range(40)
    ]
    resp = resp_cls(api_keys=[resp_cls.ApiVersion(18, 0, 4)], supported_features=features)
    assert_round_trip(resp, 3)
    produce_cls = codec.REQUESTS[0]
    data = produce_cls.PartitionProduceData(index=1, records=bytes(range(256)) * 100)
    produce = produce_cls(topic_data=[produce_cls.TopicProduceData(name="x", partition_data=[data])])
    for version in (3, 9, 11):
        assert_round_trip(produce, version)

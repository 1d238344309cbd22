"""The compiled codec (protocol/_codec.c) against its reference, the generated Python codec: for every request and
response the broker advertises, at every version, the same bytes from the same object, the same object from the
same bytes, and DecodeError for the same malformed input (truncations and corrupted bytes)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kbroker.protocol import codec

from tests.protocol.test_codec import (
    CASES,
    SETTINGS,
    TRUNCATION_CASES,
    _cls,
    filled,
    instance_strategy,
    normalize,
)

pytestmark = pytest.mark.skipif(not codec.COMPILED, reason="protocol/_codec.c not built (python setup.py build_ext "
                                                          "--inplace), or KBROKER_PURE_PYTHON is set")

FEWER = settings(SETTINGS, max_examples=10)


def both_encode(obj: Any, version: int) -> bytes:
    ext_c: list[tuple[int, Any]] = []
    ext_py: list[tuple[int, Any]] = []
    out_c, out_py = bytearray(b"xy"), bytearray(b"xy")  # an encoder appends to what is there
    codec.plan(type(obj), version).encode(obj, out_c, ext_c)
    codec.py_encoder(type(obj), version)(obj, out_py, ext_py)
    assert bytes(out_c) == bytes(out_py)
    assert ext_c == ext_py
    return bytes(out_c[2:])


def both_decode(cls: type, version: int, buf: Any, pos: int = 0) -> Any:
    """Both decode buf alike: equal objects and end positions, or DecodeError from both."""
    try:
        py = codec.py_decoder(cls, version)(buf, pos)
    except (codec.DecodeError, struct.error, IndexError, OverflowError, MemoryError, ValueError) as e:
        # codec.decode maps the Python decoder's struct/index errors to DecodeError; the C one raises it directly
        with pytest.raises(codec.DecodeError):
            codec.plan(cls, version).decode(buf, pos)
        return e
    c = codec.plan(cls, version).decode(buf, pos)
    assert c[1] == py[1]
    assert normalize(c[0]) == normalize(py[0])
    return c[0]


@pytest.mark.parametrize(("kind", "api_key", "version"), CASES)
def test_compiled_codec_matches_python(kind: str, api_key: int, version: int) -> None:
    cls = _cls(kind, api_key)

    @FEWER
    @given(instance_strategy(cls, version), st.data())
    def check(obj: Any, data: st.DataObject) -> None:
        encoded = both_encode(obj, version)
        decoded = both_decode(cls, version, encoded)
        assert normalize(decoded) == normalize(obj)
        both_decode(cls, version, b"\x00" + encoded, 1)
        if encoded:
            buf = bytearray(encoded)
            for _ in range(data.draw(st.integers(1, 3))):
                i = data.draw(st.integers(0, len(buf) - 1))
                buf[i] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]))
            both_decode(cls, version, bytes(buf))

    check()


@pytest.mark.parametrize(("kind", "api_key", "version"), TRUNCATION_CASES)
def test_compiled_codec_refuses_every_prefix_like_python(kind: str, api_key: int, version: int) -> None:
    cls = _cls(kind, api_key)
    encoded = both_encode(filled(cls, version), version)
    for n in range(len(encoded)):
        assert isinstance(both_decode(cls, version, memoryview(encoded)[:n]), Exception)


def test_records_decode_to_a_writable_view_of_a_writable_frame() -> None:
    """The produce path rewrites base offsets in place in the request frame's records."""
    from kbroker.protocol.messages import ProduceRequest

    req = ProduceRequest(acks=1, timeout_ms=5, topic_data=[ProduceRequest.TopicProduceData(
        name="t", partition_data=[ProduceRequest.PartitionProduceData(index=0, records=b"abcdef")])])
    frame = bytearray(codec.encode(req, 9))
    got, _ = codec.plan(ProduceRequest, 9).decode(frame, 0)
    records = got.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and not records.readonly
    records[0] = ord("A")
    assert b"Abcdef" in frame


def test_encoding_a_wrong_class_or_an_out_of_range_value_raises() -> None:

    from kbroker.protocol.messages import ProduceRequest, ProduceResponse

    with pytest.raises(TypeError):
        codec.plan(ProduceRequest, 9).encode(ProduceResponse(), bytearray(), None)
    with pytest.raises(struct.error):
        codec.plan(ProduceRequest, 9).encode(ProduceRequest(acks=1 << 20), bytearray(), None)
    with pytest.raises(ValueError):
        codec.plan(ProduceRequest, 9).encode(ProduceRequest(topic_data=None), bytearray(), None)


@pytest.mark.parametrize("length", [32767, 32768, 40000])
def test_both_codecs_refuse_compact_strings_longer_than_kafka_reads(length: int) -> None:
    # Kafka's generated readers refuse strings longer than 0x7fff bytes, compact (varint-prefixed) ones too:
    # a Metadata v9 topic name, a nullable compact string (a CreateTopics v5 config value) and the client id.
    from kbroker.protocol.messages import CreateTopicsRequest, MetadataRequest
    from kbroker.protocol.primitives import read_string, write_uvarint

    C = CreateTopicsRequest
    cases = [
        (MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="x" * length)]), 9),
        (C(topics=[C.CreatableTopic(name="t", configs=[C.CreatableTopicConfig(name="k", value="v" * length)])]), 5),
    ]
    for obj, version in cases:
        got = both_decode(type(obj), version, both_encode(obj, version))
        assert isinstance(got, Exception) == (length > 32767), (type(obj).__name__, length)
    compact = bytearray()
    write_uvarint(compact, length + 1)
    compact += b"z" * length
    if length > 32767:
        with pytest.raises(codec.DecodeError, match="invalid length"):
            read_string(bytes(compact), 0, True, True)
    else:
        assert read_string(bytes(compact), 0, True, True) == ("z" * length, len(compact))


class _ClearsOnBool:
    """A bool field's value whose truth test empties the list that holds its struct (Python code run mid-encode)."""

    def __init__(self, victim: list[Any]) -> None:
        self.victim = victim

    def __bool__(self) -> bool:
        self.victim.clear()
        import gc

        gc.collect()
        return True


class _GrowsOnBool(_ClearsOnBool):
    def __bool__(self) -> bool:
        if len(self.victim) < 64:
            self.victim.extend(self.victim[1:2] * 64)  # the list's item storage moves
        return False


@pytest.mark.parametrize("evil", [_ClearsOnBool, _GrowsOnBool])
def test_a_list_changed_while_its_items_encode_is_refused_by_both(evil: type) -> None:
    # protocol/_codec.c used to keep a borrowed pointer into the list's items while encoding them: a heap
    # use-after-free under ASan (tools/sanitize_build.py). Both encoders now refuse the changed list.
    from kbroker.protocol.messages import MetadataResponse

    M = MetadataResponse
    for version in (1, 12):
        for encode in (codec.plan(M, version).encode, codec.py_encoder(M, version)):
            topics = [M.MetadataResponseTopic(name=f"t{i}", partitions=[]) for i in range(3)]
            topics[0].is_internal = evil(topics)
            with pytest.raises(RuntimeError, match="changed size during encoding"):
                encode(M(topics=topics), bytearray(), None)

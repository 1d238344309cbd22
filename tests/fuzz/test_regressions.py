"""Minimal examples of the bugs the fuzzers found, replayed against a real broker.

Bugs fixed in protocol/ or storage/ are plain tests; bugs outside tests/fuzz's remit (reported to their
owners, listed in known_bugs.py) are xfail(strict=True), so the fix makes them fail until the xfail goes."""

from __future__ import annotations

import pytest
from kbroker.protocol import codec
from kbroker.protocol import records as R
from kbroker.protocol.messages import MetadataRequest, RequestHeader

from tests.broker_process import BrokerProcess
from tests.fuzz.common import PLAIN_TOPIC, Raw, round_trip
from tests.protocol.test_record_walk import record_with_widths


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_null_topic_name_before_v12(fuzz_broker: BrokerProcess, version: int) -> None:
    # Found by test_request_frames: MetadataRequest v11, topics=[{topic_id: zero uuid, name: null}].
    req = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(topic_id=bytes(16), name=None)],
                          allow_auto_topic_creation=False)
    with Raw(fuzz_broker.bootstrap) as raw:
        resp = raw.request(3, version, req)
    assert resp.topics[0].error_code == 42  # INVALID_REQUEST, as Kafka
    round_trip(fuzz_broker.bootstrap)


def _batch_around(body: bytes, count: int) -> bytes:
    batch = bytearray(R.build_batch([(b"k", b"v", (), 1_700_000_000_000)] * count))
    del batch[R.BATCH_HEADER_SIZE:]
    batch += body
    batch[8:12] = (len(batch) - R.LOG_OVERHEAD).to_bytes(4, "big")
    batch[17:21] = R.compute_crc(batch, 0, len(batch)).to_bytes(4, "big")
    return bytes(batch)


@pytest.mark.parametrize("field", ["key", "length", "headers", "header_value"])
def test_record_varint_of_ten_bytes(fuzz_broker: BrokerProcess, field: str) -> None:
    # Found by the ASan/UBSan differential fuzz of the two record walks: a key length of 1 written as 10 bytes
    # (and the same for the other int32 record fields) was stored under a valid CRC; a Java consumer stops there.
    batch = _batch_around(record_with_widths(0, {field: 10}), 1)
    with Raw(fuzz_broker.bootstrap) as raw:
        before = raw.fetch(PLAIN_TOPIC, 2, 0).high_watermark
        resp = raw.produce(PLAIN_TOPIC, 2, batch)
        assert resp.error_code == 87, (resp.error_code, resp.error_message)  # INVALID_RECORD, as Kafka
        assert raw.fetch(PLAIN_TOPIC, 2, 0).high_watermark == before
    round_trip(fuzz_broker.bootstrap)


def test_compact_string_of_32768_bytes(fuzz_broker: BrokerProcess) -> None:
    # Found by the differential fuzz: a Metadata v9 topic name of 32,768 bytes decoded; Kafka's readers refuse
    # strings over 0x7fff bytes and the connection is closed without an answer.
    req = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="n" * 32768)],
                          allow_auto_topic_creation=True)
    with Raw(fuzz_broker.bootstrap) as raw:
        raw.sock.sendall(codec.encode_request(RequestHeader(3, 9, 1, "fuzz"), req))
        raw.sock.settimeout(5)
        assert raw.sock.recv(1) == b""
    round_trip(fuzz_broker.bootstrap)

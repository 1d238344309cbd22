"""Malformed and hostile input on raw sockets: the broker drops the offending connection and keeps serving."""

from __future__ import annotations

import os
import random
import socket
import struct

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol import codec
from kbroker.protocol.accelerators import PURE_PYTHON_ENV
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ApiVersionsRequest, MetadataRequest, RequestHeader

from tests.broker_process import BrokerProcess
from tests.clients import Msg, RawClient, ck_consume, ck_produce

T = 15


@pytest.fixture(scope="module")
def health_topic(broker) -> str:
    name = "bad-input-health"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(T)
    return name


_rounds = iter(range(10**6))


def assert_healthy(broker, topic: str) -> None:  # type: ignore[no-untyped-def]
    """The process is alive and a fresh confluent producer/consumer round trip works."""
    assert broker.alive(), broker.read_log()[-3000:]
    value = f"ping-{next(_rounds)}".encode()
    [rec] = ck_produce(broker.bootstrap, topic, [Msg(b"k", value, partition=0)], timeout=T)
    got = ck_consume(broker.bootstrap, topic, [0], 1, timeout=T, offset=rec.offset)
    assert [r.value for r in got] == [value]
    with RawClient(broker.bootstrap) as raw:
        assert raw.request(18, 0, ApiVersionsRequest()).error_code == 0


def header_bytes(api_key: int, version: int, correlation_id: int = 7, client_id: str | None = "bad") -> bytes:
    hv = 2 if api_key in codec.REQUESTS and codec.is_flexible(api_key, min(version, 32767)) else 1
    return bytes(codec.encode(RequestHeader(request_api_key=api_key, request_api_version=version,
                                            correlation_id=correlation_id, client_id=client_id), hv))


def sized(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def assert_closed(broker, data: bytes, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    with RawClient(broker.bootstrap) as raw:
        raw.send_bytes(data)
        assert raw.closed_by_peer(timeout), f"connection not closed after {data[:40]!r}"


@pytest.mark.parametrize("data", [
    pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
    pytest.param(random.Random(1).randbytes(64), id="random"),
    pytest.param(sized(random.Random(2).randbytes(60)), id="random-sized"),
    pytest.param(b"\x7f\xff\xff\xff" + b"x" * 100, id="huge-length"),
    pytest.param(b"\xff\xff\xff\xff" + b"x" * 100, id="negative-length"),
    pytest.param(b"\x80\x00\x00\x00", id="min-int-length"),
    pytest.param(b"\x00\x00\x00\x00", id="zero-length"),
    pytest.param(b"\x00\x00\x00\x04abcd", id="shorter-than-header"),
    pytest.param(sized(b"\x00\x03\x00\x01\x00\x00\x00\x01\x7f\xff"), id="client-id-overruns-frame"),
    pytest.param(sized(header_bytes(999, 0)), id="unknown-api-key"),
    pytest.param(sized(header_bytes(-1, 0)), id="negative-api-key"),
    pytest.param(sized(header_bytes(3, 50) + b"\x00" * 8), id="metadata-v50"),
    pytest.param(sized(header_bytes(0, 12) + b"\x00" * 20), id="produce-v12-unsupported"),
    pytest.param(sized(header_bytes(3, 1) + b"\x00\x00"), id="truncated-body"),
    pytest.param(sized(header_bytes(3, 1) + b"\x7f\xff\xff\xff"), id="array-count-overruns-frame"),
    pytest.param(sized(header_bytes(3, 9) + b"\xff\xff\xff\xff\x0f"), id="bad-varint"),
    pytest.param(sized(header_bytes(0, 9) + b"\x01" + b"\x00" * 30), id="produce-garbage-body"),
])
def test_bad_frame_closes_connection(broker, health_topic, data):
    assert_closed(broker, data)
    assert_healthy(broker, health_topic)
    assert "Traceback" not in broker.read_log()


def test_truncated_frame_then_eof(broker, health_topic):
    """Size says 100 bytes, 20 arrive, then the client half-closes: the broker drops it without a response."""
    with RawClient(broker.bootstrap) as raw:
        raw.send_bytes(struct.pack(">i", 100) + header_bytes(3, 1) + b"\x00" * 5)
        raw.sock.shutdown(socket.SHUT_WR)
        assert raw.closed_by_peer(5)
    assert_healthy(broker, health_topic)


def test_partial_frame_does_not_block_others(broker, health_topic):
    """A client stuck mid-frame (slowloris) holds only its own connection."""
    stuck = [RawClient(broker.bootstrap) for _ in range(5)]
    try:
        for i, s in enumerate(stuck):
            s.send_bytes((struct.pack(">i", 1000) + header_bytes(3, 1))[: 2 + i * 3])
        assert_healthy(broker, health_topic)
        # The stuck connections are still open (nothing wrong has arrived yet) ...
        assert not stuck[0].closed_by_peer(0.2)
        # ... and one of them can still complete a valid request.
        body = bytes(codec.encode(MetadataRequest(topics=[]), 1))
        frame = sized(header_bytes(3, 1, correlation_id=42) + body)
        s = RawClient(broker.bootstrap)
        s.send_bytes(frame[:5])
        s.send_bytes(frame[5:])
        cid, resp = codec.decode_response(3, 1, s.recv_frame())
        assert cid == 42 and resp.brokers[0].node_id == 0
        s.close()
    finally:
        for s in stuck:
            s.close()


def test_api_versions_unsupported_version(broker, health_topic):
    """KIP-511: ApiVersions v99 is answered as v0 with UNSUPPORTED_VERSION and the supported ranges."""
    body = bytes(codec.encode(ApiVersionsRequest(client_software_name="future", client_software_version="9"), 3))
    with RawClient(broker.bootstrap) as raw:
        raw.send_bytes(sized(header_bytes(18, 99, correlation_id=1234) + body))
        cid, resp = codec.decode_response(18, 0, raw.recv_frame())
        assert cid == 1234
        assert resp.error_code == ErrorCode.UNSUPPORTED_VERSION == 35
        ranges = {a.api_key: (a.min_version, a.max_version) for a in resp.api_keys}
        assert ranges[18] == (0, 4)
        assert ranges[3] == (0, 12)
        assert ranges[0][1] >= 9 and ranges[1][1] >= 12
        # The connection stays usable: retry with a supported version, like a real client does.
        resp = raw.request(18, 3, ApiVersionsRequest(client_software_name="future", client_software_version="9"))
        assert resp.error_code == 0
        assert {a.api_key for a in resp.api_keys} == set(ranges)
    assert_healthy(broker, health_topic)


def test_api_versions_every_version(broker):
    with RawClient(broker.bootstrap) as raw:
        for v in range(5):
            body = ApiVersionsRequest(client_software_name="kbroker-tests", client_software_version="1.0")
            resp = raw.request(18, v, body)
            assert resp.error_code == 0
            keys = {a.api_key for a in resp.api_keys}
            assert {0, 1, 2, 3, 18, 19, 20, 21, 23, 32, 33, 37, 44, 60} <= keys


def test_pipelined_requests_answered_in_order(broker):
    """Several requests written back to back on one connection come back in order, matched by correlation id."""
    with RawClient(broker.bootstrap) as raw:
        frames = b"".join(raw.frame(18 if i % 2 else 3, 1, ApiVersionsRequest() if i % 2 else MetadataRequest(
            topics=[])) for i in range(20))
        first = raw.correlation_id - 19
        raw.send_bytes(frames)
        for i in range(20):
            api = 18 if i % 2 else 3
            cid, _ = codec.decode_response(api, 1, raw.recv_frame())
            assert cid == first + i


def test_answers_before_a_malformed_request_still_arrive(broker, health_topic):
    """Answers to one read's requests go out in one write after them; a malformed request at the end of the read
    closes the connection, but only after the answers owed to the valid requests before it."""
    with RawClient(broker.bootstrap) as raw:
        good = b"".join(raw.frame(18, 1, ApiVersionsRequest()) for _ in range(3))
        first = raw.correlation_id - 2
        raw.send_bytes(good + sized(header_bytes(3, 1, 99) + b"\xff\xff\xff"))  # a Metadata body cut short
        for i in range(3):
            cid, resp = codec.decode_response(18, 1, raw.recv_frame())
            assert (cid, resp.error_code) == (first + i, 0)
        assert raw.closed_by_peer(5)
    assert_healthy(broker, health_topic)


def test_client_disconnects_mid_long_poll(broker, health_topic):
    """Closing a connection that has a parked Fetch must not hurt the broker."""
    from kbroker.protocol.messages import FetchRequest as F

    for _ in range(5):
        raw = RawClient(broker.bootstrap)
        req = F(replica_id=-1, max_wait_ms=3000, min_bytes=1 << 20, max_bytes=1 << 20,
                topics=[F.FetchTopic(topic=health_topic, partitions=[F.FetchPartition(
                    partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
        raw.send_bytes(raw.frame(1, 11, req))
        raw.close()
    assert_healthy(broker, health_topic)


def test_many_bad_connections_at_once(broker, health_topic):
    socks = []
    for i in range(50):
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        s.sendall(os.urandom(16) if i % 2 else b"\x7f\xff\xff\xff")
        socks.append(s)
    for s in socks:
        s.close()
    assert_healthy(broker, health_topic)


def _metadata_frame(name: str, auto_create: bool) -> bytes:
    M = MetadataRequest
    body = M(topics=[M.MetadataRequestTopic(name=name)], allow_auto_topic_creation=auto_create)
    return sized(header_bytes(3, 9) + bytes(codec.encode(body, 9)))


@pytest.mark.parametrize("path", ["compiled", "pure-python"])
def test_compact_string_longer_than_32767_bytes_closes_connection(broker, health_topic, tmp_path, path):
    # Kafka's generated readers refuse any string longer than 0x7fff bytes, a compact one too although its varint
    # could announce more ("string field name had invalid length 32768"); the request fails to parse and Kafka
    # closes the connection. 32767 bytes still parse: Metadata answers INVALID_TOPIC_EXCEPTION (Topic.validate,
    # too long a name) as Kafka does without auto-creation.
    target = broker
    if path == "pure-python":
        target = BrokerProcess(tmp_path, env={PURE_PYTHON_ENV: "1"}).start()
    try:
        assert_closed(target, _metadata_frame("x" * 32768, auto_create=True))
        with RawClient(target.bootstrap) as raw:
            raw.send_bytes(_metadata_frame("y" * 32767, auto_create=False))
            _, resp = codec.decode_response(3, 9, raw.recv_frame())
            assert resp.topics[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
            # nothing was created by the refused request
            everything = raw.request(3, 9, MetadataRequest(topics=None, allow_auto_topic_creation=False))
            assert not [t.name for t in everything.topics if t.name.startswith("x")]
        if path == "compiled":
            assert_healthy(broker, health_topic)
        assert target.alive() and "Traceback" not in target.read_log()
    finally:
        if target is not broker:
            target.stop()

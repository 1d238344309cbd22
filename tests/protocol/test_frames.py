"""Fixed byte vectors: request frames exactly as real Kafka clients send them.

tests/protocol/vectors/*.hex were captured from a raw TCP listener (the Capture class below) that
answers ApiVersions and records every frame: librdkafka through confluent-kafka, kafka-python, and
the kcat CLI. Each vector must decode (header and body) to the fields the client sent and re-encode
to the identical bytes. The live tests capture fresh frames from the installed clients the same
way, so a client upgrade that changes its opening requests shows up here.
"""

from __future__ import annotations

import shutil
import socketserver
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kbroker.broker.handlers import all_handlers
from kbroker.protocol import codec
from kbroker.protocol.messages import RequestHeader

VECTORS = Path(__file__).parent / "vectors"
API_VERSIONS, METADATA = 18, 3
UNSUPPORTED_VERSION = 35


def load_vector(name: str) -> bytes:
    text = (VECTORS / f"{name}.hex").read_text()
    return bytes.fromhex("".join(line for line in text.splitlines() if not line.startswith("#")))


def decode_request_frame(frame: bytes) -> tuple[RequestHeader, Any]:
    """Decode a size-prefixed request frame the way the broker does: header, then body."""
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4, "size prefix does not match the frame"
    payload = frame[4:]
    header, pos = codec.decode_request_header(payload)
    body, end = codec.decode(codec.REQUESTS[header.request_api_key], header.request_api_version, payload, pos)
    assert end == len(payload), f"body decode stopped at {end} of {len(payload)}"
    return header, body


def assert_reencodes(frame: bytes) -> tuple[RequestHeader, Any]:
    header, body = decode_request_frame(frame)
    assert bytes(codec.encode_request(header, body)) == frame
    return header, body


# ---------------------------------------------------------------- committed vectors

# name -> (api key, version, correlation id, client id, expected body fields)
EXPECTED: dict[str, tuple[int, int, int, str, dict[str, Any]]] = {
    "librdkafka_api_versions_v3": (
        API_VERSIONS,
        3,
        1,
        "kbroker-test",
        {
            "client_software_name": "confluent-kafka-python",
            "client_software_version": "2.16.1-rdkafka-2.16.0",
        },
    ),
    "librdkafka_api_versions_v0": (API_VERSIONS, 0, 2, "kbroker-test", {}),
    "librdkafka_metadata_v12": (
        METADATA,
        12,
        2,
        "kbroker-test",
        {"topics": [], "allow_auto_topic_creation": False, "include_topic_authorized_operations": False},
    ),
    "kafka_python_api_versions_v4": (
        API_VERSIONS,
        4,
        1,
        "kbroker-test",
        {"client_software_name": "kafka-python", "client_software_version": "3.0.12"},
    ),
    "kafka_python_api_versions_v0": (API_VERSIONS, 0, 2, "kbroker-test", {}),
    "kafka_python_metadata_v12": (
        METADATA,
        12,
        2,
        "kbroker-test",
        {"topics": [], "allow_auto_topic_creation": True, "include_topic_authorized_operations": False},
    ),
    "kcat_api_versions_v3": (
        API_VERSIONS,
        3,
        1,
        "rdkafka",
        {"client_software_name": "librdkafka", "client_software_version": "2.0.2"},
    ),
    "kcat_metadata_v4": (METADATA, 4, 2, "rdkafka", {"topics": [], "allow_auto_topic_creation": False}),
}


def test_every_vector_file_is_checked() -> None:
    assert sorted(p.stem for p in VECTORS.glob("*.hex")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_captured_vector_decodes_and_reencodes(name: str) -> None:
    api_key, version, correlation_id, client_id, fields = EXPECTED[name]
    frame = load_vector(name)
    header, body = assert_reencodes(frame)
    assert header == RequestHeader(api_key, version, correlation_id, client_id)
    assert type(body) is codec.REQUESTS[api_key]
    for attr, value in fields.items():
        assert getattr(body, attr) == value, attr


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_captured_vector_truncations_raise_decode_error(name: str) -> None:
    payload = load_vector(name)[4:]
    header, pos = codec.decode_request_header(payload)
    cls = codec.REQUESTS[header.request_api_key]
    for n in range(len(payload)):
        with pytest.raises(codec.DecodeError):
            _, hpos = codec.decode_request_header(payload[:n])
            codec.decode(cls, header.request_api_version, payload[:n], hpos)


def test_flexible_vector_layout() -> None:
    """librdkafka's ApiVersions v3, byte by byte: header v2 keeps an int16 client id, the body is compact."""
    frame = load_vector("librdkafka_api_versions_v3")
    name, version = b"confluent-kafka-python", b"2.16.1-rdkafka-2.16.0"
    payload = (
        struct.pack(">hhih", 18, 3, 1, 12)
        + b"kbroker-test"
        + b"\x00"  # header tagged fields
        + bytes([len(name) + 1])
        + name
        + bytes([len(version) + 1])
        + version
        + b"\x00"  # body tagged fields
    )
    assert frame == struct.pack(">i", len(payload)) + payload


# ---------------------------------------------------------------- hand-built from the protocol docs


def test_api_versions_request_v0_exact_bytes() -> None:
    # Request Header v1 => request_api_key request_api_version correlation_id client_id
    #   (INT16, INT16, INT32, NULLABLE_STRING as INT16 length + UTF-8); ApiVersions v0 has an empty body.
    expected = bytes.fromhex(
        "00000011"  # size: 17 bytes follow
        "0012"  # api_key 18 (ApiVersions)
        "0000"  # api_version 0
        "0000002a"  # correlation_id 42
        "0007"  # client_id length 7
        "72646b61666b61"  # "rdkafka"
    )
    header = RequestHeader(request_api_key=18, request_api_version=0, correlation_id=42, client_id="rdkafka")
    assert bytes(codec.encode_request(header, codec.REQUESTS[18]())) == expected
    decoded, body = decode_request_frame(expected)
    assert decoded == header
    assert body == codec.REQUESTS[18]()


def test_api_versions_response_v0_exact_bytes() -> None:
    # Response Header v0 => correlation_id; ApiVersions Response v0 => error_code [api_keys]
    #   with api_keys as INT32 count then (api_key, min_version, max_version) INT16 triples.
    payload = bytes.fromhex(
        "0000002a"  # correlation_id 42
        "0023"  # error_code 35 UNSUPPORTED_VERSION
        "00000001"  # one api key
        "0012"
        "0000"
        "0004"  # ApiVersions 0..4
    )
    resp_cls = codec.RESPONSES[18]
    body = resp_cls(error_code=35, api_keys=[resp_cls.ApiVersion(18, 0, 4)])
    assert bytes(codec.encode_response(42, 18, 0, body)) == struct.pack(">i", len(payload)) + payload
    assert codec.decode_response(18, 0, payload) == (42, body)


# ---------------------------------------------------------------- live capture from real clients


class Capture:
    """A raw TCP listener on 127.0.0.1 that records request frames.

    It answers ApiVersions with the broker's advertised versions (mode "versions") or, for any
    version above 0, with UNSUPPORTED_VERSION in a v0 body the way Kafka does (mode "error"), and
    closes the connection on any other request, which it records first.
    """

    def __init__(self, mode: str = "versions") -> None:
        self.frames: list[bytes] = []
        self.mode = mode
        capture = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                stream = self.request.makefile("rb")
                while True:
                    size = stream.read(4)
                    if len(size) < 4:
                        return
                    payload = stream.read(struct.unpack(">i", size)[0])
                    capture.frames.append(size + payload)
                    api_key, version, correlation_id = struct.unpack_from(">hhi", payload)
                    if api_key != API_VERSIONS:
                        return
                    self.request.sendall(capture.api_versions_answer(version, correlation_id))

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def api_versions_answer(self, version: int, correlation_id: int) -> bytes:
        resp_cls = codec.RESPONSES[API_VERSIONS]
        if self.mode == "error" and version > 0:
            body = resp_cls(
                error_code=UNSUPPORTED_VERSION, api_keys=[resp_cls.ApiVersion(API_VERSIONS, 0, 0)]
            )
            return bytes(codec.encode_response(correlation_id, API_VERSIONS, 0, body))
        keys = [resp_cls.ApiVersion(h.api_key, h.min_version, h.max_version) for h in all_handlers()]
        return bytes(codec.encode_response(correlation_id, API_VERSIONS, version, resp_cls(api_keys=keys)))

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_for(self, api_key: int, timeout: float = 10.0, version: int | None = None) -> bytes:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for frame in list(self.frames):
                k, v = struct.unpack_from(">hh", frame, 4)
                if k == api_key and (version is None or v == version):
                    return frame
            time.sleep(0.02)
        seen = [struct.unpack_from(">hh", f, 4) for f in self.frames]
        raise AssertionError(f"no request {api_key} v{version} captured; saw {seen}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def capture() -> Any:
    cap = Capture()
    yield cap
    cap.close()


@pytest.fixture
def capture_error() -> Any:
    cap = Capture("error")
    yield cap
    cap.close()


def _rdkafka_producer(bootstrap: str) -> Any:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    return confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "client.id": "kbroker-live", "log_level": 0}
    )


def test_live_librdkafka_opening_frames(capture: Capture) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    producer = _rdkafka_producer(capture.bootstrap)
    try:
        api_versions = capture.wait_for(API_VERSIONS)
        metadata = capture.wait_for(METADATA)
    finally:
        producer.flush(0)
        del producer
    header, body = assert_reencodes(api_versions)
    assert header.request_api_version in (3, 4)
    assert header.client_id == "kbroker-live"
    assert body.client_software_name == "confluent-kafka-python"
    assert body.client_software_version == (
        f"{confluent_kafka.__version__}-rdkafka-{confluent_kafka.libversion()[0]}"
    )
    header, _ = assert_reencodes(metadata)
    assert header.client_id == "kbroker-live"


def test_live_librdkafka_falls_back_to_api_versions_v0(capture_error: Capture) -> None:
    producer = _rdkafka_producer(capture_error.bootstrap)
    try:
        first = capture_error.wait_for(API_VERSIONS)
        retry = capture_error.wait_for(API_VERSIONS, version=0)
    finally:
        producer.flush(0)
        del producer
    assert assert_reencodes(first)[0].request_api_version in (3, 4)
    header, body = assert_reencodes(retry)
    assert header.client_id == "kbroker-live"
    assert body == codec.REQUESTS[API_VERSIONS]()


def test_live_kafka_python_opening_frames(capture: Capture) -> None:
    kafka = pytest.importorskip("kafka")
    errors = pytest.importorskip("kafka.errors")
    try:
        kafka.KafkaProducer(
            bootstrap_servers=capture.bootstrap, client_id="kbroker-live", bootstrap_timeout_ms=1500
        )
    except errors.KafkaError:
        pass  # the capture closes the connection on Metadata, so bootstrapping fails after the capture
    header, body = assert_reencodes(capture.wait_for(API_VERSIONS, timeout=1))
    assert header.request_api_version == 4
    assert header.client_id == "kbroker-live"
    assert (body.client_software_name, body.client_software_version) == ("kafka-python", kafka.__version__)
    header, body = assert_reencodes(capture.wait_for(METADATA, timeout=1))
    assert header.client_id == "kbroker-live"


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_live_kcat_opening_frames(capture: Capture) -> None:
    subprocess.run(
        ["kcat", "-L", "-b", capture.bootstrap, "-m", "2"], capture_output=True, timeout=30, check=False
    )
    header, body = assert_reencodes(capture.wait_for(API_VERSIONS, timeout=1))
    assert header.request_api_version in (3, 4)
    assert body.client_software_name == "librdkafka"
    assert_reencodes(capture.wait_for(METADATA, timeout=1))

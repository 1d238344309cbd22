"""The SASL state machine and the TLS listener on the wire, with raw frames: Kafka's error codes in each state, the
v0 handshake's bare tokens, session lifetimes and re-authentication (KIP-368), and bad input (requests before
authentication, a 100 MB token, garbage instead of TLS) closing only the offending connection, in bounded memory."""

from __future__ import annotations

import os
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    ApiVersionsRequest,
    FindCoordinatorRequest,
    MetadataRequest,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
)

from tests.clients import Msg, RawClient, ck_produce
from tests.security_setup import Pki, SecureBroker, make_pki

DELAY_MS = 300


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[SecureBroker]:
    b = SecureBroker(tmp_path_factory.mktemp("secure"), pki, {
        "connection.failed.authentication.delay.ms": str(DELAY_MS),
        # Small enough that a leaked connection count would lock the tests' own clients out.
        "max.connections.per.ip": "40",
    })
    b.start()
    yield b
    b.stop()


def tls_raw(addr: str, pki: Pki) -> RawClient:
    raw = RawClient(addr)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    raw.sock = ctx.wrap_socket(raw.sock, server_hostname="localhost")
    return raw


def plain_token(user: str, password: str) -> bytes:
    return f"\0{user}\0{password}".encode()


def authenticate_plain(raw: RawClient, user: str = "alice", password: str = "alice-secret", version: int = 2):  # type: ignore[no-untyped-def]
    hs = raw.request(17, 1, SaslHandshakeRequest(mechanism="PLAIN"))
    assert hs.error_code == 0 and "PLAIN" in hs.mechanisms
    return raw.request(36, version, SaslAuthenticateRequest(auth_bytes=plain_token(user, password)))


def metadata_ok(raw: RawClient) -> None:
    resp = raw.request(3, 9, MetadataRequest(topics=[], allow_auto_topic_creation=False))
    assert resp.brokers, resp


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def healthy(b: SecureBroker, tag: str) -> None:
    assert b.alive()
    ck_produce(b.addr("PLAINTEXT"), f"health-{tag}", [Msg(b"k", b"v")])


# ---------------------------------------------------------------- the state machine


@pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_authenticate_then_serve(secure: SecureBroker, pki: Pki, listener: str) -> None:
    raw = tls_raw(secure.addr(listener), pki) if listener == "SASL_SSL" else RawClient(secure.addr(listener))
    with raw:
        versions = raw.request(18, 3, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        keys = {k.api_key for k in versions.api_keys}
        assert {17, 36, 50, 51} <= keys
        resp = authenticate_plain(raw)
        assert resp.error_code == 0 and resp.error_message is None and resp.session_lifetime_ms == 0
        metadata_ok(raw)
        # A second handshake on an authenticated connection without a session lifetime: Kafka's KafkaApis answer.
        assert raw.request(17, 1, SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.ILLEGAL_SASL_STATE
        again = raw.request(36, 2, SaslAuthenticateRequest(auth_bytes=plain_token("alice", "alice-secret")))
        assert again.error_code == ErrorCode.ILLEGAL_SASL_STATE and again.error_message
        metadata_ok(raw)


def test_sasl_requests_on_a_plaintext_listener(secure: SecureBroker) -> None:
    with RawClient(secure.addr("PLAINTEXT")) as raw:
        hs = raw.request(17, 1, SaslHandshakeRequest(mechanism="PLAIN"))
        assert hs.error_code == ErrorCode.ILLEGAL_SASL_STATE
        metadata_ok(raw)


def test_unsupported_mechanism(secure: SecureBroker) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as raw:
        t0 = time.monotonic()
        hs = raw.request(17, 1, SaslHandshakeRequest(mechanism="GSSAPI"))
        assert time.monotonic() - t0 >= DELAY_MS / 1000 * 0.9
        assert hs.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert hs.mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert raw.closed_by_peer()


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("nobody", "x"), ("alice", "")])
def test_wrong_credentials_answered_after_the_delay(secure: SecureBroker, user: str, password: str) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as raw:
        t0 = time.monotonic()
        resp = authenticate_plain(raw, user, password)
        assert time.monotonic() - t0 >= DELAY_MS / 1000 * 0.9
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert resp.error_message.startswith("Authentication failed"), resp.error_message
        assert raw.closed_by_peer()
    healthy(secure, "wrong-credentials")


def test_scram_unknown_user(secure: SecureBroker) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as raw:
        assert raw.request(17, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-256")).error_code == 0
        resp = raw.request(36, 2, SaslAuthenticateRequest(auth_bytes=b"n,,n=nobody,r=abcdefgh"))
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert resp.error_message == ("Authentication failed during authentication due to invalid credentials with "
                                      "SASL mechanism SCRAM-SHA-256")
        assert raw.closed_by_peer()


def test_v0_handshake_takes_bare_tokens(secure: SecureBroker) -> None:
    """Clients before KIP-152 send the SASL tokens as bare size-prefixed frames after SaslHandshake v0."""
    with RawClient(secure.addr("SASL_PLAINTEXT")) as raw:
        assert raw.request(17, 0, SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        token = plain_token("bob", "bob-secret")
        raw.send_bytes(struct.pack(">i", len(token)) + token)
        assert raw.recv_frame() == b""  # PLAIN's empty server token
        metadata_ok(raw)
    with RawClient(secure.addr("SASL_PLAINTEXT")) as raw:
        assert raw.request(17, 0, SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        token = plain_token("bob", "wrong")
        raw.send_bytes(struct.pack(">i", len(token)) + token)
        assert raw.closed_by_peer()  # no SaslAuthenticate to carry an error: the connection just closes


# ---------------------------------------------------------------- requests before authentication


@pytest.mark.parametrize("preamble", ["none", "api_versions", "handshake"])
def test_requests_before_authentication_close_the_connection(secure: SecureBroker, preamble: str) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as raw:
        if preamble in ("api_versions", "handshake"):
            raw.request(18, 3, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        if preamble == "handshake":
            assert raw.request(17, 1, SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
            # During authentication Kafka answers a request that has an error code with ILLEGAL_SASL_STATE, then closes.
            resp = raw.request(10, 1, FindCoordinatorRequest(key="g"))
            assert resp.error_code == ErrorCode.ILLEGAL_SASL_STATE
        else:
            raw.send_bytes(raw.frame(3, 9, MetadataRequest(topics=None)))
        assert raw.closed_by_peer()
    # A second ApiVersions, and a pipeline of requests behind a handshake, are not allowed either.
    with RawClient(secure.addr("SASL_PLAINTEXT")) as raw:
        v = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        raw.send_bytes(raw.frame(18, 3, v) + raw.frame(18, 3, v) + raw.frame(3, 9, MetadataRequest(topics=None)) * 50)
        raw.recv_frame()
        assert raw.closed_by_peer()
    healthy(secure, "before-auth")


def test_huge_sasl_token_closes_in_bounded_memory(secure: SecureBroker) -> None:
    assert secure.proc is not None
    before = rss_kib(secure.proc.pid)
    chunk = os.urandom(1 << 20)
    for stage in ("first frame", "after handshake", "authenticate v2"):
        with RawClient(secure.addr("SASL_PLAINTEXT")) as raw:
            if stage != "first frame":
                assert raw.request(17, 0 if stage == "after handshake" else 1,
                                   SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
            raw.send_bytes(struct.pack(">i", 100 * 1024 * 1024))
            sent = 0
            try:
                while sent < 100 * (1 << 20):
                    raw.sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # closed by the broker while we were still sending: what we want
            assert sent < 100 * (1 << 20), "the broker read a 100 MB SASL token"
            assert raw.closed_by_peer()
    assert rss_kib(secure.proc.pid) - before < 60 * 1024
    healthy(secure, "huge-token")


# ---------------------------------------------------------------- TLS


def test_garbage_instead_of_tls(secure: SecureBroker, pki: Pki) -> None:
    """More bad connections than max.connections.per.ip allows: a leaked connection count would refuse the
    good client at the end."""
    for i in range(60):
        with socket.create_connection(("127.0.0.1", secure.ports["SSL" if i % 2 else "SASL_SSL"]), timeout=10) as s:
            if i % 3 == 0:
                s.sendall(os.urandom(4096))
            elif i % 3 == 1:
                s.sendall(b"\x16\x03\x01\x02\x00" + os.urandom(512))  # a TLS record header, then noise
            else:
                s.sendall(b"\x00\x00\x00\x10" + b"\x00\x12\x00\x03" + b"\x00" * 12)  # a Kafka request in the clear
            s.settimeout(10)
            try:
                while s.recv(4096):
                    pass
            except (ConnectionResetError, TimeoutError):
                pass
    with tls_raw(secure.addr("SSL"), pki) as raw:
        metadata_ok(raw)
    # Plaintext Kafka on a TLS port, and TLS on a plaintext port, fail only their own connections.
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        with tls_raw(secure.addr("PLAINTEXT"), pki) as raw:
            metadata_ok(raw)
    healthy(secure, "garbage-tls")


def test_fetch_over_tls_reads_large_regions(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    """Fetch data past the inline size is copied from the log in chunks (sendfile cannot encrypt)."""
    from tests.clients import ck_consume

    msgs = [Msg(f"k{i}".encode(), os.urandom(20000)) for i in range(300)]
    ck_produce(secure.addr("PLAINTEXT"), topic_name, msgs)
    conf = {"security_protocol": "SSL", "ssl_ca_location": str(pki.ca), "fetch_max_bytes": 50 * 1024 * 1024,
            "max_partition_fetch_bytes": 10 * 1024 * 1024}
    got = ck_consume(secure.addr("SSL"), topic_name, [0], 300, **conf)
    assert [r.value for r in got] == [m.value for m in msgs]


# ---------------------------------------------------------------- session lifetime and re-authentication


@pytest.fixture(scope="module")
def reauth(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[SecureBroker]:
    b = SecureBroker(tmp_path_factory.mktemp("reauth"), pki, {"connections.max.reauth.ms": "1500"})
    b.start()
    yield b
    b.stop()


def test_expired_session_closes_the_connection(reauth: SecureBroker) -> None:
    with RawClient(reauth.addr("SASL_PLAINTEXT")) as raw:
        resp = authenticate_plain(raw)
        assert resp.error_code == 0 and resp.session_lifetime_ms == 1500
        metadata_ok(raw)
        time.sleep(1.7)
        raw.send_bytes(raw.frame(3, 9, MetadataRequest(topics=[])))
        assert raw.closed_by_peer()
    healthy(reauth, "expired")


def test_reauthentication_extends_the_session(reauth: SecureBroker) -> None:
    with RawClient(reauth.addr("SASL_PLAINTEXT")) as raw:
        assert authenticate_plain(raw).session_lifetime_ms == 1500
        for _ in range(3):
            time.sleep(0.8)
            resp = authenticate_plain(raw)  # KIP-368: handshake v1 + authenticate on the live connection
            assert resp.error_code == 0 and resp.session_lifetime_ms == 1500
            metadata_ok(raw)
        # Re-authenticating as someone else is refused, and ends the connection.
        hs = raw.request(17, 1, SaslHandshakeRequest(mechanism="PLAIN"))
        assert hs.error_code == 0
        resp = raw.request(36, 2, SaslAuthenticateRequest(auth_bytes=plain_token("bob", "bob-secret")))
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "Cannot change principals" in resp.error_message
        assert raw.closed_by_peer()


def test_librdkafka_reauthenticates(reauth: SecureBroker, topic_name: str) -> None:
    """librdkafka (KIP-368 since 1.9) re-authenticates before the 1.5 s lifetime ends and keeps producing."""
    expired_before = reauth.read_log().count("expired (connections.max.reauth.ms)")
    errors: list[object] = []
    p = Producer({"bootstrap.servers": reauth.addr("SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
                  "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret",
                  "error_cb": errors.append, "linger.ms": 0})
    delivered: list[int] = []
    deadline = time.monotonic() + 5
    i = 0
    while time.monotonic() < deadline:
        p.produce(topic_name, b"v%d" % i, on_delivery=lambda err, m: err is None and delivered.append(m.offset()))
        p.flush(10)
        i += 1
        time.sleep(0.05)
    assert len(delivered) == i, errors
    assert not errors, errors
    # Re-authenticated in time: the broker never had to close an expired session of this client.
    assert reauth.read_log().count("expired (connections.max.reauth.ms)") == expired_before


def test_kafka_python_reauthenticates(reauth: SecureBroker, topic_name: str) -> None:
    """kafka-python 3 (KIP-368) re-authenticates within the 1.5 s lifetime and keeps producing."""
    from kafka import KafkaProducer

    expired_before = reauth.read_log().count("expired (connections.max.reauth.ms)")
    p = KafkaProducer(bootstrap_servers=reauth.addr("SASL_PLAINTEXT"), security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism="PLAIN", sasl_plain_username="alice", sasl_plain_password="alice-secret",
                      api_version=(3, 9), linger_ms=0)
    try:
        deadline = time.monotonic() + 5
        sent = 0
        while time.monotonic() < deadline:
            p.send(topic_name, b"v%d" % sent).get(timeout=10)
            sent += 1
            time.sleep(0.05)
    finally:
        p.close(timeout=5)
    assert sent > 20
    assert reauth.read_log().count("expired (connections.max.reauth.ms)") == expired_before


def test_aiokafka_session_expires_and_it_reconnects(reauth: SecureBroker, topic_name: str) -> None:
    """aiokafka does not re-authenticate: the broker closes its connection when the session ends (Kafka's
    expired-session close), the client reconnects and authenticates again, and nothing it sent is lost."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    expired_before = reauth.read_log().count("expired (connections.max.reauth.ms)")

    async def run() -> list[int]:
        p = AIOKafkaProducer(bootstrap_servers=reauth.addr("SASL_PLAINTEXT"), security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username="alice", sasl_plain_password="alice-secret",
                             linger_ms=0, retry_backoff_ms=50)
        await p.start()
        offsets = []
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                md = await asyncio.wait_for(p.send_and_wait(topic_name, b"v%d" % len(offsets), partition=0), 20)
                offsets.append(md.offset)
                await asyncio.sleep(0.05)
        finally:
            await p.stop()
        return offsets

    offsets = asyncio.run(run())
    assert len(offsets) > 20 and offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    assert reauth.read_log().count("expired (connections.max.reauth.ms)") > expired_before
    healthy(reauth, "after-aiokafka-expiry")

"""Fuzzing the security path of a real broker: SASL frames on a SASL_PLAINTEXT listener and bytes on a TLS one.

A connection script is a SASL conversation gone wrong in some way: an optional ApiVersions, a SaslHandshake v0/v1
for PLAIN, SCRAM-SHA-256/512, GSSAPI or any text, then SaslAuthenticate v0-2 (or, after a v0 handshake, bare
token frames) carrying PLAIN tokens with odd parts, SCRAM client-first / client-final messages with random or
hostile attributes, or random bytes; then any other request. Every frame may be mutated (bit flips, truncation,
lying size prefixes). TLS scripts send random bytes or a mutated ClientHello-like record to the SSL listener.
After each example: the process is alive, no traceback in its log, a Produce + Fetch round trip works on the
PLAINTEXT listener, and a real PLAIN login still succeeds."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import strategies as st
from kbroker.protocol import codec
from kbroker.protocol.messages import (
    ApiVersionsRequest,
    RequestHeader,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
)

from tests.fuzz.common import HEALTH_TOPIC, Frame, budget, request_frame, round_trip, run_for
from tests.fuzz.test_broker_fuzz import LogWatch
from tests.security_setup import PLAIN_USERS, SecureBroker, make_pki

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER", "plain", ""]


def _frame(api_key: int, version: int, cid: int, body: object) -> bytes:
    return bytes(codec.encode_request(RequestHeader(api_key, version, cid, "sasl-fuzz"), body))


@st.composite
def sasl_token(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["plain", "scram-first", "scram-final", "binary"]))
    text = st.text(max_size=40)
    if kind == "plain":
        parts = draw(st.lists(st.sampled_from(["", "alice", "alice-secret", "nobody", "\x00"]) | text,
                              min_size=1, max_size=5))
        return "\x00".join(parts).encode("utf-8", "surrogatepass")
    if kind == "scram-first":
        gs2 = draw(st.sampled_from(["n,,", "y,,", "p=tls-unique,,", "n,a=alice,", "n,a=x,", "", "n,"]))
        attrs = draw(st.lists(st.sampled_from(["n=alice", "n=carol", "n=a=2Cb", "n==ZZ", "r=", "r=abc",
                                               "m=x", "tokenauth=true", "t=1", "x", "=", ",,"]) | text,
                              max_size=6))
        return (gs2 + ",".join(attrs)).encode("utf-8", "surrogatepass")
    if kind == "scram-final":
        attrs = draw(st.lists(st.sampled_from(["c=biws", "c=!!", "r=abc", "p=", "p=AAAA", "p=***", "e=x"]) | text,
                              max_size=5))
        return ",".join(attrs).encode("utf-8", "surrogatepass")
    return draw(st.binary(max_size=300))


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> Frame:
    buf = bytearray(data)
    how = draw(st.sampled_from(["none", "none", "none", "bitflip", "truncate", "framing"]))
    if how == "bitflip" and len(buf) > 4:
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(4, len(buf) - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
    elif how == "truncate" and len(buf) > 4:
        del buf[draw(st.integers(4, len(buf))):]
        struct.pack_into(">i", buf, 0, len(buf) - 4)
    elif how == "framing":
        struct.pack_into(">i", buf, 0, draw(st.sampled_from([-1, 0, 3, 7, 2**31 - 1, 600_000, len(buf) + 5])))
        return Frame(bytes(buf), framing_intact=False, note="framing")
    return Frame(bytes(buf), note=how)


@st.composite
def sasl_script(draw: st.DrawFn) -> list[Frame]:
    frames: list[Frame] = []
    cid = 1
    if draw(st.booleans()):
        frames.append(draw(mutated(_frame(18, draw(st.integers(0, 4)), cid, ApiVersionsRequest()))))
        cid += 1
    hs_version = draw(st.integers(0, 1))
    mechanism = draw(st.sampled_from(MECHANISMS) | st.text(max_size=20))
    frames.append(draw(mutated(_frame(17, hs_version, cid, SaslHandshakeRequest(mechanism=mechanism)))))
    for _ in range(draw(st.integers(0, 3))):
        cid += 1
        token = draw(sasl_token())
        if hs_version == 0 and draw(st.booleans()):
            frames.append(draw(mutated(struct.pack(">i", len(token)) + token)))
        else:
            frames.append(draw(mutated(_frame(36, draw(st.integers(0, 2)), cid,
                                              SaslAuthenticateRequest(auth_bytes=token)))))
    if draw(st.booleans()):
        frames.append(draw(request_frame(cid=cid + 1, allow_framing_lie=True)))
    # Nothing may follow a lying size prefix on its connection.
    for i, f in enumerate(frames):
        if not f.framing_intact:
            return frames[:i + 1]
    return frames


@st.composite
def tls_script(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(min_size=1, max_size=2048))
    # A handshake record header (content type 22, TLS 1.0-1.3 versions) with a random or lying length.
    length = draw(st.integers(0, 2**14 + 2048))
    body = draw(st.binary(max_size=600))
    return bytes([22, 3, draw(st.integers(0, 4))]) + struct.pack(">H", length) + body


def send_script(addr: str, data: bytes, cap: float = 2.0) -> None:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        try:
            s.sendall(data)
        except OSError:
            return
        s.settimeout(cap)
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass


def plain_login_works(addr: str) -> None:
    from tests.clients import RawClient

    with RawClient(addr) as raw:
        assert raw.request(17, 1, SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        resp = raw.request(36, 2, SaslAuthenticateRequest(auth_bytes=f"\0alice\0{PLAIN_USERS['alice']}".encode()))
        assert resp.error_code == 0, resp


def test_sasl_and_tls_frames(tmp_path_factory: pytest.TempPathFactory) -> None:
    b = SecureBroker(tmp_path_factory.mktemp("sasl-fuzz"), make_pki(tmp_path_factory.mktemp("pki")),
                     {"connection.failed.authentication.delay.ms": "0"})
    b.start()
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(HEALTH_TOPIC, 1, 1)])[HEALTH_TOPIC].result(30)
        watch = LogWatch(b)

        def check(case: tuple[list[list[Frame]], list[bytes]]) -> None:
            sasl_scripts, tls_scripts = case
            for frames in sasl_scripts:
                send_script(b.addr("SASL_PLAINTEXT"), b"".join(f.data for f in frames), cap=0.5)
            for data in tls_scripts:
                send_script(b.addr("SSL"), data, cap=0.5)
            assert b.alive(), b.read_log()[-4000:]
            round_trip(b.bootstrap)
            plain_login_works(b.addr("SASL_PLAINTEXT"))
            bad = watch.unexpected_tracebacks()
            assert not bad, "\n".join(bad)[-6000:]

        strategy = st.tuples(st.lists(sasl_script(), min_size=1, max_size=3), st.lists(tls_script(), max_size=2))
        chunks = run_for(budget("sasl"), strategy, check, chunk=20)
        print(f"sasl fuzz: {chunks} chunks of 20 examples")
    finally:
        b.stop()

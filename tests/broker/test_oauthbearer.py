"""SASL/OAUTHBEARER with real clients: unsecured JWS tokens (Kafka's default validator) from confluent-kafka,
kafka-python and aiokafka; signed JWTs from a token endpoint (librdkafka's `sasl.oauthbearer.method=oidc`) checked
against the provider's JWKS; Kafka's answers to refused tokens; the token's expiry bounding the session (KIP-368);
principals from the subject claim deciding ACLs; configuration errors stopping start-up."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
)
from confluent_kafka.admin import ResourceType as CkResourceType
from cryptography.hazmat.primitives.asymmetric import rsa
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import MetadataRequest, SaslAuthenticateRequest, SaslHandshakeRequest

from tests.clients import Msg, RawClient, ck_consume, ck_produce, kp_consume, kp_produce
from tests.oauth_idp import (
    CLIENTS,
    LOGIN_MODULE,
    IdentityProvider,
    OAuthBroker,
    client_first_message,
    unsecured_token,
)


@pytest.fixture(scope="module")
def idp(oauth_idp: IdentityProvider) -> IdentityProvider:
    return oauth_idp


@pytest.fixture(scope="module")
def broker(oauth_broker: OAuthBroker) -> OAuthBroker:
    return oauth_broker


def sasl(listener_addr: str, **conf: Any) -> dict[str, Any]:
    return {"bootstrap.servers": listener_addr, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", **conf}


def oidc(idp: IdentityProvider, client: str, **conf: Any) -> dict[str, Any]:
    return {"sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": client,
            "sasl.oauthbearer.client.secret": CLIENTS[client], "sasl.oauthbearer.token.endpoint.url": idp.token_url,
            **conf}


def unsecured(principal: str, **conf: Any) -> dict[str, Any]:
    return {"enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": f"principal={principal}", **conf}


def authenticate(raw: RawClient, first_message: bytes, version: int = 2) -> Any:
    hs = raw.request(17, 1, SaslHandshakeRequest(mechanism="OAUTHBEARER"))
    assert hs.error_code == 0 and hs.mechanisms == ["OAUTHBEARER"]
    return raw.request(36, version, SaslAuthenticateRequest(auth_bytes=first_message))


def assert_refused(raw: RawClient, first_message: bytes, challenge: str) -> None:
    """Kafka's OAuthBearerSaslServer: the refused token gets the JSON challenge with no error; the client's %x01
    answer then ends the exchange with SASL_AUTHENTICATION_FAILED carrying the same text, and the connection."""
    resp = authenticate(raw, first_message)
    assert (resp.error_code, resp.auth_bytes.decode()) == (0, challenge)
    resp = raw.request(36, 2, SaslAuthenticateRequest(auth_bytes=b"\x01"))
    assert (resp.error_code, resp.error_message) == (ErrorCode.SASL_AUTHENTICATION_FAILED, challenge)
    assert raw.closed_by_peer()


def metadata_ok(raw: RawClient) -> None:
    assert raw.request(3, 9, MetadataRequest(topics=[], allow_auto_topic_creation=False)).brokers


# ------------------------------------------------------------ unsecured tokens (Kafka's default validator)


def test_unsecured_tokens_with_three_clients(broker: OAuthBroker, topic_name: str) -> None:
    msgs = [Msg(b"k%d" % i, b"v%d" % i, partition=0) for i in range(5)]
    ck_produce(broker.addr("DEV"), topic_name, msgs, **sasl(broker.addr("DEV"), **unsecured("alice")))

    class Unsecured(_token_provider_base()):  # type: ignore[misc]
        def token(self) -> str:
            return unsecured_token("alice")

    got = kp_consume(broker.addr("DEV"), topic_name, [0], 5, security_protocol="SASL_PLAINTEXT",
                     sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=Unsecured())
    assert [r.value for r in got] == [m.value for m in msgs]

    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.abc import AbstractTokenProvider

    class AioUnsecured(AbstractTokenProvider):
        async def token(self) -> str:
            return unsecured_token("alice")

    async def aio_read() -> list[bytes]:
        c = AIOKafkaConsumer(bootstrap_servers=broker.addr("DEV"), security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=AioUnsecured(),
                             enable_auto_commit=False, auto_offset_reset="earliest")
        await c.start()
        try:
            c.assign([TopicPartition(topic_name, 0)])
            await c.seek_to_beginning()
            out: list[bytes] = []
            while len(out) < 5:
                for recs in (await c.getmany(timeout_ms=1000)).values():
                    out.extend(r.value for r in recs)
            return out
        finally:
            await c.stop()

    assert asyncio.run(asyncio.wait_for(aio_read(), 30)) == [m.value for m in msgs]


def _token_provider_base() -> type:
    for module in ("kafka.net.sasl.oauth", "kafka.sasl.oauth", "kafka.oauth.abstract"):
        try:
            return __import__(module, fromlist=["AbstractTokenProvider"]).AbstractTokenProvider  # type: ignore[no-any-return]
        except ImportError:
            continue
    pytest.skip("this kafka-python has no OAUTHBEARER token provider class")


UNSECURED_REFUSED = {
    "expired": lambda: unsecured_token("alice", lifetime_s=-5),
    "alg is not none": lambda: unsecured_token("alice").replace("eyJhbGciOiJub25lIn0", "eyJhbGciOiJIUzI1NiJ9"),
    "has a signature": lambda: unsecured_token("alice") + "c2ln",
    "no principal": lambda: unsecured_token(""),
    "two parts": lambda: "not.a-token",
}


# The tokens are made in the test: made at collection, their times would differ between pytest-xdist workers.
@pytest.mark.parametrize("why", list(UNSECURED_REFUSED))
def test_unsecured_validator_refuses(broker: OAuthBroker, why: str) -> None:
    with RawClient(broker.addr("DEV")) as raw:
        assert_refused(raw, client_first_message(UNSECURED_REFUSED[why]()), '{"status":"invalid_token"}')


def test_required_scope(broker: OAuthBroker) -> None:
    with RawClient(broker.addr("SCOPED")) as raw:
        assert_refused(raw, client_first_message(unsecured_token("alice", scope=["read"])),
                       '{"status":"insufficient_scope", "scope":"kafka"}')
    with RawClient(broker.addr("SCOPED")) as raw:
        resp = authenticate(raw, client_first_message(unsecured_token("alice", scope=["read", "kafka"])))
        assert resp.error_code == 0 and resp.auth_bytes == b""
        metadata_ok(raw)


@pytest.mark.parametrize("message, error", [
    (b"n,,auth=Bearer x\x01\x01", "malformed"),
    (b"n,,\x01auth=Basic abc\x01\x01", "wrong scheme"),
    (b"n,,\x01user=alice\x01\x01", "no auth"),
    (b"p=tls-unique,,\x01auth=Bearer abc\x01\x01", "channel binding"),
], ids=["malformed", "wrong scheme", "no auth", "channel binding"])
def test_malformed_client_first_message(broker: OAuthBroker, message: bytes, error: str) -> None:
    """Kafka answers a SaslException: the generic text, never the parser's."""
    with RawClient(broker.addr("DEV")) as raw:
        resp = authenticate(raw, message)
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert resp.error_message == ("Authentication failed during authentication due to invalid credentials "
                                      "with SASL mechanism OAUTHBEARER")
        assert raw.closed_by_peer()


def test_authorization_id_must_be_the_principal(broker: OAuthBroker) -> None:
    with RawClient(broker.addr("DEV")) as raw:
        resp = authenticate(raw, client_first_message(unsecured_token("alice"), authzid="bob"))
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert resp.error_message == ("Authentication failed: Client requested an authorization id (bob) that is "
                                      "different from the token's principal name (alice)")
    with RawClient(broker.addr("DEV")) as raw:
        resp = authenticate(raw, client_first_message(unsecured_token("alice"), authzid="alice", traceId="t-1"))
        assert resp.error_code == 0
        metadata_ok(raw)


# ------------------------------------------------------------ signed JWTs against the provider's JWKS


def test_oidc_clients_and_acls_by_subject(broker: OAuthBroker, idp: IdentityProvider, topic_name: str) -> None:
    """confluent-kafka fetches its token from the endpoint; the broker checks it against the JWKS; the principal is
    User:<sub>, so an ACL for User:svc-orders lets it write and DENY for User:svc-other stops that one."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    pattern = (CkResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL)
    for fut in admin.create_acls([
        AclBinding(*pattern, "User:svc-orders", "*", AclOperation.ALL, AclPermissionType.ALLOW),
        AclBinding(*pattern, "User:svc-other", "*", AclOperation.ALL, AclPermissionType.DENY),
    ]).values():
        fut.result(10)
    requests_before = idp.token_requests
    msgs = [Msg(None, b"order-%d" % i, partition=0) for i in range(3)]
    ck_produce(broker.addr("OIDC"), topic_name, msgs, **sasl(broker.addr("OIDC"), **oidc(idp, "svc-orders")))
    assert idp.token_requests > requests_before
    got = ck_consume(broker.addr("OIDC"), topic_name, [0], 3, **sasl(broker.addr("OIDC"), **oidc(idp, "svc-orders")))
    assert [r.value for r in got] == [m.value for m in msgs]

    errors: list[KafkaError] = []
    p = Producer(sasl(broker.addr("OIDC"), **oidc(idp, "svc-other"), error_cb=errors.append))
    p.produce(topic_name, b"denied", partition=0, on_delivery=lambda err, m: errors.append(err))
    p.flush(20)
    assert any(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errors), errors


def test_oidc_token_from_kafka_python(broker: OAuthBroker, idp: IdentityProvider, topic_name: str) -> None:
    class ClientCredentials(_token_provider_base()):  # type: ignore[misc]
        def token(self) -> str:
            body = b"grant_type=client_credentials&client_id=svc-orders&client_secret=orders-secret"
            with urllib.request.urlopen(urllib.request.Request(idp.token_url, data=body), timeout=10) as resp:
                return json.load(resp)["access_token"]  # type: ignore[no-any-return]

    conf = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauth_token_provider": ClientCredentials()}
    kp_produce(broker.addr("OIDC"), topic_name, [Msg(b"k", b"from kafka-python", partition=0)], **conf)
    assert [r.value for r in kp_consume(broker.addr("OIDC"), topic_name, [0], 1, **conf)] == [b"from kafka-python"]


def _other_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.mark.parametrize("case", ["expired", "other key", "unknown kid", "audience", "issuer", "no iat",
                                  "unsecured", "not yet valid"])
def test_jwks_validator_refuses(broker: OAuthBroker, idp: IdentityProvider, case: str) -> None:
    token = {
        "expired": lambda: idp.token("svc-orders", lifetime_s=-10),
        "other key": lambda: idp.token("svc-orders", key=_other_key()),
        "unknown kid": lambda: idp.token("svc-orders", key=_other_key(), kid="rotated-away"),
        "audience": lambda: idp.token("svc-orders", aud="billing"),
        "issuer": lambda: idp.token("svc-orders", iss="https://evil.example"),
        "no iat": lambda: idp.token("svc-orders", iat=None),
        "unsecured": lambda: unsecured_token("svc-orders"),
        "not yet valid": lambda: idp.token("svc-orders", nbf=int(time.time()) + 600),
    }[case]()
    with RawClient(broker.addr("OIDC")) as raw:
        assert_refused(raw, client_first_message(token), '{"status":"invalid_token"}')
    with RawClient(broker.addr("OIDC")) as raw:  # the same listener still takes a good token
        assert authenticate(raw, client_first_message(idp.token("svc-orders"))).error_code == 0
        metadata_ok(raw)


# ------------------------------------------------------------ the token's expiry bounds the session (KIP-368)


def test_session_ends_when_the_token_expires(broker: OAuthBroker, idp: IdentityProvider) -> None:
    with RawClient(broker.addr("OIDC")) as raw:
        resp = authenticate(raw, client_first_message(idp.token("svc-orders", lifetime_s=3)))
        assert resp.error_code == 0 and 1000 < resp.session_lifetime_ms <= 3000
        metadata_ok(raw)
        # Re-authenticating with a fresh token extends the session; another subject is refused.
        resp = authenticate(raw, client_first_message(idp.token("svc-orders", lifetime_s=4)))
        assert resp.error_code == 0 and 2000 < resp.session_lifetime_ms <= 4000
        metadata_ok(raw)
        time.sleep(resp.session_lifetime_ms / 1000 + 0.5)
        raw.send_bytes(raw.frame(3, 9, MetadataRequest(topics=[])))
        assert raw.closed_by_peer()
    with RawClient(broker.addr("OIDC")) as raw:
        assert authenticate(raw, client_first_message(idp.token("svc-orders"))).error_code == 0
        resp = authenticate(raw, client_first_message(idp.token("svc-other")))
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "Cannot change principals" in resp.error_message


def test_librdkafka_refreshes_its_token_and_reauthenticates(tmp_path: Path, topic_name: str) -> None:
    """Tokens living 6 s: librdkafka fetches a new one before expiry (at ~80% of the lifetime) and re-authenticates
    on its connections, so a producer runs through several token lifetimes without an error. (With 4 s tokens, a
    0.8 s margin, a loaded machine once saw transient _ALL_BROKERS_DOWN errors.)"""
    idp = IdentityProvider(CLIENTS, lifetime_s=6).start()
    # A loaded machine may re-authenticate a little after the token's exp (whole seconds): Kafka's default skew.
    b = OAuthBroker(tmp_path, idp, {"sasl.oauthbearer.clock.skew.seconds": "30"}).start()
    try:
        errors: list[Any] = []
        delivered: list[int] = []
        p = Producer(sasl(b.addr("OIDC"), **oidc(idp, "svc-orders"), error_cb=errors.append, **{"linger.ms": 0}))
        deadline = time.monotonic() + 14
        sent = 0
        while time.monotonic() < deadline:
            p.produce(topic_name, b"v%d" % sent, on_delivery=lambda err, m: err is None and delivered.append(1))
            p.flush(10)
            sent += 1
            time.sleep(0.05)
        assert len(delivered) == sent and not errors, (errors, b.read_log()[-3000:])
        assert idp.token_requests >= 3
        assert "SASL session of User:svc-orders expired" not in b.read_log()
    finally:
        b.stop()
        idp.stop()


# ------------------------------------------------------------ configuration


@pytest.mark.parametrize("overrides, key", [
    ({"listener.name.oidc.oauthbearer.sasl.server.callback.handler.class": "com.example.MyValidator"},
     "listener.name.oidc.oauthbearer.sasl.server.callback.handler.class"),
    ({"listener.name.oidc.sasl.oauthbearer.jwks.endpoint.url": "file:/nonexistent/jwks.json"},
     "sasl.oauthbearer.jwks.endpoint.url"),
    ({"listener.name.oidc.sasl.oauthbearer.jwks.endpoint.url": "ftp://idp/jwks"},
     "sasl.oauthbearer.jwks.endpoint.url"),
    ({"listener.name.dev.oauthbearer.sasl.jaas.config":
      f'{LOGIN_MODULE} required unsecuredValidatorAllowableClockSkewMs="soon";'},
     "listener.name.dev.oauthbearer.sasl.jaas.config"),
])
def test_bad_config_stops_startup(tmp_path: Path, idp: IdentityProvider, overrides: dict[str, str], key: str) -> None:
    b = OAuthBroker(tmp_path, idp, overrides)
    with pytest.raises(RuntimeError) as info:
        b.start(timeout=20)
    assert key in str(info.value)


def test_jwks_from_a_file(tmp_path: Path, idp: IdentityProvider) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(idp.jwks()))
    b = OAuthBroker(tmp_path / "data", idp, {"listener.name.oidc.sasl.oauthbearer.jwks.endpoint.url": jwks.as_uri()})
    b.start()
    try:
        with RawClient(b.addr("OIDC")) as raw:
            assert authenticate(raw, client_first_message(idp.token("svc-orders"))).error_code == 0
            metadata_ok(raw)
        with RawClient(b.addr("OIDC")) as raw:
            assert_refused(raw, client_first_message(idp.token("svc-orders", key=_other_key())),
                           '{"status":"invalid_token"}')
    finally:
        b.stop()


def test_other_mechanisms_are_not_offered(broker: OAuthBroker, topic_name: str) -> None:
    with RawClient(broker.addr("DEV")) as raw:
        hs = raw.request(17, 1, SaslHandshakeRequest(mechanism="PLAIN"))
        assert (hs.error_code, hs.mechanisms) == (ErrorCode.UNSUPPORTED_SASL_MECHANISM, ["OAUTHBEARER"])
    assert ck_produce(broker.bootstrap, topic_name, [Msg(None, b"x", partition=0)])[0].offset == 0

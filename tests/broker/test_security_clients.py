"""Real clients over TLS and SASL: confluent-kafka, kafka-python, aiokafka and kcat each produce and consume over
SSL, mutual TLS, SASL_PLAINTEXT (PLAIN, SCRAM-SHA-512) and SASL_SSL (SCRAM-SHA-256), against one broker with a
listener of every security protocol; bad credentials fail with Kafka's errors and leave the broker serving."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from tests.clients import (
    Msg,
    aio_consume,
    aio_produce,
    ck_consume,
    ck_produce,
    kcat,
    kp_consume,
    kp_produce,
)
from tests.conftest import have_kcat
from tests.security_setup import PLAIN_USERS, SCRAM_USERS, Pki, SecureBroker, make_pki, plain_only_broker

# case -> (listener, mechanism or None, user)
CASES: dict[str, tuple[str, str | None, str | None]] = {
    "ssl": ("SSL", None, None),
    "mtls": ("MTLS", None, None),
    "sasl-plain": ("SASL_PLAINTEXT", "PLAIN", "alice"),
    "sasl-scram-512": ("SASL_PLAINTEXT", "SCRAM-SHA-512", "carol"),
    "sasl-ssl-scram-256": ("SASL_SSL", "SCRAM-SHA-256", "dave"),
}
PASSWORDS = {**PLAIN_USERS, **SCRAM_USERS}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[SecureBroker]:
    b = SecureBroker(tmp_path_factory.mktemp("secure"), pki)
    b.start()
    # SCRAM users, created through the open listener with confluent-kafka's admin client (AlterUserScramCredentials).
    admin = AdminClient({"bootstrap.servers": b.addr("PLAINTEXT")})
    ups = [UserScramCredentialUpsertion(u, ScramCredentialInfo(m, 4096), p.encode())
           for u, p in SCRAM_USERS.items() for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(timeout=30)
    yield b
    b.stop()


def _healthy(b: SecureBroker, topic: str) -> None:
    """The broker still serves a plain client after whatever the test did."""
    assert b.alive()
    ck_produce(b.addr("PLAINTEXT"), topic + "-health", [Msg(b"k", b"still-alive")])


def ck_security(pki: Pki, case: str, password: str | None = None) -> dict[str, Any]:
    listener, mechanism, user = CASES[case]
    conf: dict[str, Any] = {"security.protocol": "SSL" if listener == "MTLS" else listener}
    if "SSL" in listener or listener == "MTLS":
        conf["ssl.ca.location"] = str(pki.ca)
    if listener == "MTLS":
        conf["ssl.certificate.location"] = str(pki.client_cert)
        conf["ssl.key.location"] = str(pki.client_key)
    if mechanism:
        assert user is not None
        conf.update({"sasl.mechanism": mechanism, "sasl.username": user,
                     "sasl.password": password or PASSWORDS[user]})
    return conf


def kp_security(pki: Pki, case: str) -> dict[str, Any]:
    listener, mechanism, user = CASES[case]
    kw: dict[str, Any] = {"security_protocol": "SSL" if listener == "MTLS" else listener}
    if "SSL" in listener or listener == "MTLS":
        kw["ssl_cafile"] = str(pki.ca)
    if listener == "MTLS":
        kw["ssl_certfile"] = str(pki.client_cert)
        kw["ssl_keyfile"] = str(pki.client_key)
    if mechanism:
        assert user is not None
        kw.update({"sasl_mechanism": mechanism, "sasl_plain_username": user, "sasl_plain_password": PASSWORDS[user]})
    return kw


def aio_security(pki: Pki, case: str) -> dict[str, Any]:
    listener, mechanism, user = CASES[case]
    kw: dict[str, Any] = {"security_protocol": "SSL" if listener == "MTLS" else listener}
    if "SSL" in listener or listener == "MTLS":
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        if listener == "MTLS":
            ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        kw["ssl_context"] = ctx
    if mechanism:
        assert user is not None
        kw.update({"sasl_mechanism": mechanism, "sasl_plain_username": user, "sasl_plain_password": PASSWORDS[user]})
    return kw


def _msgs(n: int) -> list[Msg]:
    return [Msg(f"k{i}".encode(), f"value-{i}".encode() * (1 + i % 50), (("i", str(i).encode()),)) for i in range(n)]


@pytest.mark.parametrize("case", list(CASES))
def test_confluent_kafka(secure: SecureBroker, pki: Pki, case: str, topic_name: str) -> None:
    bootstrap = secure.addr(CASES[case][0])
    conf = ck_security(pki, case)
    msgs = _msgs(200)
    sent = ck_produce(bootstrap, topic_name, msgs, **{k.replace(".", "_"): v for k, v in conf.items()})
    assert [r.offset for r in sent] == list(range(200))
    got = ck_consume(bootstrap, topic_name, [0], 200, **{k.replace(".", "_"): v for k, v in conf.items()})
    assert [(r.key, r.value, r.headers) for r in got] == [(m.key, m.value, m.headers) for m in msgs]


@pytest.mark.parametrize("case", list(CASES))
def test_kafka_python(secure: SecureBroker, pki: Pki, case: str, topic_name: str) -> None:
    bootstrap = secure.addr(CASES[case][0])
    msgs = _msgs(100)
    sent = kp_produce(bootstrap, topic_name, msgs, **kp_security(pki, case))
    assert sorted(r.offset for r in sent) == list(range(100))
    got = kp_consume(bootstrap, topic_name, [0], 100, **kp_security(pki, case))
    assert [(r.key, r.value) for r in got] == [(m.key, m.value) for m in msgs]


@pytest.mark.parametrize("case", list(CASES))
def test_aiokafka(secure: SecureBroker, pki: Pki, case: str, topic_name: str) -> None:
    bootstrap = secure.addr(CASES[case][0])
    msgs = _msgs(100)
    aio_produce(bootstrap, topic_name, msgs, **aio_security(pki, case))
    got = aio_consume(bootstrap, topic_name, [0], 100, **aio_security(pki, case))
    assert [(r.key, r.value) for r in got] == [(m.key, m.value) for m in msgs]


@pytest.mark.skipif(not have_kcat(), reason="kcat is not installed")
@pytest.mark.parametrize("case", list(CASES))
def test_kcat(secure: SecureBroker, pki: Pki, case: str, topic_name: str) -> None:
    bootstrap = secure.addr(CASES[case][0])
    props = [a for k, v in ck_security(pki, case).items() for a in ("-X", f"{k}={v}")]
    lines = b"".join(b"line-%d\n" % i for i in range(50))
    kcat(bootstrap, *props, "-P", "-t", topic_name, input=lines)
    out = kcat(bootstrap, *props, "-C", "-t", topic_name, "-o", "beginning", "-c", "50", "-e").stdout
    assert out == lines


# ---------------------------------------------------------------- failures, as clients see them


def _ck_fails(bootstrap: str, conf: dict[str, Any]) -> KafkaError:
    """The first error a confluent-kafka producer reports (librdkafka keeps retrying; it reports each failure)."""
    errors: list[KafkaError] = []
    p = Producer({"bootstrap.servers": bootstrap, "error_cb": errors.append, "socket.timeout.ms": 10000,
                  "reconnect.backoff.ms": 1000, **conf})
    try:
        p.produce("never-created", b"x")
        deadline = time.monotonic() + 5
        while not errors and time.monotonic() < deadline:
            p.poll(0.1)
        assert errors, "the client should have failed to authenticate"
        return errors[0]
    finally:
        p.purge()


@pytest.mark.parametrize("case,password,user", [
    ("sasl-plain", "wrong", None),
    ("sasl-plain", None, "nobody"),
    ("sasl-scram-512", "wrong", None),
    ("sasl-scram-512", None, "nobody"),
    ("sasl-ssl-scram-256", "wrong", None),
])
def test_bad_credentials_confluent(secure: SecureBroker, pki: Pki, case: str, password: str | None,
                                   user: str | None, topic_name: str) -> None:
    conf = ck_security(pki, case, password)
    if user:
        conf["sasl.username"], conf["sasl.password"] = user, "whatever"
    err = _ck_fails(secure.addr(CASES[case][0]), conf)
    assert err.code() == KafkaError._AUTHENTICATION, err
    assert "Authentication failed" in err.str(), err.str()
    _healthy(secure, topic_name)


def test_bad_credentials_kafka_python(secure: SecureBroker, pki: Pki, topic_name: str,
                                     caplog: pytest.LogCaptureFixture) -> None:
    """kafka-python retries until its timeout; each attempt logs the broker's SASL_AUTHENTICATION_FAILED."""
    for case, message in (("sasl-plain", "Authentication failed: Invalid username or password"),
                          ("sasl-scram-512", "invalid credentials with SASL mechanism SCRAM-SHA-512")):
        _kp_fails(secure, case, {**kp_security(pki, case), "sasl_plain_password": "wrong"}, message, caplog,
                  topic_name)
    _healthy(secure, topic_name)


def _kp_fails(b: SecureBroker, case: str, kw: dict[str, Any], message: str, caplog: pytest.LogCaptureFixture,
              topic: str) -> None:
    """A kafka-python producer that cannot authenticate: its send times out and its log carries the broker's
    SaslAuthenticationFailedError message."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    caplog.clear()
    p = KafkaProducer(bootstrap_servers=b.addr(CASES[case][0]), request_timeout_ms=3000, max_block_ms=3000,
                      reconnect_backoff_max_ms=200, api_version=(3, 9), **kw)
    try:
        with pytest.raises(KafkaTimeoutError):
            p.send(topic, b"x").get(timeout=5)
    finally:
        p.close(timeout=1)
    logged = [r.getMessage() for r in caplog.records if "SaslAuthenticationFailedError" in r.getMessage()]
    assert logged and message in logged[0], [r.getMessage() for r in caplog.records][-5:]


def test_unsupported_mechanism_confluent(tmp_path: Path, pki: Pki, topic_name: str) -> None:
    b = SecureBroker(tmp_path, pki, {"listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN"})
    b.start()
    try:
        conf = ck_security(pki, "sasl-scram-512")
        err = _ck_fails(b.addr("SASL_PLAINTEXT"), conf)
        assert err.code() == KafkaError._AUTHENTICATION, err
        assert "SCRAM-SHA-512" in err.str() and "PLAIN" in err.str(), err.str()
        _healthy(b, topic_name)
    finally:
        b.stop()


def test_mtls_refuses_clients_without_a_trusted_certificate(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    no_cert = ck_security(pki, "ssl")
    rogue = {**no_cert, "ssl.certificate.location": str(pki.rogue_cert), "ssl.key.location": str(pki.rogue_key)}
    for conf in (no_cert, rogue):
        err = _ck_fails(secure.addr("MTLS"), conf)
        assert err.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN), err
    # A client that does not trust the broker's CA gives up too.
    err = _ck_fails(secure.addr("SSL"), {"security.protocol": "SSL"})
    assert err.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN), err
    _healthy(secure, topic_name)


def test_scram_credentials_managed_by_two_clients(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    """kafka-python's admin creates a user, confluent-kafka's admin describes, rotates and deletes it; each change
    is what the SCRAM exchange uses next."""
    from kafka.admin import KafkaAdminClient
    from kafka.admin import ScramMechanism as KpMechanism
    from kafka.admin import UserScramCredentialUpsertion as KpUpsertion

    kp_admin = KafkaAdminClient(bootstrap_servers=secure.addr("PLAINTEXT"))
    try:
        result = kp_admin.alter_user_scram_credentials([KpUpsertion("erin", KpMechanism.SCRAM_SHA_256, "erin-1", 8192)])
        assert result == {"erin": None}
    finally:
        kp_admin.close()
    admin = AdminClient({"bootstrap.servers": secure.addr("PLAINTEXT")})
    infos = admin.describe_user_scram_credentials(["erin"])["erin"].result(timeout=30).scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_256, 8192)]
    base = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "erin"}
    bootstrap = secure.addr("SASL_PLAINTEXT")
    ck_produce(bootstrap, topic_name, [Msg(b"k", b"v1")], **{k.replace(".", "_"): v for k, v in
                                                              {**base, "sasl.password": "erin-1"}.items()})
    # Rotate the password: the old one stops working, the new one works.
    up = UserScramCredentialUpsertion("erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"erin-2")
    admin.alter_user_scram_credentials([up])["erin"].result(timeout=30)
    assert _ck_fails(bootstrap, {**base, "sasl.password": "erin-1"}).code() == KafkaError._AUTHENTICATION
    ck_produce(bootstrap, topic_name, [Msg(b"k", b"v2")], **{k.replace(".", "_"): v for k, v in
                                                              {**base, "sasl.password": "erin-2"}.items()})
    # Delete: the user is gone for SCRAM, and describing it says so.
    deletion = UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_256)
    admin.alter_user_scram_credentials([deletion])["erin"].result(timeout=30)
    assert _ck_fails(bootstrap, {**base, "sasl.password": "erin-2"}).code() == KafkaError._AUTHENTICATION
    with pytest.raises(KafkaException) as e:
        admin.describe_user_scram_credentials(["erin"])["erin"].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
    # Deleting what does not exist, and an iteration count Kafka refuses.
    with pytest.raises(KafkaException) as e:
        admin.alter_user_scram_credentials([deletion])["erin"].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
    few = UserScramCredentialUpsertion("erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"x")
    with pytest.raises(KafkaException) as e:
        admin.alter_user_scram_credentials([few])["erin"].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL


def test_credentials_survive_restart(tmp_path: Path, pki: Pki, topic_name: str) -> None:
    b = SecureBroker(tmp_path, pki)
    b.start()
    try:
        admin = AdminClient({"bootstrap.servers": b.addr("PLAINTEXT")})
        up = UserScramCredentialUpsertion("frank", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"f-pw")
        admin.alter_user_scram_credentials([up])["frank"].result(timeout=30)
        b.restart()
        conf = {"security_protocol": "SASL_SSL", "ssl_ca_location": str(pki.ca), "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": "frank", "sasl_password": "f-pw"}
        ck_produce(b.addr("SASL_SSL"), topic_name, [Msg(b"k", b"after restart")], **conf)
        assert "f-pw" not in (tmp_path / "logs" / "kbroker-scram-credentials.json").read_text()
    finally:
        b.stop()


@pytest.fixture(scope="module")
def plain_only(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[SecureBroker]:
    """SASL_PLAINTEXT offers only PLAIN: a client asking for SCRAM gets UNSUPPORTED_SASL_MECHANISM."""
    with plain_only_broker(tmp_path_factory.mktemp("plain-only"), pki) as b:
        yield b


@pytest.mark.parametrize("mechanism,password,logged", [
    ("PLAIN", "wrong", "Authentication failed: Invalid username or password"),
    ("SCRAM-SHA-512", "alice-secret", "UnsupportedSaslMechanism"),
])
def test_bad_credentials_and_mechanism_aiokafka(plain_only: SecureBroker, mechanism: str, password: str,
                                                logged: str, caplog: pytest.LogCaptureFixture,
                                                topic_name: str) -> None:
    _aio_fails(plain_only.addr("SASL_PLAINTEXT"), {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                                                   "sasl_plain_username": "alice", "sasl_plain_password": password},
               logged, caplog)
    _healthy(plain_only, topic_name)


def _aio_fails(bootstrap: str, kw: dict[str, Any], message: str, caplog: pytest.LogCaptureFixture) -> None:
    """An aiokafka producer that cannot authenticate: start() raises KafkaConnectionError and the client logs
    the broker's message."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    async def start() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000, **kw)
        try:
            await asyncio.wait_for(p.start(), 30)
        finally:
            await p.stop()

    with pytest.raises(KafkaConnectionError):
        asyncio.run(start())
    assert any(message in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records][-5:]


def test_unsupported_mechanism_kafka_python(plain_only: SecureBroker, caplog: pytest.LogCaptureFixture,
                                           topic_name: str) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    p = KafkaProducer(bootstrap_servers=plain_only.addr("SASL_PLAINTEXT"), security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="carol", sasl_plain_password="x",
                      request_timeout_ms=3000, max_block_ms=3000, reconnect_backoff_max_ms=200, api_version=(3, 9))
    try:
        with pytest.raises(KafkaTimeoutError):
            p.send(topic_name, b"x").get(timeout=5)
    finally:
        p.close(timeout=1)
    assert any("UnsupportedSaslMechanism" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records][-5:]
    _healthy(plain_only, topic_name)


@pytest.mark.parametrize("case,user,password,message", [
    ("sasl-plain", "nobody", "whatever", "Authentication failed: Invalid username or password"),
    ("sasl-scram-512", "nobody", "whatever", "invalid credentials with SASL mechanism SCRAM-SHA-512"),
    ("sasl-scram-512", "carol", "wrong", "invalid credentials with SASL mechanism SCRAM-SHA-512"),
    ("sasl-ssl-scram-256", "dave", "wrong", "invalid credentials with SASL mechanism SCRAM-SHA-256"),
])
def test_unknown_users_and_wrong_scram_passwords_aiokafka(secure: SecureBroker, pki: Pki, case: str, user: str,
                                                          password: str, message: str,
                                                          caplog: pytest.LogCaptureFixture, topic_name: str) -> None:
    kw = {**aio_security(pki, case), "sasl_plain_username": user, "sasl_plain_password": password}
    _aio_fails(secure.addr(CASES[case][0]), kw, message, caplog)
    _healthy(secure, topic_name)


@pytest.mark.parametrize("case,message", [
    ("sasl-plain", "Authentication failed: Invalid username or password"),
    ("sasl-scram-512", "invalid credentials with SASL mechanism SCRAM-SHA-512"),
])
def test_unknown_user_kafka_python(secure: SecureBroker, pki: Pki, case: str, message: str,
                                   caplog: pytest.LogCaptureFixture, topic_name: str) -> None:
    kw = {**kp_security(pki, case), "sasl_plain_username": "nobody", "sasl_plain_password": "whatever"}
    _kp_fails(secure, case, kw, message, caplog, topic_name)
    _healthy(secure, topic_name)

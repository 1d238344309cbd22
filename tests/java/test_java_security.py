"""The Java client (kafka-clients 3.9) over TLS and SASL: SSL, mutual TLS, SASL_PLAINTEXT with PLAIN and
SCRAM-SHA-512, SASL_SSL with SCRAM-SHA-256 (PEM truststores and keystores, KIP-651), bad credentials, SCRAM users
managed with its Admin client, and KIP-368 re-authentication (SecurityCompat.java beside this file)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.java.test_java_client import HERE, JAVA_LOG, _missing, compile_java
from tests.security_setup import PLAIN_USERS, Pki, SecureBroker, make_pki, plain_only_broker

_why = _missing()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")

SOURCES = [HERE / "SecurityCompat.java", HERE / "org" / "slf4j" / "impl" / "StaticLoggerBinder.java"]
JAVA_TIMEOUT = 180


@pytest.fixture(scope="module")
def java_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_java(tmp_path_factory, SOURCES, "java-security-classes")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[SecureBroker]:
    b = SecureBroker(tmp_path_factory.mktemp("secure"), pki, {"connections.max.reauth.ms": "2000"})
    b.start()
    yield b
    b.stop()


def java(classpath: str, b: SecureBroker, listener: str, scenario: str, **args: Any) -> list[str]:
    cmd = ["java", f"-Dkcompat.log={JAVA_LOG}", "-cp", classpath, "SecurityCompat", b.addr(listener), scenario,
           *(f"{k}={v}" for k, v in args.items())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=JAVA_TIMEOUT)
    if r.returncode != 0 or r.stdout.splitlines()[-1:] != [f"DONE {scenario}"]:
        raise AssertionError(f"SecurityCompat {scenario} on {listener} exited {r.returncode}\n--- stdout:\n{r.stdout}\n"
                             f"--- stderr:\n{r.stderr[-6000:]}\n--- broker log:\n{b.read_log()[-3000:]}")
    return [line[3:] for line in r.stdout.splitlines() if line.startswith("OK ")]


def props(pki: Pki, listener: str, mechanism: str | None = None, user: str = "", password: str = "",
          client_cert: bool = False) -> dict[str, str]:
    protocol = "SSL" if listener == "MTLS" else listener
    out = {"prop.security.protocol": protocol}
    if "SSL" in protocol:
        out |= {"prop.ssl.truststore.type": "PEM", "prop.ssl.truststore.location": str(pki.ca)}
    if client_cert:
        # KIP-651: the PEM key and certificate chain inline in the config.
        out |= {"prop.ssl.keystore.type": "PEM", "prop.ssl.keystore.key": pki.client_key.read_text(),
                "prop.ssl.keystore.certificate.chain": pki.client_cert.read_text()}
    if mechanism:
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        out |= {"prop.sasl.mechanism": mechanism,
                "prop.sasl.jaas.config": f'{module} required username="{user}" password="{password}";'}
    return out


@pytest.fixture(scope="module")
def scram_users(java_classpath: str, secure: SecureBroker, pki: Pki) -> None:
    """Created with the Java Admin client, over the SASL_SSL listener as the PLAIN user admin."""
    ok = java(java_classpath, secure, "SASL_SSL", "scram-admin", user="gina", password="gina-pw",
              **props(pki, "SASL_SSL", "PLAIN", "admin", PLAIN_USERS["admin"]))
    assert ok == ["alterUserScramCredentials gina", "describeUserScramCredentials [SCRAM_SHA_256:4096, SCRAM_SHA_512:8192]"]


@pytest.mark.parametrize("case", ["ssl", "mtls", "sasl-plain", "sasl-scram-512", "sasl-ssl-scram-256"])
def test_roundtrip(java_classpath: str, secure: SecureBroker, pki: Pki, scram_users: None, case: str,
                   topic_name: str) -> None:
    listener, extra = {
        "ssl": ("SSL", props(pki, "SSL")),
        "mtls": ("MTLS", props(pki, "MTLS", client_cert=True)),
        "sasl-plain": ("SASL_PLAINTEXT", props(pki, "SASL_PLAINTEXT", "PLAIN", "alice", PLAIN_USERS["alice"])),
        "sasl-scram-512": ("SASL_PLAINTEXT", props(pki, "SASL_PLAINTEXT", "SCRAM-SHA-512", "gina", "gina-pw")),
        "sasl-ssl-scram-256": ("SASL_SSL", props(pki, "SASL_SSL", "SCRAM-SHA-256", "gina", "gina-pw")),
    }[case]
    ok = java(java_classpath, secure, listener, "roundtrip", topic=topic_name, count=2000, **extra)
    assert ok == ["produced 2000", "consumed 2000"]


@pytest.mark.parametrize("mechanism,user,password,message", [
    ("PLAIN", "alice", "wrong", "Authentication failed: Invalid username or password"),
    ("PLAIN", "nobody", "x", "Authentication failed: Invalid username or password"),
    ("SCRAM-SHA-256", "gina", "wrong", "invalid credentials with SASL mechanism SCRAM-SHA-256"),
    ("SCRAM-SHA-512", "nobody", "x", "invalid credentials with SASL mechanism SCRAM-SHA-512"),
])
def test_bad_credentials(java_classpath: str, secure: SecureBroker, pki: Pki, scram_users: None, mechanism: str,
                         user: str, password: str, message: str) -> None:
    [line] = java(java_classpath, secure, "SASL_SSL", "badauth", **props(pki, "SASL_SSL", mechanism, user, password))
    assert line.startswith("authfail SaslAuthenticationException") and message in line, line


@pytest.fixture(scope="module")
def plain_only(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[SecureBroker]:
    with plain_only_broker(tmp_path_factory.mktemp("plain-only"), pki) as b:
        yield b


def test_mechanism_the_broker_does_not_offer(java_classpath: str, plain_only: SecureBroker, pki: Pki) -> None:
    """SCRAM-SHA-512 against a listener that offers PLAIN only: the handshake answers UNSUPPORTED_SASL_MECHANISM
    with the enabled list, and the broker serves on."""
    [line] = java(java_classpath, plain_only, "SASL_PLAINTEXT", "badauth",
                  **props(pki, "SASL_PLAINTEXT", "SCRAM-SHA-512", "gina", "gina-pw"))
    assert line.startswith("authfail UnsupportedSaslMechanismException"), line
    assert "SCRAM-SHA-512" in line and "[PLAIN]" in line, line
    assert plain_only.alive()

"""TLS settings as Kafka's: the mTLS principal (the certificate DN, rewritten by ssl.principal.mapping.rules) as the
authorizer sees it, ssl.enabled.protocols and ssl.cipher.suites, PKCS12 and inline keystores, startup errors."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from kbroker.broker.config import ConfigError
from kbroker.broker.security.ssl import certificate_dn, openssl_cipher_name, parse_mapping_rules

from tests.broker.test_acls import produce_error
from tests.broker_process import ROOT
from tests.clients import Msg, RawClient, ck_produce
from tests.security_setup import Pki, SecureBroker, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def mtls_conf(pki: Pki) -> dict[str, str]:
    return {"security_protocol": "SSL", "ssl_ca_location": str(pki.ca),
            "ssl_certificate_location": str(pki.client_cert), "ssl_key_location": str(pki.client_key)}


# ---------------------------------------------------------------- principals


def test_certificate_dn_is_rfc2253(pki: Pki) -> None:
    der = x509.load_pem_x509_certificate(pki.client_cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    assert certificate_dn(der) == pki.client_dn


@pytest.mark.parametrize("rules,dn,expected", [
    ("DEFAULT", "CN=alice,OU=clients,O=kbroker,C=US", "CN=alice,OU=clients,O=kbroker,C=US"),
    ("RULE:^CN=(.*?),OU=(.*?),O=(.*?),C=(.*?)$/$1@$2/L, DEFAULT", "CN=Alice,OU=Clients,O=kbroker,C=US",
     "alice@clients"),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/, DEFAULT", "CN=svc,OU=ServiceUsers,O=x", "svc"),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/, DEFAULT", "CN=bob,OU=People,O=x", "CN=bob,OU=People,O=x"),
    ("RULE:^cn=(.*?),ou=(.*?)$/$1/U", "cn=tom,ou=x", "TOM"),
])
def test_mapping_rules_as_kafka(rules: str, dn: str, expected: str) -> None:
    for rule in parse_mapping_rules(rules):
        name = rule.apply(dn)
        if name is not None:
            assert name == expected
            return
    raise AssertionError("no rule matched")


@pytest.mark.parametrize("bad", ["RULE:^CN=(.*$/$1/", "NOT_A_RULE", "RULE:a/b"])
def test_bad_mapping_rules(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_mapping_rules(bad)


def test_cipher_names() -> None:
    assert openssl_cipher_name("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256") == "ECDHE-RSA-AES128-GCM-SHA256"
    assert openssl_cipher_name("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256") == "ECDHE-ECDSA-CHACHA20-POLY1305"
    assert openssl_cipher_name("TLS_RSA_WITH_AES_256_CBC_SHA") == "AES256-SHA"
    assert openssl_cipher_name("ECDHE-ECDSA-AES256-GCM-SHA384") == "ECDHE-ECDSA-AES256-GCM-SHA384"


@pytest.mark.parametrize("rules,principal", [
    ("DEFAULT", "User:CN=alice,OU=clients,O=kbroker,C=US"),
    ("RULE:^CN=([^,]+),OU=clients,.*$/$1/L,DEFAULT", "User:alice"),
])
def test_mtls_principal_is_what_the_authorizer_sees(tmp_path: Path, pki: Pki, rules: str, principal: str,
                                                    topic_name: str) -> None:
    """With ACLs on, an mTLS client may write only where its (mapped) certificate principal may."""
    b = SecureBroker(tmp_path, pki, {
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:ANONYMOUS",  # the loopback PLAINTEXT listener administers
        "listener.name.mtls.ssl.principal.mapping.rules": rules,
    })
    b.start()
    try:
        admin = AdminClient({"bootstrap.servers": b.addr("PLAINTEXT")})
        admin.create_topics([NewTopic(topic_name, 1, 1), NewTopic(topic_name + "-other", 1, 1)])[topic_name].result(30)
        acl = [AclBinding(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL, principal, "*", op,
                          AclPermissionType.ALLOW) for op in (AclOperation.WRITE, AclOperation.DESCRIBE)]
        for f in admin.create_acls(acl).values():
            f.result(30)
        ck_produce(b.addr("MTLS"), topic_name, [Msg(b"k", b"by certificate")], **mtls_conf(pki))
        assert produce_error(b.addr("MTLS"), topic_name + "-other", **mtls_conf(pki)) == \
            KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        b.stop()


def test_requested_client_auth_takes_a_certificate_when_offered(tmp_path: Path, pki: Pki, topic_name: str) -> None:
    """ssl.client.auth=requested: a client without a certificate connects as User:ANONYMOUS, one with a trusted
    certificate connects as its DN; only the latter may write where the ACLs name the DN."""
    dn = "User:CN=alice,OU=clients,O=kbroker,C=US"
    b = SecureBroker(tmp_path, pki, {
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "allow.everyone.if.no.acl.found": "true",  # resources without ACLs stay open (the admin, the other topic)
        "listener.name.mtls.ssl.client.auth": "requested",
    })
    b.start()
    try:
        admin = AdminClient({"bootstrap.servers": b.addr("PLAINTEXT")})
        for f in admin.create_topics([NewTopic(topic_name, 1, 1), NewTopic(topic_name + "-open", 1, 1)]).values():
            f.result(30)
        acl = [AclBinding(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL, dn, "*", op,
                          AclPermissionType.ALLOW) for op in (AclOperation.WRITE, AclOperation.DESCRIBE)]
        for f in admin.create_acls(acl).values():
            f.result(30)
        no_cert = {"security_protocol": "SSL", "ssl_ca_location": str(pki.ca)}
        ck_produce(b.addr("MTLS"), topic_name + "-open", [Msg(b"k", b"no certificate")], **no_cert)
        assert produce_error(b.addr("MTLS"), topic_name, **no_cert) == KafkaError.TOPIC_AUTHORIZATION_FAILED
        ck_produce(b.addr("MTLS"), topic_name, [Msg(b"k", b"by certificate")], **mtls_conf(pki))
        assert b.alive()
    finally:
        b.stop()


def test_unmatched_mapping_rule_closes_the_connection(tmp_path: Path, pki: Pki) -> None:
    b = SecureBroker(tmp_path, pki, {"listener.name.mtls.ssl.principal.mapping.rules": "RULE:^CN=nobody,.*$/x/"})
    b.start()
    try:
        raw = RawClient(b.addr("MTLS"))
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        raw.sock = ctx.wrap_socket(raw.sock, server_hostname="localhost")
        assert raw.closed_by_peer()
        assert "no ssl.principal.mapping.rules rule matches" in b.read_log()
        assert b.alive()
    finally:
        b.stop()


# ---------------------------------------------------------------- protocols, suites, key stores


def test_enabled_protocols_and_suites(tmp_path: Path, pki: Pki) -> None:
    b = SecureBroker(tmp_path, pki, {
        "listener.name.ssl.ssl.enabled.protocols": "TLSv1.2",
        "listener.name.ssl.ssl.cipher.suites": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "listener.name.sasl_ssl.ssl.enabled.protocols": "TLSv1.3",
    })
    b.start()
    try:
        def connect(listener: str, version: ssl.TLSVersion) -> ssl.SSLSocket:
            raw = RawClient(b.addr(listener))
            ctx = ssl.create_default_context(cafile=str(pki.ca))
            ctx.minimum_version = ctx.maximum_version = version
            raw.sock = ctx.wrap_socket(raw.sock, server_hostname="localhost")
            return raw.sock  # type: ignore[return-value]

        s = connect("SSL", ssl.TLSVersion.TLSv1_2)
        assert s.version() == "TLSv1.2" and s.cipher()[0] == "ECDHE-ECDSA-AES256-GCM-SHA384"
        s.close()
        with pytest.raises(ssl.SSLError):
            connect("SSL", ssl.TLSVersion.TLSv1_3)
        s = connect("SASL_SSL", ssl.TLSVersion.TLSv1_3)
        assert s.version() == "TLSv1.3"
        s.close()
        with pytest.raises(ssl.SSLError):
            connect("SASL_SSL", ssl.TLSVersion.TLSv1_2)
    finally:
        b.stop()


def test_pkcs12_keystore_and_inline_truststore(tmp_path: Path, pki: Pki, topic_name: str) -> None:
    key = serialization.load_pem_private_key(pki.broker_key.read_bytes(), None)
    certs = x509.load_pem_x509_certificates(pki.broker_cert.read_bytes())
    p12 = tmp_path / "broker.p12"
    p12.write_bytes(pkcs12.serialize_key_and_certificates(
        b"broker", key, certs[0], certs[1:],  # type: ignore[arg-type]
        serialization.BestAvailableEncryption(b"store-pw")))
    b = SecureBroker(tmp_path / "b", pki, {
        "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(p12), "ssl.keystore.password": "store-pw",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "", "ssl.truststore.certificates": pki.ca.read_text(),
    })
    b.start()
    try:
        ck_produce(b.addr("MTLS"), topic_name, [Msg(b"k", b"p12")], **mtls_conf(pki))
        # Passwords and keys are sensitive: DescribeConfigs shows none of them.
        from confluent_kafka.admin import ConfigResource

        admin = AdminClient({"bootstrap.servers": b.addr("PLAINTEXT")})
        res = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "0")])
        entries = next(iter(res.values())).result(30)
        for name in ("ssl.keystore.password", "ssl.truststore.certificates"):
            assert entries[name].is_sensitive and entries[name].value is None
    finally:
        b.stop()


@pytest.mark.parametrize("override,message", [
    ({"ssl.keystore.location": "/nonexistent.pem"}, "ssl.keystore.location"),
    ({"ssl.keystore.type": "JKS"}, "ssl.keystore.type"),
    ({"listener.name.sasl_plaintext.sasl.enabled.mechanisms": "GSSAPI"}, "sasl.enabled.mechanisms"),
    ({"listener.name.sasl_ssl.plain.sasl.jaas.config": "not jaas"}, "sasl.jaas.config"),
    ({"ssl.client.auth": "sometimes"}, "ssl.client.auth"),
])
def test_bad_security_config_stops_startup(tmp_path: Path, pki: Pki, override: dict[str, str], message: str) -> None:
    b = SecureBroker(tmp_path, pki, override)
    args = [sys.executable, "-m", "kbroker.broker", str(ROOT / "configs" / "server.properties")]
    for k, v in b.overrides.items():
        args += ["--override", f"{k}={v}"]
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]


def test_no_committed_private_keys() -> None:
    """No key is committed: the repository holds no private key."""
    out = subprocess.run(["git", "grep", "-lE", "-----BEGIN( [A-Z]+)? PRIVATE KEY-----"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "", out.stdout


def test_keystore_rotation_without_restart(tmp_path: Path, pki: Pki) -> None:
    """A keystore file replaced in place is picked up for new connections within the reload check (10 s);
    an unreadable one leaves the current certificate in place."""
    import os
    import shutil
    import time

    keystore = tmp_path / "keystore.pem"
    shutil.copy(pki.broker_keystore, keystore)
    b = SecureBroker(tmp_path / "b", pki, {"ssl.keystore.location": str(keystore)})
    b.start()

    def served_cert() -> bytes:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        raw = RawClient(b.addr("SSL"))
        with ctx.wrap_socket(raw.sock) as s:
            der = s.getpeercert(binary_form=True)
        assert der is not None
        return der

    def first_cert(path: Path) -> bytes:
        return x509.load_pem_x509_certificates(path.read_bytes())[0].public_bytes(serialization.Encoding.DER)

    try:
        assert served_cert() == first_cert(pki.broker_keystore)
        open_conn = RawClient(b.addr("SSL"))
        open_conn.sock = ssl.create_default_context(cafile=str(pki.ca)).wrap_socket(open_conn.sock,
                                                                                      server_hostname="localhost")
        # A broken file first: ignored.
        keystore.write_text("-----BEGIN GARBAGE-----\n")
        time.sleep(11)
        assert served_cert() == first_cert(pki.broker_keystore)
        assert "does not load, keeping the current one" in b.read_log()
        # Then a new key and certificate, replaced atomically as cert-manager and certbot do.
        fresh = make_pki(tmp_path / "fresh")
        tmp = tmp_path / "keystore.pem.new"
        shutil.copy(fresh.broker_keystore, tmp)
        os.replace(tmp, keystore)
        deadline = time.monotonic() + 15
        while served_cert() != first_cert(fresh.broker_keystore):
            assert time.monotonic() < deadline, "the new keystore was not picked up"
            time.sleep(0.5)
        from kbroker.protocol.messages import MetadataRequest

        assert open_conn.request(3, 9, MetadataRequest(topics=[])).brokers  # connections made before keep working
        open_conn.close()
    finally:
        b.stop()

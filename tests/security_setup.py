"""TLS and SASL fixtures for tests: a throwaway CA and certificates made with `cryptography` (never committed
keys), and a broker with one listener of each security protocol.

Listeners of `SecureBroker` (all on 127.0.0.1):
- PLAINTEXT: open, for set-up (creating SCRAM users) and for checking the broker is healthy.
- SSL: TLS, no client certificate asked for.
- MTLS: SSL with ssl.client.auth=required; the principal is the client certificate's DN.
- SASL_PLAINTEXT and SASL_SSL: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.broker_process import BrokerProcess, free_port

PLAIN_USERS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret"}
SCRAM_USERS = {"carol": "carol-secret", "dave": "dave-secret"}


def _name(cn: str, ou: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COUNTRY_NAME, "US"), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kbroker")]
    if ou:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    enc: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass
class Pki:
    dir: Path
    ca: Path  # CA certificate (the truststore of clients and broker)
    broker_keystore: Path  # broker key + certificate chain (PEM keystore)
    broker_cert: Path
    broker_key: Path
    client_cert: Path  # CN=alice,OU=clients
    client_key: Path
    client_dn: str
    rogue_cert: Path  # signed by another CA
    rogue_key: Path


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def issue(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
              issuer_key: ec.EllipticCurvePrivateKey, ca: bool = False, server: bool = False) -> x509.Certificate:
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, rogue_ca_key = _key(), _key()
    ca_name, rogue_ca_name = _name("kbroker-test-ca"), _name("rogue-ca")
    ca_cert = issue(ca_name, ca_key, ca_name, ca_key, ca=True)
    broker_key, client_key, rogue_key = _key(), _key(), _key()
    broker_cert = issue(_name("localhost", "brokers"), broker_key, ca_name, ca_key, server=True)
    client_cert = issue(_name("alice", "clients"), client_key, ca_name, ca_key)
    rogue_cert = issue(_name("mallory", "clients"), rogue_key, rogue_ca_name, rogue_ca_key)

    def write(name: str, data: bytes) -> Path:
        path = directory / name
        path.write_bytes(data)
        return path

    return Pki(
        dir=directory,
        ca=write("ca.pem", _pem_cert(ca_cert)),
        broker_keystore=write("broker-keystore.pem", _pem_key(broker_key) + _pem_cert(broker_cert) + _pem_cert(ca_cert)),
        broker_cert=write("broker-cert.pem", _pem_cert(broker_cert) + _pem_cert(ca_cert)),
        broker_key=write("broker-key.pem", _pem_key(broker_key)),
        client_cert=write("client-cert.pem", _pem_cert(client_cert)),
        client_key=write("client-key.pem", _pem_key(client_key)),
        client_dn="CN=alice,OU=clients,O=kbroker,C=US",
        rogue_cert=write("rogue-cert.pem", _pem_cert(rogue_cert)),
        rogue_key=write("rogue-key.pem", _pem_key(rogue_key)),
    )


def plain_jaas(users: dict[str, str], username: str = "admin") -> str:
    opts = " ".join(f'user_{u}="{p}"' for u, p in users.items())
    return (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{username}" '
            f'password="{users[username]}" {opts};')


LISTENERS = ("PLAINTEXT", "SSL", "MTLS", "SASL_PLAINTEXT", "SASL_SSL")


class SecureBroker(BrokerProcess):
    """A broker with every kind of listener; `addr(listener)` is the bootstrap of one of them."""

    def __init__(self, data_dir: Path, pki: Pki, overrides: dict[str, str] | None = None) -> None:
        self.pki = pki
        self.ports = {name: free_port() for name in LISTENERS}
        listeners = ",".join(f"{n}://127.0.0.1:{p}" for n, p in self.ports.items())
        conf = {
            "listeners": listeners,
            "listener.security.protocol.map":
                "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "inter.broker.listener.name": "PLAINTEXT",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.broker_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(pki.ca),
            "listener.name.mtls.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_jaas(PLAIN_USERS),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": plain_jaas(PLAIN_USERS),
            "connection.failed.authentication.delay.ms": "50",
            **(overrides or {}),
        }
        super().__init__(data_dir, conf, port=self.ports["PLAINTEXT"])

    def listen_ports(self) -> list[int]:
        return list(self.ports.values())

    def addr(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"


@contextmanager
def plain_only_broker(data_dir: Path, pki: Pki) -> Iterator[SecureBroker]:
    """A SecureBroker whose SASL_PLAINTEXT listener offers PLAIN only (a client asking for SCRAM there gets
    UNSUPPORTED_SASL_MECHANISM)."""
    b = SecureBroker(data_dir, pki, {"listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN"})
    b.start()
    try:
        yield b
    finally:
        b.stop()

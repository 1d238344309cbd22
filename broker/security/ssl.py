"""TLS for listeners and for inter-broker connections, from Kafka's ssl.* keys (Kafka's SslFactory).

Keystores are PEM (a file holding the private key and certificate chain, or inline with KIP-651's
ssl.keystore.certificate.chain / ssl.keystore.key) or PKCS12; truststores PEM (file or inline
ssl.truststore.certificates) or PKCS12. JKS needs a JVM: convert it with keytool to PKCS12 or PEM.
Inline keys are handed to OpenSSL through an anonymous memory file, never written to disk.

The principal of an SSL connection is the peer certificate's subject in RFC 2253 form (as Java's
X500Principal.getName()), rewritten by ssl.principal.mapping.rules (Kafka's SslPrincipalMapper).
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from kbroker.broker.config import ConfigError, KafkaConfig

_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
# TLS 1.3 suites are not selectable through OpenSSL's cipher list (Python has no set_ciphersuites): they are
# accepted in ssl.cipher.suites and left to OpenSSL, which offers only AEAD suites anyway.
_TLS13_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
                           "TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256"})


def openssl_cipher_name(name: str) -> str:
    """A Java/IANA suite name (TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256) as OpenSSL spells it
    (ECDHE-RSA-AES128-GCM-SHA256); names already in OpenSSL form pass through."""
    m = re.fullmatch(r"TLS_(\w+?)_WITH_(\w+)", name)
    if not m:
        return name
    kx, cipher = m.group(1), m.group(2)
    kx_part = {"RSA": ""}.get(kx, kx.replace("_", "-"))
    c = re.fullmatch(r"AES_(128|256)_(GCM|CBC|CCM)_(SHA|SHA256|SHA384)", cipher)
    if c:
        bits, mode, mac = c.groups()
        body = f"AES{bits}-SHA" if mode == "CBC" and mac == "SHA" else (
            f"AES{bits}-{mac}" if mode == "CBC" else f"AES{bits}-{mode}-{mac}")
    elif cipher == "CHACHA20_POLY1305_SHA256":
        body = "CHACHA20-POLY1305"
    else:
        body = cipher.replace("_", "-")
    return f"{kx_part}-{body}" if kx_part else body


@contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path OpenSSL can open that lives only in memory (Linux memfd)."""
    fd = os.memfd_create("kbroker-pem", 0)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _password(value: str | None) -> bytes | None:
    return value.encode() if value else None


def _load_keystore(ctx: ssl.SSLContext, get: _Getter, where: str) -> bool:
    """Loads the key and chain into ctx; False when none is configured."""
    kind = str(get("ssl.keystore.type")).upper()
    location = get("ssl.keystore.location")
    chain, key = get("ssl.keystore.certificate.chain"), get("ssl.keystore.key")
    key_password = get("ssl.key.password") or get("ssl.keystore.password")
    if chain or key:
        if kind != "PEM":
            raise ConfigError(f"{where}ssl.keystore.key: inline keys need ssl.keystore.type=PEM")
        if not (chain and key):
            raise ConfigError(f"{where}ssl.keystore.certificate.chain and ssl.keystore.key go together")
        with _memory_file(f"{key}\n{chain}\n".encode()) as path:
            ctx.load_cert_chain(path, password=_password(key_password))
        return True
    if not location:
        return False
    try:
        data = open(location, "rb").read()
    except OSError as e:
        raise ConfigError(f"{where}ssl.keystore.location: cannot read {location}: {e.strerror}") from None
    if kind == "PEM":
        with _memory_file(data) as path:
            ctx.load_cert_chain(path, password=_password(key_password))
    elif kind == "PKCS12":
        pkey, cert, extra = pkcs12.load_key_and_certificates(data, _password(get("ssl.keystore.password")))
        if pkey is None or cert is None:
            raise ConfigError(f"{where}ssl.keystore.location: {location} holds no private key and certificate")
        pem = pkey.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
        for c in [cert, *extra]:
            pem += c.public_bytes(serialization.Encoding.PEM)
        with _memory_file(pem) as path:
            ctx.load_cert_chain(path)
    else:
        raise ConfigError(f"{where}ssl.keystore.type: {kind} is not supported (use PEM or PKCS12)")
    return True


def _load_truststore(ctx: ssl.SSLContext, get: _Getter, where: str) -> bool:
    kind = str(get("ssl.truststore.type")).upper()
    inline, location = get("ssl.truststore.certificates"), get("ssl.truststore.location")
    if inline:
        ctx.load_verify_locations(cadata=inline)
        return True
    if not location:
        return False
    try:
        data = open(location, "rb").read()
    except OSError as e:
        raise ConfigError(f"{where}ssl.truststore.location: cannot read {location}: {e.strerror}") from None
    if kind == "PEM":
        ctx.load_verify_locations(cadata=data.decode("ascii", "replace"))
    elif kind == "PKCS12":
        certs = pkcs12.load_pkcs12(data, _password(get("ssl.truststore.password")))
        pems = [c.certificate.public_bytes(serialization.Encoding.PEM) for c in certs.additional_certs]
        if certs.cert is not None:
            pems.append(certs.cert.certificate.public_bytes(serialization.Encoding.PEM))
        ctx.load_verify_locations(cadata=b"".join(pems).decode())
    else:
        raise ConfigError(f"{where}ssl.truststore.type: {kind} is not supported (use PEM or PKCS12)")
    return True


class _Getter:
    def __init__(self, config: KafkaConfig, listener: str) -> None:
        self.config, self.listener = config, listener

    def __call__(self, name: str) -> object:
        return self.config.for_listener(self.listener, name)


def _common(ctx: ssl.SSLContext, get: _Getter, where: str) -> None:
    protocols = [p for p in get("ssl.enabled.protocols") if p in _PROTOCOLS]  # type: ignore[attr-defined]
    if not protocols:
        raise ConfigError(f"{where}ssl.enabled.protocols: no protocol kbroker supports (TLSv1.2, TLSv1.3)")
    ctx.minimum_version = min(_PROTOCOLS[p] for p in protocols)
    ctx.maximum_version = max(_PROTOCOLS[p] for p in protocols)
    suites = [s for s in get("ssl.cipher.suites") if s not in _TLS13_SUITES]  # type: ignore[attr-defined]
    if suites:
        try:
            ctx.set_ciphers(":".join(openssl_cipher_name(s) for s in suites))
        except ssl.SSLError:
            raise ConfigError(f"{where}ssl.cipher.suites: no usable suite in {', '.join(suites)}") from None


def server_context(config: KafkaConfig, listener: str) -> ssl.SSLContext:
    """The SSLContext of an SSL or SASL_SSL listener."""
    where = f"listener {listener}: "
    get = _Getter(config, listener)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(ctx, get, where)
    try:
        if not _load_keystore(ctx, get, where):
            raise ConfigError(f"{where}ssl.keystore.location (or ssl.keystore.certificate.chain and "
                              "ssl.keystore.key) is required for an SSL listener")
        client_auth = str(get("ssl.client.auth")).lower()
        if client_auth != "none" and not _load_truststore(ctx, get, where):
            raise ConfigError(f"{where}ssl.client.auth={client_auth} needs a truststore")
    except ssl.SSLError as e:
        raise ConfigError(f"{where}cannot load the TLS key material: {e}") from None
    except ValueError as e:
        raise ConfigError(f"{where}cannot load the TLS key material: {e}") from None
    ctx.verify_mode = _CLIENT_AUTH[client_auth]
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return ctx


def client_context(config: KafkaConfig, listener: str) -> ssl.SSLContext:
    """The SSLContext this broker uses to reach another broker's listener (inter-broker)."""
    where = f"listener {listener}: "
    get = _Getter(config, listener)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _common(ctx, get, where)
    try:
        _load_keystore(ctx, get, where)
        if not _load_truststore(ctx, get, where):
            ctx.load_default_certs()
    except (ssl.SSLError, ValueError) as e:
        raise ConfigError(f"{where}cannot load the TLS key material: {e}") from None
    ctx.check_hostname = str(get("ssl.endpoint.identification.algorithm") or "").lower() == "https"
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


# ---------------------------------------------------------------- principals


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if not self.pattern.fullmatch(dn):
            return None
        out = self.pattern.sub(self.replacement, dn)
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


_RULE = r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(?:,\s*|$)")


def parse_mapping_rules(text: str) -> list[_Rule]:
    """ssl.principal.mapping.rules as Kafka's SslPrincipalMapper reads it."""
    rules: list[_Rule] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _SPLITTER.match(text, pos)
        if m is None or m.end() == pos:
            raise ConfigError(f"ssl.principal.mapping.rules: invalid rule at {text[pos:]!r}")
        pos = m.end()
        if m.group(2):
            rules.append(_Rule(None))
        elif m.group(3) is not None:
            # Java's $1 group references become Python's \g<1>.
            replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(4).replace("\\/", "/"))
            try:
                rules.append(_Rule(re.compile(m.group(3).replace("\\/", "/")), replacement, m.group(5)))
            except re.error as e:
                raise ConfigError(f"ssl.principal.mapping.rules: bad pattern {m.group(3)!r}: {e}") from None
        else:
            raise ConfigError(f"ssl.principal.mapping.rules: invalid rule {m.group(1)!r}")
    return rules or [_Rule(None)]


def certificate_dn(der: bytes) -> str:
    """The subject of a DER certificate as RFC 2253 (Java's X500Principal.getName())."""
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


def ssl_principal(ssl_object: ssl.SSLObject | None, rules: list[_Rule]) -> str:
    """Kafka's DefaultKafkaPrincipalBuilder for SSL: ANONYMOUS without a client certificate."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return "User:ANONYMOUS"
    dn = certificate_dn(der)
    for rule in rules:
        name = rule.apply(dn)
        if name is not None:
            return f"User:{name}"
    raise ValueError(f"no ssl.principal.mapping.rules rule matches {dn!r}")

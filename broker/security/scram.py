"""SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka's ScramSaslServer / ScramSaslClient.

Credentials are kept salted (Kafka's ScramCredential: salt, StoredKey, ServerKey, iterations), never as
passwords; their text form is Kafka's ScramCredentialUtils.credentialToString, the value stored under the
mechanism's name in ZooKeeper's /config/users/<user>.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

from kbroker.broker.security.sasl_common import SaslAuthenticationError, SaslError

MECHANISMS: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# AlterUserScramCredentials' mechanism ids (Kafka's ScramMechanism.type()).
MECHANISM_IDS: dict[int, str] = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
MECHANISM_ID_OF: dict[str, int] = {v: k for k, v in MECHANISM_IDS.items()}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_text(self) -> str:
        b64 = base64.b64encode
        return (f"salt={b64(self.salt).decode()},stored_key={b64(self.stored_key).decode()},"
                f"server_key={b64(self.server_key).decode()},iterations={self.iterations}")

    @classmethod
    def from_text(cls, text: str) -> ScramCredential:
        fields = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
        try:
            return cls(base64.b64decode(fields["salt"]), base64.b64decode(fields["stored_key"]),
                       base64.b64decode(fields["server_key"]), int(fields["iterations"]))
        except (KeyError, ValueError) as e:
            raise ValueError(f"not a SCRAM credential: {e}") from None


def _hmac(hash_name: str, key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hash_name).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802: PBKDF2 with the mechanism's HMAC."""
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism], password.encode(), salt, iterations)


def credential_from_salted(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    h = MECHANISMS[mechanism]
    client_key = _hmac(h, salted, b"Client Key")
    return ScramCredential(salt, hashlib.new(h, client_key).digest(), _hmac(h, salted, b"Server Key"), iterations)


def new_credential(mechanism: str, password: str, iterations: int = MIN_ITERATIONS) -> ScramCredential:
    salt = os.urandom(32)
    return credential_from_salted(mechanism, salted_password(mechanism, password, salt, iterations), salt, iterations)


def _random_nonce() -> str:
    """Alphanumeric, as Kafka's ScramFormatter.secureRandomString: some clients mishandle '+' and '/' in nonces."""
    n = int.from_bytes(os.urandom(17), "big")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(digits[r])
    return "".join(out) or "0"


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in message.split(","):
        if len(item) < 2 or item[1] != "=":
            raise SaslError(f"Invalid SCRAM message: {message!r}")
        out.setdefault(item[0], item[2:])
    return out


def _sasl_name(name: str) -> str:
    """RFC 5802 saslname: ',' and '=' arrive as =2C and =3D."""
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise SaslError("Invalid SCRAM user name")
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM exchange on the broker: client-first -> server-first -> client-final -> server-final."""

    def __init__(self, mechanism: str, lookup: object) -> None:
        self.mechanism = mechanism
        self.hash = MECHANISMS[mechanism]
        self._lookup = lookup  # (user, mechanism) -> ScramCredential | None
        self._state = 0
        self.complete = False
        self.authorization_id = ""
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2 = ""
        self._nonce = ""

    def evaluate(self, token: bytes) -> bytes:
        try:
            message = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslError("Invalid SCRAM message: not UTF-8") from None
        if self._state == 0:
            return self._client_first(message)
        if self._state == 1:
            return self._client_final(message)
        raise SaslError("SCRAM exchange already complete")

    def _client_first(self, message: str) -> bytes:
        # gs2-header: cbind-flag "," [authzid] ","; channel binding (p=) is not offered by Kafka.
        parts = message.split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y"):
            raise SaslError(f"Invalid SCRAM client first message: {message!r}")
        authzid = parts[1][2:] if parts[1].startswith("a=") else ""
        if parts[1] and not parts[1].startswith("a="):
            raise SaslError("Invalid SCRAM client first message: bad authzid")
        self._gs2 = f"{parts[0]},{parts[1]},"
        self._client_first_bare = parts[2]
        attrs = _attributes(parts[2])
        if "m" in attrs:
            raise SaslError("SCRAM reserved extension m= is not supported")
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise SaslError(f"Invalid SCRAM client first message: {message!r}")
        if attrs.get("t") is not None or "tokenauth=true" in parts[2].split(","):
            raise SaslError("Delegation token authentication is not supported")
        user = _sasl_name(attrs["n"])
        if authzid and _sasl_name(authzid) != user:
            raise SaslAuthenticationError(
                "Authentication failed: Client requested an authorization id that is different from username")
        credential = self._lookup(user, self.mechanism)  # type: ignore[operator]
        if credential is None:
            raise SaslError("Authentication failed: Invalid user credentials")
        self._credential = credential
        self.authorization_id = user
        self._nonce = attrs["r"] + _random_nonce()
        self._server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                              f"i={credential.iterations}")
        self._state = 1
        return self._server_first.encode()

    def _client_final(self, message: str) -> bytes:
        assert self._credential is not None
        without_proof, sep, proof_b64 = message.rpartition(",p=")
        if not sep:
            raise SaslError("Invalid SCRAM client final message: no proof")
        attrs = _attributes(without_proof)
        # Kafka checks endsWith, not equality: librdkafka before 1.9 repeats the client nonce in front.
        if not attrs.get("r", "").endswith(self._nonce):
            raise SaslError("Invalid client nonce in the final client message")
        try:
            channel_binding = base64.b64decode(attrs.get("c", ""), validate=True)
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise SaslError("Invalid SCRAM client final message: bad base64") from None
        if channel_binding != self._gs2.encode():
            raise SaslError("Invalid SCRAM client final message: channel binding mismatch")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = _hmac(self.hash, self._credential.stored_key, auth_message)
        if len(proof) != len(client_signature):
            raise SaslError("Invalid client credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self.hash, client_key).digest(), self._credential.stored_key):
            raise SaslError("Invalid client credentials")
        server_signature = _hmac(self.hash, self._credential.server_key, auth_message)
        self._state = 2
        self.complete = True
        return b"v=" + base64.b64encode(server_signature)


class ScramClient:
    """The client side (for inter-broker connections)."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self.mechanism = mechanism
        self.hash = MECHANISMS[mechanism]
        self.username, self.password = username, password
        self._nonce = _random_nonce()
        self._client_first_bare = ""
        self._auth_message = b""
        self._salted = b""

    def first(self) -> bytes:
        name = self.username.replace("=", "=3D").replace(",", "=2C")
        self._client_first_bare = f"n={name},r={self._nonce}"
        return f"n,,{self._client_first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs = _attributes(text)
        if not attrs.get("r", "").startswith(self._nonce):
            raise SaslError("SCRAM server nonce does not extend the client nonce")
        salt, iterations = base64.b64decode(attrs["s"]), int(attrs["i"])
        self._salted = salted_password(self.mechanism, self.password, salt, iterations)
        without_proof = f"c=biws,r={attrs['r']}"
        self._auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        client_key = _hmac(self.hash, self._salted, b"Client Key")
        stored_key = hashlib.new(self.hash, client_key).digest()
        signature = _hmac(self.hash, stored_key, self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = _attributes(server_final.decode())
        if "e" in attrs:
            raise SaslAuthenticationError(f"SCRAM authentication failed: {attrs['e']}")
        server_key = _hmac(self.hash, self._salted, b"Server Key")
        expected = _hmac(self.hash, server_key, self._auth_message)
        if not hmac.compare_digest(base64.b64decode(attrs.get("v", "")), expected):
            raise SaslAuthenticationError("SCRAM server signature does not verify")

"""A small OAuth 2 identity provider for the OAUTHBEARER tests, and a broker with OAUTHBEARER listeners: a client-credentials token endpoint issuing RS256
JWTs (the subject is the client id) and the JWKS that verifies them, on 127.0.0.1; also unsecured JWS tokens."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.broker_process import BrokerProcess, free_port

CLIENTS = {"svc-orders": "orders-secret", "svc-other": "other-secret"}
AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
JWKS_VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
ISSUER = "https://idp.kbroker.test"
AUDIENCE = "kafka"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _json_part(value: dict[str, Any]) -> str:
    return b64url(json.dumps(value, separators=(",", ":")).encode())


def unsecured_token(sub: str, lifetime_s: float = 3600, **claims: Any) -> str:
    """An unsecured JWS as Kafka's OAuthBearerUnsecuredLoginCallbackHandler makes one: its times in whole
    milliseconds (time.milliseconds() / 1000.0), so a token checked within the millisecond it was made is not
    issued in the future."""
    now = int(time.time() * 1000) / 1000
    body = {"sub": sub, "iat": now, "exp": now + lifetime_s, **claims}
    return f"{_json_part({'alg': 'none'})}.{_json_part(body)}."


def client_first_message(token: str, authzid: str = "", **extensions: str) -> bytes:
    """RFC 7628's initial client response, as Kafka's OAuthBearerClientInitialResponse writes it."""
    ext = "".join(f"\x01{k}={v}" for k, v in extensions.items())
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}{ext}\x01\x01".encode()


class IdentityProvider:
    def __init__(self, clients: dict[str, str], lifetime_s: float = 3600) -> None:
        self.clients = clients
        self.lifetime_s = lifetime_s
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "kbroker-test-1"
        self.token_requests = 0
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/jwks":
                    self._send(200, idp.jwks())
                else:
                    self._send(404, {"error": "not_found"})

            def do_POST(self) -> None:  # noqa: N802
                form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
                client_id, secret = (form.get("client_id") or [""])[0], (form.get("client_secret") or [""])[0]
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    client_id, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
                if self.path != "/token" or (form.get("grant_type") or [""])[0] != "client_credentials":
                    self._send(400, {"error": "unsupported_grant_type"})
                    return
                if idp.clients.get(client_id) != secret:
                    self._send(401, {"error": "invalid_client"})
                    return
                idp.token_requests += 1
                scope = (form.get("scope") or [""])[0]
                token = idp.token(client_id, scope=scope or None)
                self._send(200, {"access_token": token, "token_type": "Bearer", "expires_in": int(idp.lifetime_s)})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def jwks_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/jwks"

    @property
    def token_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def jwks(self) -> dict[str, Any]:
        numbers = self.key.public_key().public_numbers()
        n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
        return {"keys": [{"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256", "n": b64url(n),
                          "e": b64url(numbers.e.to_bytes(3, "big"))}]}

    def token(self, sub: str, lifetime_s: float | None = None, key: rsa.RSAPrivateKey | None = None,
              kid: str | None = None, alg: str = "RS256", scope: str | None = None, **claims: Any) -> str:
        now = int(time.time())
        body: dict[str, Any] = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now,
                                "exp": now + (self.lifetime_s if lifetime_s is None else lifetime_s)}
        if scope is not None:
            body["scope"] = scope
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        head = _json_part({"alg": alg, "typ": "JWT", "kid": kid or self.kid})
        signing_input = f"{head}.{_json_part(body)}".encode()
        signature = (key or self.key).sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input.decode()}.{b64url(signature)}"

    def start(self) -> IdentityProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class OAuthBroker(BrokerProcess):
    """PLAINTEXT for set-up (its User:ANONYMOUS is a super user), DEV with unsecured tokens, SCOPED with unsecured
    tokens that must carry the scope "kafka", OIDC with signed JWTs checked against the IdP's JWKS."""

    NAMES = ("PLAINTEXT", "DEV", "SCOPED", "OIDC")

    def __init__(self, data_dir: Path, idp: IdentityProvider, overrides: dict[str, str] | None = None) -> None:
        self.ports = {name: free_port() for name in self.NAMES}
        conf = {
            "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in self.ports.items()),
            "listener.security.protocol.map":
                "PLAINTEXT:PLAINTEXT,DEV:SASL_PLAINTEXT,SCOPED:SASL_PLAINTEXT,OIDC:SASL_PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "sasl.enabled.mechanisms": "OAUTHBEARER",
            "listener.name.scoped.oauthbearer.sasl.jaas.config":
                f'{LOGIN_MODULE} required unsecuredValidatorRequiredScope="kafka";',
            "listener.name.oidc.oauthbearer.sasl.server.callback.handler.class": JWKS_VALIDATOR,
            "listener.name.oidc.sasl.oauthbearer.jwks.endpoint.url": idp.jwks_url,
            "listener.name.oidc.sasl.oauthbearer.expected.audience": "kafka",
            "listener.name.oidc.sasl.oauthbearer.expected.issuer": "https://idp.kbroker.test",
            "sasl.oauthbearer.clock.skew.seconds": "0",
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "true",
            "super.users": "User:ANONYMOUS",
            "connection.failed.authentication.delay.ms": "20",
            **(overrides or {}),
        }
        super().__init__(data_dir, conf, port=self.ports["PLAINTEXT"])

    def listen_ports(self) -> list[int]:
        return list(self.ports.values())

    def addr(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

"""A small OAuth 2 identity provider for the OAUTHBEARER tests: a client-credentials token endpoint issuing RS256
JWTs (the subject is the client id) and the JWKS that verifies them, on 127.0.0.1; also unsecured JWS tokens."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

ISSUER = "https://idp.kbroker.test"
AUDIENCE = "kafka"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _json_part(value: dict[str, Any]) -> str:
    return b64url(json.dumps(value, separators=(",", ":")).encode())


def unsecured_token(sub: str, lifetime_s: float = 3600, **claims: Any) -> str:
    """An unsecured JWS as Kafka's OAuthBearerUnsecuredLoginCallbackHandler makes one."""
    now = time.time()
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

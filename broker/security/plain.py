"""SASL/PLAIN (RFC 4616) as Kafka's PlainSaslServer with PlainServerCallbackHandler: users and passwords
come from the listener's PlainLoginModule options `user_<name>="<password>"`."""

from __future__ import annotations

import hmac

from kbroker.broker.security.sasl_common import SaslAuthenticationError

MECHANISM = "PLAIN"


class PlainServer:
    mechanism = MECHANISM

    def __init__(self, users: dict[str, str]) -> None:
        self._users = users
        self.complete = False
        self.authorization_id = ""

    def evaluate(self, token: bytes) -> bytes:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslAuthenticationError(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
        try:
            authzid, user, password = (x.decode("utf-8") for x in parts)
        except UnicodeDecodeError:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        expected = self._users.get(user)
        # Compare against something even for unknown users: the answer's timing says nothing about names.
        ok = hmac.compare_digest(password.encode(), (expected if expected is not None else "\x00" + password).encode())
        if expected is None or not ok:
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        if authzid and authzid != user:
            raise SaslAuthenticationError(
                "Authentication failed: Client requested an authorization id that is different from username")
        self.authorization_id = user
        self.complete = True
        return b""


def users_from_jaas(options: dict[str, str]) -> dict[str, str]:
    return {k[len("user_"):]: v for k, v in options.items() if k.startswith("user_")}

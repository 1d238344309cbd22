"""SASL on a listener: Kafka's SaslServerAuthenticator state machine, in front of KafkaApis.

Until a connection has authenticated, its frames come here instead of KafkaApis (KafkaConnection.handle
points at `SaslServerAuthenticator.handle`), and frames larger than sasl.server.max.receive.size close it.
As in Kafka:
- HANDSHAKE_OR_VERSIONS: ApiVersions (once) or SaslHandshake; anything else closes the connection.
- SaslHandshake v1 -> AUTHENTICATE: SaslAuthenticate requests carry the mechanism's tokens. Any other
  request is answered ILLEGAL_SASL_STATE and the connection closed.
- SaslHandshake v0 -> the tokens follow as bare size-prefixed frames without a request header, answered
  the same way (the framing of clients older than KIP-152).
- Failures (UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED with its message) are answered after
  connection.failed.authentication.delay.ms and the connection is closed; it reads nothing meanwhile.
- COMPLETE: the connection's principal is User:<authorization id> and its frames go to KafkaApis directly.
  With connections.max.reauth.ms set (KIP-368) the session has a lifetime (session_lifetime_ms in
  SaslAuthenticate v1+): a SaslHandshake starts re-authentication with the same mechanism and principal,
  and any other request after the lifetime closes the connection.
All state lives on the connection's processor loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from kbroker.broker.config import ConfigError, KafkaConfig
from kbroker.broker.network import CloseConnection, Response
from kbroker.broker.security import oauthbearer, plain, scram
from kbroker.broker.security.credentials import ScramCredentialStore
from kbroker.broker.security.sasl_common import SaslAuthenticationError, SaslError, parse_jaas
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    RequestHeader,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

if TYPE_CHECKING:
    from kbroker.broker.apis import KafkaApis
    from kbroker.broker.network import KafkaConnection

log = logging.getLogger("kbroker.security")

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
HANDSHAKE_OR_VERSIONS, HANDSHAKE, AUTHENTICATE, COMPLETE, FAILED = range(5)


def jaas_options(config: KafkaConfig, listener: str, mechanism: str) -> dict[str, str] | None:
    """The login module options for a mechanism on a listener: listener.name.<l>.<mechanism>.sasl.jaas.config,
    then listener.name.<l>.sasl.jaas.config, then sasl.jaas.config."""
    text = config.for_listener(listener, "sasl.jaas.config", mechanism)
    if not text:
        return None
    try:
        return parse_jaas(text)[1]
    except ValueError as e:
        raise ConfigError(f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config: {e}") from None


class SaslSettings:
    """What one SASL listener needs to authenticate its connections (built once at startup)."""

    def __init__(self, config: KafkaConfig, listener: str, credentials: ScramCredentialStore) -> None:
        self.listener = listener
        self.mechanisms: list[str] = list(config.for_listener(listener, "sasl.enabled.mechanisms"))
        self.credentials = credentials
        self.plain_users: dict[str, str] = {}
        if plain.MECHANISM in self.mechanisms:
            options = jaas_options(config, listener, plain.MECHANISM)
            if options is None:
                raise ConfigError(
                    f"listener {listener} enables PLAIN but has no listener.name.{listener.lower()}.plain."
                    "sasl.jaas.config (PlainLoginModule with user_<name>=\"<password>\" options)")
            self.plain_users = plain.users_from_jaas(options)
        self.oauth_validator: oauthbearer.Validator | None = None
        if oauthbearer.MECHANISM in self.mechanisms:
            self.oauth_validator = oauthbearer.validator_for(
                config, listener, jaas_options(config, listener, oauthbearer.MECHANISM) or {})
        self.reauth_ms = {m: int(config.for_listener(listener, "connections.max.reauth.ms", m)) for m in self.mechanisms}
        self.failure_delay_s = config["connection.failed.authentication.delay.ms"] / 1000
        self.max_receive = int(config.for_listener(listener, "sasl.server.max.receive.size"))

    def new_server(self, mechanism: str) -> SaslServer:
        if mechanism == plain.MECHANISM:
            return plain.PlainServer(self.plain_users)
        if mechanism == oauthbearer.MECHANISM:
            assert self.oauth_validator is not None
            return oauthbearer.OAuthBearerServer(self.oauth_validator)
        return scram.ScramServer(mechanism, self.credentials.get)

    def close(self) -> None:
        if self.oauth_validator is not None:
            self.oauth_validator.close()


SaslServer = plain.PlainServer | scram.ScramServer | oauthbearer.OAuthBearerServer


def _encode(header: RequestHeader, body: Any) -> Response:
    return Response(codec.encode_response(header.correlation_id, header.request_api_key,
                                          header.request_api_version, body))


class SaslServerAuthenticator:
    def __init__(self, conn: KafkaConnection, settings: SaslSettings, apis: KafkaApis) -> None:
        self.conn = conn
        self.settings = settings
        self.apis = apis
        self.state = HANDSHAKE_OR_VERSIONS
        self.mechanism = ""
        self.server: SaslServer | None = None
        self.raw_tokens = False
        self.reauthenticating = False
        self.authenticate_version = -1
        self.expires_at: float | None = None  # monotonic seconds; None: the session never expires
        self._detail = ""  # why a SASL exchange failed, for the log only
        self._max_request = conn.max_request
        conn.max_request = min(conn.max_request, settings.max_receive)
        conn.handle = self.handle

    # ------------------------------------------------------------ before (and during re-) authentication

    def handle(self, conn: KafkaConnection, frame: bytes) -> Response | Awaitable[None] | None:
        if self.state == FAILED:
            return None
        if self.raw_tokens and self.state == AUTHENTICATE:
            return self._raw_token(frame)
        try:
            header, pos = codec.decode_request_header(frame)
        except codec.DecodeError:
            # Kafka would take this for a GSSAPI token sent without a handshake; kbroker has no GSSAPI.
            raise CloseConnection("not a Kafka request before SASL authentication (GSSAPI is not supported)") from None
        api_key = header.request_api_key
        if self.state in (HANDSHAKE_OR_VERSIONS, HANDSHAKE):
            if api_key == API_VERSIONS and self.state == HANDSHAKE_OR_VERSIONS:
                result = self.apis.handle(conn, frame)
                if 0 <= header.request_api_version <= 4:
                    self.state = HANDSHAKE
                return result  # type: ignore[return-value]
            if api_key == SASL_HANDSHAKE:
                return self._handshake(header, self._decode(SaslHandshakeRequest, header, frame, pos))
            raise CloseConnection(f"unexpected {_api(api_key)} request during SASL handshake")
        if self.state == AUTHENTICATE:
            if api_key != SASL_AUTHENTICATE:
                return self._illegal_request(header)
            return self._authenticate(header, self._decode(SaslAuthenticateRequest, header, frame, pos))
        raise CloseConnection(f"unexpected {_api(api_key)} request in SASL state {self.state}")

    @staticmethod
    def _decode(cls: type, header: RequestHeader, frame: bytes, pos: int) -> Any:
        lo, hi = cls.VALID_VERSIONS  # type: ignore[attr-defined]
        if not lo <= header.request_api_version <= hi:
            raise CloseConnection(f"unsupported {cls.__name__} v{header.request_api_version}")
        try:
            return codec.decode(cls, header.request_api_version, frame, pos)[0]
        except codec.DecodeError as e:
            raise CloseConnection(f"malformed {cls.__name__}: {e}") from None

    def _handshake(self, header: RequestHeader, req: SaslHandshakeRequest) -> Response | Awaitable[None]:
        enabled = self.settings.mechanisms
        if req.mechanism not in enabled or (self.reauthenticating and req.mechanism != self.mechanism):
            what = "re-authentication" if self.reauthenticating else "authentication"
            return self._fail(
                _encode(header, SaslHandshakeResponse(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                                      mechanisms=enabled)),
                f"unsupported SASL mechanism {req.mechanism!r} for {what}")
        self.mechanism = req.mechanism
        self.server = self.settings.new_server(req.mechanism)
        self.raw_tokens = header.request_api_version == 0
        self.conn.raw_frames = self.raw_tokens
        self.state = AUTHENTICATE
        return _encode(header, SaslHandshakeResponse(error_code=ErrorCode.NONE, mechanisms=enabled))

    def _evaluate(self, token: bytes) -> tuple[bytes | None, str | None]:
        """(server token, None) or (None, the error message for the client)."""
        assert self.server is not None
        try:
            return self.server.evaluate(token), None
        except SaslAuthenticationError as e:
            return None, str(e)
        except SaslError as e:
            # The client learns only that its credentials are wrong; the broker log says why.
            self._detail = str(e)
            what = "re-authentication" if self.reauthenticating else "authentication"
            return None, f"Authentication failed during {what} due to invalid credentials with SASL mechanism " \
                         f"{self.mechanism}"

    def _authenticate(self, header: RequestHeader, req: SaslAuthenticateRequest) -> Response | Awaitable[None]:
        assert self.server is not None
        token, error = self._evaluate(req.auth_bytes)
        if error is None and self.server.complete:
            error = self._check_principal()
        if error is not None:
            return self._fail(_encode(header, SaslAuthenticateResponse(
                error_code=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message=error)), error)
        lifetime_ms = 0
        if self.server.complete:
            self.authenticate_version = header.request_api_version
            lifetime_ms = self._complete()
        return _encode(header, SaslAuthenticateResponse(error_code=ErrorCode.NONE, error_message=None,
                                                        auth_bytes=token or b"", session_lifetime_ms=lifetime_ms))

    def _raw_token(self, frame: bytes) -> Response | Awaitable[None]:
        assert self.server is not None
        token, error = self._evaluate(bytes(frame))
        if error is None and self.server.complete:
            error = self._check_principal()
        if error is not None:
            return self._fail(None, error)
        if self.server.complete:
            self.authenticate_version = 0
            self._complete()
        out = bytearray(len(token or b"").to_bytes(4, "big", signed=True))
        out += token or b""
        return Response(out)

    def _check_principal(self) -> str | None:
        assert self.server is not None
        principal = f"User:{self.server.authorization_id}"
        if self.reauthenticating and principal != self.conn.principal:
            return f"Cannot change principals during re-authentication from {self.conn.principal}: {principal}"
        return None

    def _complete(self) -> int:
        assert self.server is not None
        conn = self.conn
        conn.principal = f"User:{self.server.authorization_id}"
        conn.max_request = self._max_request
        conn.raw_frames = False
        self.state = COMPLETE
        self.reauthenticating = False
        # KIP-368 as Kafka's ReauthInfo: the session ends at connections.max.reauth.ms or when the credential
        # (an OAUTHBEARER token) expires, whichever comes first.
        max_reauth_ms = self.settings.reauth_ms.get(self.mechanism, 0)
        expiry_ms = getattr(self.server, "credential_expiry_ms", None)
        lifetime_ms = max_reauth_ms
        if expiry_ms is not None:
            remaining_ms = max(0, int(expiry_ms - time.time() * 1000))
            lifetime_ms = remaining_ms if max_reauth_ms <= 0 else min(remaining_ms, max_reauth_ms)
        if lifetime_ms > 0 or expiry_ms is not None:
            self.expires_at = time.monotonic() + lifetime_ms / 1000
            conn.handle = self.handle_authenticated
        else:
            self.expires_at = None
            conn.handle = self.apis.handle
        return lifetime_ms

    def _illegal_request(self, header: RequestHeader) -> Awaitable[None] | None:
        """Kafka answers a request other than SaslAuthenticate during authentication with its own error response
        (ILLEGAL_SASL_STATE) when the response has an error code, then closes."""
        cls = codec.RESPONSES.get(header.request_api_key)
        reason = f"unexpected {_api(header.request_api_key)} request during SASL authentication"
        v = header.request_api_version
        if cls is None or not cls.VALID_VERSIONS[0] <= v <= cls.VALID_VERSIONS[1] or not any(  # type: ignore[attr-defined]
                f.attr == "error_code" and f.in_versions(v) for f in cls.FIELDS):  # type: ignore[attr-defined]
            raise CloseConnection(reason)
        return self._fail(_encode(header, cls(error_code=ErrorCode.ILLEGAL_SASL_STATE)), reason)

    def _fail(self, response: Response | None, reason: str) -> Awaitable[None]:
        self.state = FAILED
        conn = self.conn
        # Reading goes on (what arrives is dropped, frames over 64 KiB close the connection): closing a socket
        # with unread bytes would reset it, and the client could lose the answer.
        conn.max_request = min(conn.max_request, 65536)
        user = getattr(self.server, "authorization_id", "") or "?"
        detail = f" ({self._detail})" if self._detail else ""
        log.info("SASL %s authentication failed for %s (user %s) on listener %s: %s%s", self.mechanism or "-",
                 conn.peer, user, self.settings.listener, reason, detail)

        async def answer_and_close() -> None:
            # Kafka's connection.failed.authentication.delay.ms: slow down password guessing.
            await asyncio.sleep(self.settings.failure_delay_s)
            if response is not None and conn.transport is not None and not conn.transport.is_closing():
                conn.transport.write(response.frame)
                # Give the client a moment to read the answer and close first: a client that reads the answer
                # and the end of the stream in one go may drop the answer (kafka-python 3.0 does).
                for _ in range(10):
                    if conn.is_closed():
                        return
                    await asyncio.sleep(0.05)
            conn.close()

        return answer_and_close()

    # ------------------------------------------------------------ after authentication, with a session lifetime

    def handle_authenticated(self, conn: KafkaConnection, frame: bytes) -> Any:
        api_key = int.from_bytes(frame[:2], "big", signed=True) if len(frame) >= 2 else -1
        if api_key == SASL_HANDSHAKE and self.authenticate_version >= 1:
            try:
                header, pos = codec.decode_request_header(frame)
            except codec.DecodeError:
                raise CloseConnection("malformed request header") from None
            req = self._decode(SaslHandshakeRequest, header, frame, pos)
            if header.request_api_version >= 1:
                # KIP-368: a new SASL exchange on the authenticated connection.
                self.reauthenticating = True
                self.state = HANDSHAKE
                conn.handle = self.handle
                return self._handshake(header, req)
        if self.expires_at is not None and time.monotonic() > self.expires_at:
            raise CloseConnection(f"SASL session of {conn.principal} expired (connections.max.reauth.ms) "
                                  "and the client did not re-authenticate")
        return self.apis.handle(conn, frame)


def _api(api_key: int) -> str:
    cls = codec.REQUESTS.get(api_key)
    return cls.__name__.removesuffix("Request") if cls is not None else f"api key {api_key}"

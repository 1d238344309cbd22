"""SASL/OAUTHBEARER (RFC 7628) as Kafka's OAuthBearerSaslServer, with Kafka's two token validators: unsecured JWS
tokens for development (OAuthBearerUnsecuredValidatorCallbackHandler, the default) and signed JWTs checked against
an identity provider's JWKS (OAuthBearerValidatorCallbackHandler).

The principal is the token's subject claim. A token's expiry bounds the session (KIP-368): the client must
re-authenticate with a fresh token before it, or the broker closes the connection.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol

from kbroker.broker.config import ConfigError, KafkaConfig
from kbroker.broker.security.jwks import JwksError, JwksSource
from kbroker.broker.security.jwt import SIGNATURE_ALGORITHMS, CompactJws, JwtError, b64url_decode, verify
from kbroker.broker.security.sasl_common import SaslAuthenticationError, SaslError

log = logging.getLogger("kbroker.security")

MECHANISM = "OAUTHBEARER"
UNSECURED_VALIDATOR = "org.apache.kafka.common.security.oauthbearer.internals.unsecured." \
                      "OAuthBearerUnsecuredValidatorCallbackHandler"
JWKS_VALIDATORS = frozenset({
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
    # Its name before Kafka 3.4, still accepted there.
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerValidatorCallbackHandler",
})

# The client's first message (RFC 7628 section 3.1), as Kafka's OAuthBearerClientInitialResponse matches it.
_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_KVPAIR = r"[A-Za-z]+=[\x21-\x7e \t\r\n]+\x01"
_CLIENT_FIRST = re.compile(rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,\x01(?P<kvpairs>(?:{_KVPAIR})*)\x01", re.DOTALL)
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_~+/.a-zA-Z0-9]+=*)", re.ASCII)


@dataclass(frozen=True)
class BearerToken:
    value: str
    principal: str
    lifetime_ms: int  # when it expires, milliseconds since the epoch
    scope: frozenset[str]


class TokenInvalid(Exception):
    """The validator refused the token: RFC 7628's error status (and the scope that was missing) go back to the
    client as the server's JSON challenge; the reason goes to the broker's log only."""

    def __init__(self, reason: str, status: str = "invalid_token", scope: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.scope = scope

    def challenge(self) -> str:
        # Kafka's exact text (OAuthBearerSaslServer.jsonErrorResponse).
        out = f'{{"status":"{self.status}"'
        if self.scope is not None:
            out += f', "scope":"{self.scope}"'
        return out + "}"


class Validator(Protocol):
    def validate(self, token: str) -> BearerToken: ...

    def close(self) -> None: ...


def parse_client_first(message: bytes) -> tuple[str, str, dict[str, str]]:
    """(authorization id, token, extensions) of a client's first message; SaslError if it is not one."""
    text = message.decode("utf-8", errors="replace")
    m = _CLIENT_FIRST.fullmatch(text)
    if m is None:
        raise SaslError("Invalid OAUTHBEARER client first message")
    pairs = dict(kv.split("=", 1) for kv in m.group("kvpairs").split("\x01") if kv)
    auth = pairs.pop("auth", None)
    if auth is None:
        raise SaslError("Invalid OAUTHBEARER client first message: 'auth' not specified")
    am = _AUTH.fullmatch(auth)
    if am is None:
        raise SaslError("Invalid OAUTHBEARER client first message: invalid 'auth' format")
    if am.group("scheme").lower() != "bearer":
        raise SaslError(f"Invalid scheme in OAUTHBEARER client first message: {am.group('scheme')}")
    return m.group("authzid") or "", am.group("token"), pairs


def _scope(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset({value.strip()}) if value.strip() else frozenset()
    if isinstance(value, list):
        return frozenset(str(s).strip() for s in value if str(s).strip())
    return frozenset()


def _number(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenInvalid(f"The '{name}' claim was not of type Number: {type(value).__name__}")
    return float(value)


class UnsecuredValidator:
    """Kafka's default: a token is an unsecured JWS ({"alg":"none"}, no signature) with an "exp" claim and a
    principal claim; options come from the listener's OAuthBearerLoginModule (unsecuredValidator*)."""

    def __init__(self, options: dict[str, str], where: str) -> None:
        self.principal_claim = options.get("unsecuredValidatorPrincipalClaimName", "").strip() or "sub"
        self.scope_claim = options.get("unsecuredValidatorScopeClaimName", "").strip() or "scope"
        self.required_scope = frozenset(options.get("unsecuredValidatorRequiredScope", "").split())
        skew = options.get("unsecuredValidatorAllowableClockSkewMs", "").strip() or "0"
        try:
            self.skew_ms = int(skew)
        except ValueError:
            raise ConfigError(f"{where}: unsecuredValidatorAllowableClockSkewMs={skew!r} is not a number") from None
        if self.skew_ms < 0:
            raise ConfigError(f"{where}: unsecuredValidatorAllowableClockSkewMs must not be negative: {skew}")

    def validate(self, token: str) -> BearerToken:
        if ".." in token:
            raise TokenInvalid("Malformed compact serialization contains '..'")
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenInvalid("Unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded values")
        try:
            header, claims = (json.loads(b64url_decode(p)) for p in parts[:2])
        except (JwtError, ValueError):
            raise TokenInvalid("malformed Base64 URL encoded value or JSON") from None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise TokenInvalid("malformed JSON")
        if header.get("alg") != "none":
            raise TokenInvalid("Unsecured JWS must have 'none' for an algorithm")
        if parts[2]:
            raise TokenInvalid("Unsecured JWS must not contain a digital signature")
        exp = _number(claims, "exp")
        if exp is None:
            raise TokenInvalid("No expiration time in JWT")
        principal = claims.get(self.principal_claim)
        if not isinstance(principal, str) or not principal.strip():
            raise TokenInvalid(f"No principal name in JWT claim: {self.principal_claim}")
        now_ms = time.time() * 1000
        exp_ms = round(exp * 1000)
        iat = _number(claims, "iat")
        if iat is not None and round(iat * 1000) > now_ms + self.skew_ms:
            raise TokenInvalid("The Issued At value was after the indicated time plus allowable clock skew")
        if now_ms - self.skew_ms >= exp_ms:
            raise TokenInvalid("The indicated time minus allowable clock skew was on or after the Expiration Time")
        if iat is not None and exp_ms <= round(iat * 1000):
            raise TokenInvalid("The Expiration Time was not after the Issued At time")
        scope = _scope(claims.get(self.scope_claim))
        missing = self.required_scope - scope
        if missing:
            required = " ".join(sorted(self.required_scope))
            raise TokenInvalid(f"The provided scope {sorted(scope)} was missing a required scope value",
                               status="insufficient_scope", scope=required)
        return BearerToken(token, principal, exp_ms, scope)

    def close(self) -> None:
        pass


class JwksValidator:
    """Signed JWTs as Kafka's OAuthBearerValidatorCallbackHandler checks them: the signature by a key of the
    provider's JWKS (never "none"), "exp" and "iat" present, not expired beyond the clock skew, "nbf" passed,
    the expected issuer and one of the expected audiences when those are configured, a non-blank subject."""

    def __init__(self, config: KafkaConfig, listener: str) -> None:
        def key(name: str) -> Any:
            return config.for_listener(listener, name)

        url = key("sasl.oauthbearer.jwks.endpoint.url")
        if not url:
            raise ConfigError(f"sasl.oauthbearer.jwks.endpoint.url: required on listener {listener} for "
                              "OAuthBearerValidatorCallbackHandler")
        try:
            self.jwks = JwksSource(str(url), int(key("sasl.oauthbearer.jwks.endpoint.refresh.ms")),
                                   int(key("sasl.oauthbearer.jwks.endpoint.retry.backoff.ms")),
                                   int(key("sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms")))
            self.jwks.start()
        except JwksError as e:
            raise ConfigError(f"sasl.oauthbearer.jwks.endpoint.url: {url}: {e}") from None
        self.skew_s = int(key("sasl.oauthbearer.clock.skew.seconds"))
        self.audiences = frozenset(a for a in key("sasl.oauthbearer.expected.audience") if a)
        self.issuer: str | None = key("sasl.oauthbearer.expected.issuer") or None
        self.sub_claim = str(key("sasl.oauthbearer.sub.claim.name"))
        self.scope_claim = str(key("sasl.oauthbearer.scope.claim.name"))

    def validate(self, token: str) -> BearerToken:
        try:
            jws = CompactJws.parse(token)
        except JwtError as e:
            raise TokenInvalid(f"Could not validate the access token: {e}") from None
        alg = str(jws.header.get("alg"))
        if alg not in SIGNATURE_ALGORITHMS:
            raise TokenInvalid(f"Could not validate the access token: the algorithm {alg!r} is not allowed")
        kid = jws.header.get("kid")
        keys = self.jwks.keys_for(kid if isinstance(kid, str) else None, alg)
        if not keys:
            raise TokenInvalid(f"Could not validate the access token: no key of the JWKS matches kid {kid!r}")
        for candidate in keys:
            try:
                verify(jws, candidate)
                break
            except JwtError:
                continue
        else:
            raise TokenInvalid("Could not validate the access token: the signature does not verify")
        claims = jws.claims
        now = time.time()
        exp = _number(claims, "exp")
        iat = _number(claims, "iat")
        nbf = _number(claims, "nbf")
        if exp is None:
            raise TokenInvalid("Could not validate the access token: no Expiration Time (exp) claim present")
        if iat is None:
            raise TokenInvalid("Could not validate the access token: no Issued At (iat) claim present")
        if now >= exp + self.skew_s:
            raise TokenInvalid("Could not validate the access token: the JWT is no longer valid (expired)")
        if nbf is not None and now + self.skew_s < nbf:
            raise TokenInvalid("Could not validate the access token: the JWT is not yet valid (nbf)")
        if self.issuer is not None and claims.get("iss") != self.issuer:
            raise TokenInvalid(f"Could not validate the access token: issuer {claims.get('iss')!r} is not the "
                               f"expected {self.issuer!r}")
        if self.audiences:
            aud = claims.get("aud")
            given = {aud} if isinstance(aud, str) else set(aud) if isinstance(aud, list) else set()
            if not given & self.audiences:
                raise TokenInvalid(f"Could not validate the access token: audience {aud!r} is not one of "
                                   f"{sorted(self.audiences)}")
        sub = claims.get(self.sub_claim)
        if not isinstance(sub, str) or not sub.strip():
            raise TokenInvalid(f"Could not validate the access token: the {self.sub_claim} claim is missing or blank")
        return BearerToken(token, sub.strip(), round(exp * 1000), _scope(claims.get(self.scope_claim)))

    def close(self) -> None:
        self.jwks.stop()


def validator_for(config: KafkaConfig, listener: str, options: dict[str, str]) -> Validator:
    """The listener's validator, chosen as Kafka chooses its callback handler:
    listener.name.<l>.oauthbearer.sasl.server.callback.handler.class, unsecured tokens when unset."""
    handler = config.for_listener(listener, "sasl.server.callback.handler.class", MECHANISM)
    if handler in JWKS_VALIDATORS:
        return JwksValidator(config, listener)
    if handler in (None, "", UNSECURED_VALIDATOR):
        if config.for_listener(listener, "sasl.oauthbearer.jwks.endpoint.url"):
            log.warning("Listener %s: sasl.oauthbearer.jwks.endpoint.url is set but the OAUTHBEARER callback handler "
                        "is the unsecured one (as in Kafka): set listener.name.%s.oauthbearer.sasl.server.callback."
                        "handler.class=org.apache.kafka.common.security.oauthbearer."
                        "OAuthBearerValidatorCallbackHandler to check signatures", listener, listener.lower())
        return UnsecuredValidator(options, f"listener.name.{listener.lower()}.oauthbearer.sasl.jaas.config")
    raise ConfigError(f"listener.name.{listener.lower()}.oauthbearer.sasl.server.callback.handler.class: kbroker "
                      f"cannot load {handler}; it knows {sorted(JWKS_VALIDATORS)[0]} (signed JWTs against "
                      "sasl.oauthbearer.jwks.endpoint.url) and the unsecured default")


class OAuthBearerServer:
    """One connection's OAUTHBEARER exchange: the client's first message carries the token; a refused token gets
    the JSON error challenge, and the client's %x01 answer to it ends the exchange with that error."""

    mechanism = MECHANISM

    def __init__(self, validator: Validator) -> None:
        self._validator = validator
        self._error: str | None = None
        self.complete = False
        self.authorization_id = ""
        self.credential_expiry_ms: int | None = None

    def evaluate(self, response: bytes) -> bytes:
        if response == b"\x01" and self._error is not None:
            raise SaslAuthenticationError(self._error)
        self._error = None
        authzid, token_value, _extensions = parse_client_first(response)
        try:
            token = self._validator.validate(token_value)
        except TokenInvalid as e:
            self._error = e.challenge()
            log.info("OAUTHBEARER token refused: %s", e)
            return self._error.encode()
        if authzid and authzid != token.principal:
            raise SaslAuthenticationError(
                f"Authentication failed: Client requested an authorization id ({authzid}) that is different from "
                f"the token's principal name ({token.principal})")
        # Extensions: every one is accepted, as both of Kafka's validators do.
        self.authorization_id = token.principal
        self.credential_expiry_ms = token.lifetime_ms
        self.complete = True
        return b""

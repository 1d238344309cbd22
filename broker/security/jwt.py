"""JSON Web Tokens as OAUTHBEARER carries them: compact JWS parsing, JWK public keys, and signature checks."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey

_HASHES: dict[str, type[hashes.HashAlgorithm]] = {"256": hashes.SHA256, "384": hashes.SHA384, "512": hashes.SHA512}
_CURVES: dict[str, tuple[ec.EllipticCurve, int]] = {
    "P-256": (ec.SECP256R1(), 32), "P-384": (ec.SECP384R1(), 48), "P-521": (ec.SECP521R1(), 66)}
# The asymmetric algorithms a JWKS can verify; "none" and the HMAC ones (a shared secret) never verify here.
SIGNATURE_ALGORITHMS = frozenset(f"{family}{bits}" for family in ("RS", "PS", "ES") for bits in _HASHES)


class JwtError(Exception):
    """The token is not a well-formed JWS, or its signature does not verify."""


def b64url_decode(text: str) -> bytes:
    """Base64url without padding (RFC 7515 section 2); standard base64 characters are refused."""
    if any(c in text for c in "+/="):
        raise JwtError("malformed Base64 URL encoded value")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise JwtError("malformed Base64 URL encoded value") from None


def _json_object(part: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(b64url_decode(part))
    except (UnicodeDecodeError, ValueError):
        raise JwtError(f"malformed JSON in the {what}") from None
    if not isinstance(value, dict):
        raise JwtError(f"the {what} is not a JSON object")
    return value


@dataclass(frozen=True)
class CompactJws:
    header: dict[str, Any]
    claims: dict[str, Any]
    signing_input: bytes
    signature: bytes

    @classmethod
    def parse(cls, token: str) -> CompactJws:
        parts = token.split(".")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise JwtError("a JWS compact serialization has 3 dot-separated Base64URL-encoded values")
        header = _json_object(parts[0], "JOSE header")
        claims = _json_object(parts[1], "claims")
        return cls(header, claims, f"{parts[0]}.{parts[1]}".encode(), b64url_decode(parts[2]))


def _int_member(jwk: dict[str, Any], name: str) -> int:
    value = jwk.get(name)
    if not isinstance(value, str):
        raise JwtError(f"JWK member {name!r} is missing")
    return int.from_bytes(b64url_decode(value), "big")


def public_key(jwk: dict[str, Any]) -> PublicKey:
    """An RSA or EC public key from its JWK (RFC 7517, 7518 section 6)."""
    kty = jwk.get("kty")
    if kty == "RSA":
        return rsa.RSAPublicNumbers(_int_member(jwk, "e"), _int_member(jwk, "n")).public_key()
    if kty == "EC":
        curve = _CURVES.get(str(jwk.get("crv")))
        if curve is None:
            raise JwtError(f"unsupported EC curve {jwk.get('crv')!r}")
        return ec.EllipticCurvePublicNumbers(_int_member(jwk, "x"), _int_member(jwk, "y"), curve[0]).public_key()
    raise JwtError(f"unsupported JWK key type {kty!r}")


def verify(jws: CompactJws, key: PublicKey) -> None:
    """Raises JwtError unless `key` made the signature with the header's algorithm."""
    alg = str(jws.header.get("alg"))
    if alg not in SIGNATURE_ALGORITHMS:
        raise JwtError(f"the algorithm {alg!r} is not allowed")
    digest = _HASHES[alg[2:]]()
    try:
        if alg.startswith("ES"):
            if not isinstance(key, ec.EllipticCurvePublicKey):
                raise JwtError(f"{alg} needs an EC key")
            size = (key.curve.key_size + 7) // 8
            if len(jws.signature) != 2 * size:
                raise JwtError("the signature has the wrong length for its curve")
            der = encode_dss_signature(int.from_bytes(jws.signature[:size], "big"),
                                       int.from_bytes(jws.signature[size:], "big"))
            key.verify(der, jws.signing_input, ec.ECDSA(digest))
            return
        if not isinstance(key, rsa.RSAPublicKey):
            raise JwtError(f"{alg} needs an RSA key")
        pad: padding.AsymmetricPadding = (
            padding.PKCS1v15() if alg.startswith("RS")
            else padding.PSS(mgf=padding.MGF1(digest), salt_length=digest.digest_size))
        key.verify(jws.signature, jws.signing_input, pad, digest)
    except InvalidSignature:
        raise JwtError("the signature does not verify") from None


def key_matches(jwk: dict[str, Any], alg: str) -> bool:
    """Whether a JWK may verify a signature of `alg` (its kty, use and alg members allow it)."""
    if jwk.get("use") not in (None, "sig") or jwk.get("alg") not in (None, alg):
        return False
    return jwk.get("kty") == ("EC" if alg.startswith("ES") else "RSA")

"""The verification keys of an OAuth identity provider: a JWKS read from a file or an HTTP(S) endpoint, refreshed
in the background as Kafka's RefreshingHttpsJwks does (periodically, and early when a token names an unknown key)."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kbroker.broker.security.jwt import JwtError, PublicKey, key_matches, public_key

log = logging.getLogger("kbroker.security")

# An unknown key id asks for a refresh at most this often, so tokens naming made-up ids cannot hammer the provider.
MISSING_KEY_REFRESH_S = 10.0
FETCH_TIMEOUT_S = 10.0


class JwksError(Exception):
    """The key set could not be read or is not a JWKS."""


def parse_jwks(data: bytes) -> list[tuple[dict[str, Any], PublicKey]]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise JwksError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise JwksError('expected a JSON object with a "keys" array')
    out = []
    for jwk in doc["keys"]:
        if not isinstance(jwk, dict):
            continue
        try:
            out.append((jwk, public_key(jwk)))
        except (JwtError, ValueError) as e:
            # Kafka (jose4j) skips keys it cannot use; so does kbroker, saying which.
            log.warning("JWKS: skipping key %r: %s", jwk.get("kid"), e)
    return out


class JwksSource:
    """The keys at sasl.oauthbearer.jwks.endpoint.url: `file:` URLs are read once at start-up (a broker whose file
    is missing or malformed does not start); http(s) endpoints are fetched at start-up and every `refresh_ms` on a
    thread of their own, with retries backing off from `backoff_ms` to `backoff_max_ms`."""

    def __init__(self, url: str, refresh_ms: int, backoff_ms: int, backoff_max_ms: int) -> None:
        self.url = url
        self.refresh_s = refresh_ms / 1000
        self.backoff_s = backoff_ms / 1000
        self.backoff_max_s = backoff_max_ms / 1000
        self._keys: list[tuple[dict[str, Any], PublicKey]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._last_expedited = 0.0
        self._thread: threading.Thread | None = None
        scheme = urlsplit(url).scheme.lower()
        if scheme not in ("file", "http", "https"):
            raise JwksError("expected a file:, http: or https: URL")
        self.is_file = scheme == "file"

    def start(self) -> None:
        if self.is_file:
            path = Path(urlsplit(self.url).path)
            try:
                self._keys = parse_jwks(path.read_bytes())
            except OSError as e:
                raise JwksError(f"cannot read {path}: {e.strerror}") from None
            return
        try:
            self._refresh()
        except JwksError as e:
            log.warning("JWKS endpoint %s: %s; retrying in the background", self.url, e)
        self._thread = threading.Thread(target=self._run, name="jwks-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=FETCH_TIMEOUT_S + 1)

    def keys_for(self, kid: str | None, alg: str) -> list[PublicKey]:
        """The keys that may have signed a token with this key id and algorithm; none asks for an early refresh."""
        with self._lock:
            keys = [key for jwk, key in self._keys if key_matches(jwk, alg) and (kid is None or jwk.get("kid") == kid)]
        if not keys and not self.is_file:
            now = time.monotonic()
            if now - self._last_expedited >= MISSING_KEY_REFRESH_S:
                self._last_expedited = now
                self._wake.set()
        return keys

    def _refresh(self) -> None:
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as resp:  # noqa: S310 (a configured URL)
                keys = parse_jwks(resp.read())
        except (urllib.error.URLError, OSError) as e:
            raise JwksError(str(getattr(e, "reason", e))) from None
        with self._lock:
            self._keys = keys

    def _run(self) -> None:
        backoff = self.backoff_s
        delay = self.refresh_s
        while not self._stopped.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                self._refresh()
                backoff, delay = self.backoff_s, self.refresh_s
            except JwksError as e:
                log.warning("JWKS endpoint %s: %s; retrying in %.1f s", self.url, e, backoff)
                delay = backoff
                backoff = min(backoff * 2, self.backoff_max_s)

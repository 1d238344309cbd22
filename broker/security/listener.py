"""Per-listener security: what a new connection on a PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL listener gets.

Built once at startup (a bad key or certificate stops the broker with the key's name); PLAINTEXT listeners
get none, so their connections do no security work at all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl as std_ssl
from typing import TYPE_CHECKING

from kbroker.broker.config import ConfigError, KafkaConfig, Listener
from kbroker.broker.security import ssl
from kbroker.broker.security.credentials import ScramCredentialStore
from kbroker.broker.security.sasl import SaslServerAuthenticator, SaslSettings

if TYPE_CHECKING:
    from kbroker.broker.network import KafkaConnection

log = logging.getLogger("kbroker.security")


# How often the keystore and truststore files of TLS listeners are checked for a new version.
RELOAD_CHECK_S = 10.0


class ListenerSecurity:
    def __init__(self, config: KafkaConfig, listener: Listener, credentials: ScramCredentialStore) -> None:
        self.config = config
        self.listener = listener.name
        self.protocol = listener.security_protocol
        self.ssl_context: std_ssl.SSLContext | None = None
        self.mapping_rules = ssl.parse_mapping_rules(
            str(config.for_listener(listener.name, "ssl.principal.mapping.rules")))
        self._stamps: dict[str, tuple[int, int]] = {}
        if self.protocol in ("SSL", "SASL_SSL"):
            self._stamps = self._file_stamps()
            self.ssl_context = ssl.server_context(config, listener.name)
        self.sasl = SaslSettings(config, listener.name, credentials) if self.protocol.startswith("SASL_") else None

    def _file_stamps(self) -> dict[str, tuple[int, int]]:
        out = {}
        for key in ("ssl.keystore.location", "ssl.truststore.location"):
            path = self.config.for_listener(self.listener, key)
            if path:
                try:
                    st = os.stat(path)
                    out[str(path)] = (st.st_mtime_ns, st.st_size)
                except OSError:
                    out[str(path)] = (0, 0)
        return out

    def reload_if_changed(self) -> None:
        """Certificate rotation without a restart: when a keystore or truststore file changed, new connections
        get a context built from the new files (open connections keep theirs). A file that does not load (half
        written, wrong password) leaves the current context in place until the next check."""
        if self.ssl_context is None:
            return
        stamps = self._file_stamps()
        if stamps == self._stamps:
            return
        try:
            ctx = ssl.server_context(self.config, self.listener)
        except ConfigError as e:
            log.warning("Listener %s: the changed TLS key material does not load, keeping the current one: %s",
                        self.listener, e)
            return
        self._stamps = stamps
        self.ssl_context = ctx
        log.info("Listener %s: reloaded its TLS keystore/truststore (%s)", self.listener, ", ".join(sorted(stamps)))

    def close(self) -> None:
        if self.sasl is not None:
            self.sasl.close()

    def on_connect(self, conn: KafkaConnection, transport: asyncio.BaseTransport) -> None:
        """Called once the TLS handshake (if any) is done, before the first request is read."""
        if self.protocol == "SSL":
            conn.principal = ssl.ssl_principal(transport.get_extra_info("ssl_object"), self.mapping_rules)
        if self.sasl is not None:
            SaslServerAuthenticator(conn, self.sasl, conn.apis)


def listener_security(config: KafkaConfig, credentials: ScramCredentialStore) -> dict[str, ListenerSecurity]:
    """Listener name -> its security, for every listener that is not PLAINTEXT."""
    return {
        listener.name: ListenerSecurity(config, listener, credentials)
        for listener in config.listeners
        if listener.security_protocol != "PLAINTEXT"
    }

"""Per-listener security: what a new connection on a PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL listener gets.

Built once at startup (a bad key or certificate stops the broker with the key's name); PLAINTEXT listeners
get none, so their connections do no security work at all.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as std_ssl
from typing import TYPE_CHECKING

from broker.config import KafkaConfig, Listener
from broker.security import ssl
from broker.security.credentials import ScramCredentialStore
from broker.security.sasl import SaslServerAuthenticator, SaslSettings

if TYPE_CHECKING:
    from broker.network import KafkaConnection

log = logging.getLogger("kbroker.security")


class ListenerSecurity:
    def __init__(self, config: KafkaConfig, listener: Listener, credentials: ScramCredentialStore) -> None:
        self.listener = listener.name
        self.protocol = listener.security_protocol
        self.ssl_context: std_ssl.SSLContext | None = None
        self.mapping_rules = ssl.parse_mapping_rules(
            str(config.for_listener(listener.name, "ssl.principal.mapping.rules")))
        if self.protocol in ("SSL", "SASL_SSL"):
            self.ssl_context = ssl.server_context(config, listener.name)
        self.sasl = SaslSettings(config, listener.name, credentials) if self.protocol.startswith("SASL_") else None

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

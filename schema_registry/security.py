"""How the registry meets the broker's security: its own Kafka connections authenticate like the broker's
inter-broker ones (same listener, TLS and SASL user), HTTP users sign in with basic auth as a SASL user of the
broker (checked by a SASL exchange with the broker itself), and https listeners use an SSL listener's key material."""

from __future__ import annotations

import hashlib
import logging
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

log = logging.getLogger("kbroker.schema_registry")

MECHANISM_PREFERENCE = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
VERIFIED_FOR_S = (
    60.0  # a checked password is trusted this long (a SASL exchange per request would cost a lot)
)


def loopback(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host


class BrokerConnector:
    """WireClients to the cluster's brokers on the inter-broker listener, authenticated as this broker."""

    def __init__(self, server: KafkaServer) -> None:
        from kbroker.broker.security.client import ClientSecurity, inter_broker_listener

        self.server = server
        self.listener = inter_broker_listener(server.config)
        self.security = ClientSecurity(server.config, self.listener)

    def bootstrap(self) -> tuple[str, int]:
        host, port = self.server.socket_server.bound[self.listener]
        return loopback(host), port

    def __call__(self, host: str, port: int) -> Any:
        from kbroker_tools.wire import WireClient

        ctx = self.security.ssl_context
        if ctx is not None and (host, port) == self.bootstrap():
            # Its own listener on loopback: the certificate names the advertised host, not 127.0.0.1.
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        client = WireClient(
            f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
            timeout=30,
            client_id="kbroker-schema-registry",
            ssl_context=ctx,
        )
        try:
            if self.security.protocol.startswith("SASL_"):
                client.authenticate(self.security.mechanism, self.security.username, self.security.password)
        except BaseException:
            client.close()
            raise
        return client


class BasicAuth:
    """HTTP basic auth against the broker's SASL users, when the broker has a SASL listener."""

    def __init__(self, server: KafkaServer) -> None:
        config = server.config
        self.server = server
        self.listener: str | None = None
        self.mechanisms: list[str] = []
        for listener in config.listeners:
            protocol = config.security_protocol(listener.name)
            if protocol.startswith("SASL_"):
                enabled = config.for_listener(listener.name, "sasl.enabled.mechanisms")
                mechanisms = [m for m in MECHANISM_PREFERENCE if m in enabled]
                if mechanisms:
                    self.listener, self.protocol, self.mechanisms = listener.name, protocol, mechanisms
                    break
        self._verified: dict[str, float] = {}
        self._lock = threading.Lock()

    @property
    def required(self) -> bool:
        return self.listener is not None

    def check(self, user: str, password: str) -> bool:
        key = hashlib.sha256(f"{user}\0{password}".encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            if self._verified.get(key, 0.0) > now:
                return True
        ok = self._exchange(user, password)
        if ok:
            with self._lock:
                self._verified[key] = now + VERIFIED_FOR_S
        return ok

    def _exchange(self, user: str, password: str) -> bool:
        from kbroker_tools.wire import WireClient, WireError

        assert self.listener is not None
        host, port = self.server.socket_server.bound[self.listener]
        ctx = None
        if self.protocol == "SASL_SSL":
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its own broker on loopback
        for mechanism in self.mechanisms:
            with WireClient(
                f"{loopback(host)}:{port}", timeout=10, client_id="kbroker-schema-registry", ssl_context=ctx
            ) as client:
                try:
                    client.authenticate(mechanism, user, password)
                    return True
                except WireError:
                    continue
        return False


def https_context(server: KafkaServer) -> ssl.SSLContext:
    """The key material of the broker's first SSL or SASL_SSL listener, for an https registry listener."""
    from kbroker.broker.config import ConfigError
    from kbroker.broker.security.ssl import server_context

    config = server.config
    for listener in config.listeners:
        if config.security_protocol(listener.name) in ("SSL", "SASL_SSL"):
            return server_context(config, listener.name)
    raise ConfigError("schema.registry.listeners: https needs an SSL or SASL_SSL listener (its keystore)")

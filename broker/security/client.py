"""The client side of listener security, for this broker's connections to other brokers (Kafka's
ChannelBuilders.clientChannelBuilder for inter.broker.listener.name): TLS with the listener's truststore (and
keystore, for brokers that ask for a client certificate), then SASL with sasl.mechanism.inter.broker.protocol
and the `username` / `password` options of the listener's JAAS config for that mechanism.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from kbroker.broker.config import ConfigError, KafkaConfig
from kbroker.broker.security import scram
from kbroker.broker.security.sasl import jaas_options
from kbroker.broker.security.sasl_common import SaslAuthenticationError, SaslError
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    RequestHeader,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

_SIZE = struct.Struct(">i")


def inter_broker_listener(config: KafkaConfig) -> str:
    """inter.broker.listener.name, else the listener named after security.inter.broker.protocol, else the first
    advertised listener."""
    name = config["inter.broker.listener.name"]
    if name:
        return str(name)
    by_protocol = str(config["security.inter.broker.protocol"])
    names = [listener.name for listener in config.advertised_listeners]
    return by_protocol if by_protocol in names else names[0]


class ClientSecurity:
    def __init__(self, config: KafkaConfig, listener: str) -> None:
        from kbroker.broker.security.ssl import client_context

        self.listener = listener
        self.protocol = config.security_protocol(listener)
        self.ssl_context = client_context(config, listener) if self.protocol in ("SSL", "SASL_SSL") else None
        self.mechanism = str(config["sasl.mechanism.inter.broker.protocol"])
        self.username = self.password = ""
        if self.protocol.startswith("SASL_"):
            if self.mechanism not in ("PLAIN", *scram.MECHANISMS):
                raise ConfigError(f"sasl.mechanism.inter.broker.protocol: {self.mechanism} is not supported "
                                  "(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
            options = jaas_options(config, listener, self.mechanism) or {}
            if "username" not in options or "password" not in options:
                raise ConfigError(
                    f"listener.name.{listener.lower()}.{self.mechanism.lower()}.sasl.jaas.config: the inter-broker "
                    "listener needs username=\"...\" and password=\"...\" for this broker's own connections")
            self.username, self.password = options["username"], options["password"]

    async def connect(self, host: str, port: int, client_id: str
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
        """An authenticated connection, and its SASL session lifetime in ms (0: unlimited)."""
        ctx = self.ssl_context
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ctx, server_hostname=host if ctx is not None and ctx.check_hostname else None)
        try:
            lifetime_ms = await self._authenticate(reader, writer, client_id) if self.protocol.startswith("SASL_") else 0
        except (SaslError, SaslAuthenticationError, codec.DecodeError, asyncio.IncompleteReadError) as e:
            writer.close()
            raise ConnectionError(f"SASL {self.mechanism} with {host}:{port} failed: {e}") from None
        except BaseException:
            writer.close()
            raise
        return reader, writer, lifetime_ms

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str) -> int:
        correlation = 0

        async def call(api_key: int, version: int, body: Any) -> Any:
            nonlocal correlation
            correlation += 1
            header = RequestHeader(request_api_key=api_key, request_api_version=version, correlation_id=correlation,
                                   client_id=client_id)
            writer.write(bytes(codec.encode_request(header, body)))
            (size,) = _SIZE.unpack(await reader.readexactly(4))
            return codec.decode_response(api_key, version, await reader.readexactly(size))[1]

        hs: SaslHandshakeResponse = await call(17, 1, SaslHandshakeRequest(mechanism=self.mechanism))
        if hs.error_code != ErrorCode.NONE:
            raise ConnectionError(f"SASL handshake with {self.mechanism} refused ({ErrorCode(hs.error_code).name}); "
                                  f"the broker offers {', '.join(hs.mechanisms)}")

        lifetime_ms = 0

        async def step(token: bytes) -> bytes:
            nonlocal lifetime_ms
            resp: SaslAuthenticateResponse = await call(36, 2, SaslAuthenticateRequest(auth_bytes=token))
            if resp.error_code != ErrorCode.NONE:
                raise ConnectionError(f"SASL authentication as {self.username} failed: {resp.error_message}")
            lifetime_ms = resp.session_lifetime_ms
            return resp.auth_bytes

        if self.mechanism == "PLAIN":
            await step(f"\0{self.username}\0{self.password}".encode())
            return lifetime_ms
        client = scram.ScramClient(self.mechanism, self.username, self.password)
        server_first = await step(client.first())
        client.verify(await step(client.final(server_first)))
        return lifetime_ms

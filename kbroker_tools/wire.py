"""A minimal blocking Kafka protocol client built on protocol.codec, for tools that must not need a client
library: the container health check, the pytest plugin's topic creation and the web console (which signs in with
SASL PLAIN or SCRAM as the console's user, so the broker's authorizer decides what that user sees)."""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

from kbroker.protocol import codec
from kbroker.protocol.messages import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    MetadataRequest,
    MetadataResponse,
    RequestHeader,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

METADATA, SASL_HANDSHAKE, API_VERSIONS, CREATE_TOPICS, SASL_AUTHENTICATE = 3, 17, 18, 19, 36
UNSUPPORTED_VERSION, TOPIC_ALREADY_EXISTS = 35, 36


class WireError(Exception):
    """The broker answered with an error code (Kafka's number and name in the message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class WireClient:
    def __init__(self, bootstrap: str, timeout: float = 10.0, client_id: str = "kbroker-tools",
                 ssl_context: ssl.SSLContext | None = None) -> None:
        host, port = bootstrap.rsplit(":", 1)
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=host.strip("[]")
                                               if ssl_context.check_hostname else None)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.client_id = client_id
        self._correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def request(self, api_key: int, version: int, body: Any) -> Any:
        self._correlation_id += 1
        header = RequestHeader(request_api_key=api_key, request_api_version=version,
                               correlation_id=self._correlation_id, client_id=self.client_id)
        self.sock.sendall(codec.encode_request(header, body))
        (size,) = struct.unpack(">i", self._recv_exact(4))
        cid, resp = codec.decode_response(api_key, version, self._recv_exact(size))
        if cid != self._correlation_id:
            raise ConnectionError(f"correlation id {cid} answers no request of this connection")
        return resp

    def authenticate(self, mechanism: str, username: str, password: str) -> None:
        """SASL PLAIN or SCRAM-SHA-256/512 on a fresh connection; WireError when the broker refuses."""
        from kbroker.broker.security import scram
        from kbroker.broker.security.sasl_common import SaslAuthenticationError, SaslError

        hs: SaslHandshakeResponse = self.request(SASL_HANDSHAKE, 1, SaslHandshakeRequest(mechanism=mechanism))
        if hs.error_code:
            raise WireError(hs.error_code, f"SASL mechanism {mechanism} is not enabled here "
                                           f"(the listener offers {', '.join(hs.mechanisms) or 'none'})")

        def step(token: bytes) -> bytes:
            resp: SaslAuthenticateResponse = self.request(SASL_AUTHENTICATE, 1,
                                                          SaslAuthenticateRequest(auth_bytes=token))
            if resp.error_code:
                raise WireError(resp.error_code, resp.error_message or "SASL authentication failed")
            return bytes(resp.auth_bytes)

        if mechanism == "PLAIN":
            step(f"\0{username}\0{password}".encode())
            return
        if mechanism not in scram.MECHANISMS:
            raise WireError(33, f"SASL mechanism {mechanism} is not one this client speaks")  # UNSUPPORTED_SASL_MECHANISM
        client = scram.ScramClient(mechanism, username, password)
        try:
            client.verify(step(client.final(step(client.first()))))
        except (SaslError, SaslAuthenticationError, ValueError, KeyError) as e:  # a malformed or refused exchange
            raise WireError(58, f"SCRAM exchange failed: {e}") from None  # SASL_AUTHENTICATION_FAILED

    def api_versions(self) -> ApiVersionsResponse:
        resp: ApiVersionsResponse = self.request(API_VERSIONS, 3, ApiVersionsRequest(
            client_software_name="kbroker-tools", client_software_version="1"))
        if resp.error_code == UNSUPPORTED_VERSION:
            # KIP-511: a broker without v3 answered in v0 framing; ask again in v0.
            resp = self.request(API_VERSIONS, 0, ApiVersionsRequest())
        return resp

    def max_version(self, api_key: int, wanted: int) -> int:
        """The highest version of api_key both sides speak, at most `wanted`; -1 when the broker has none."""
        for k in self.api_versions().api_keys:
            if k.api_key == api_key:
                return min(wanted, k.max_version) if k.min_version <= wanted else -1
        return -1

    def metadata(self, topics: list[str] | None = None) -> MetadataResponse:
        """Metadata v1-v12 (v10+ carries topic ids) without creating topics; topics None means all."""
        version = self.max_version(METADATA, 12)
        if version < 1:
            raise WireError(35, "the broker does not support Metadata v1 or later")
        req = MetadataRequest(
            topics=None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=False)
        return self.request(METADATA, version, req)

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None,
                     replication_factor: int = 1, timeout_ms: int = 10000) -> None:
        """CreateTopics v5 to this broker (a single broker is its own controller); WireError when refused."""
        Topic = CreateTopicsRequest.CreatableTopic
        Config = CreateTopicsRequest.CreatableTopicConfig
        req = CreateTopicsRequest(
            topics=[Topic(name=name, num_partitions=partitions, replication_factor=replication_factor,
                          assignments=[], configs=[Config(name=k, value=v) for k, v in (config or {}).items()])],
            timeout_ms=timeout_ms, validate_only=False,
        )
        resp: CreateTopicsResponse = self.request(CREATE_TOPICS, 5, req)
        for t in resp.topics:
            if t.error_code:
                raise WireError(t.error_code, f"CreateTopics {t.name}: error {t.error_code} {t.error_message or ''}")

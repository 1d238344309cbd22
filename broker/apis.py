"""KafkaApis: decode a request frame, dispatch to the handler of its API, encode the response."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import CoroutineType
from typing import TYPE_CHECKING, Any

from kbroker.broker import metrics
from kbroker.broker.delayed_fetch import DelayedFetch
from kbroker.broker.network import CloseConnection, DelayedResponse, KafkaConnection, Parked, Response
from kbroker.broker.quotas import REQUEST_QUOTA_EXEMPT
from kbroker.broker.refusals import REFUSALS
from kbroker.broker.security.acls import (
    CLUSTER_NAME,
    OPERATION_NAMES,
    RESOURCE_TYPE_NAMES,
    AclOperation,
    ResourceType,
    java_host_address,
)
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ApiVersionsResponse, RequestHeader

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

log = logging.getLogger("kbroker.apis")

API_VERSIONS = 18


@dataclass(slots=True)
class RequestContext:
    server: KafkaServer
    conn: KafkaConnection
    header: RequestHeader

    @property
    def api_version(self) -> int:
        return self.header.request_api_version

    @property
    def client_id(self) -> str:
        return self.header.client_id or ""

    def refused(self, code: int, reason: str | None, resource: str | None = None) -> None:
        """Put a refusal of this request (or of one resource of it) in the broker log, rate-limited."""
        api = f"{api_name(self.header.request_api_key)} v{self.api_version}"
        REFUSALS.refused(self.client_id, self.conn.peer, api, code, reason, resource)

    # Authorization (broker.security.authorizer). `ctx.server.authorizer` is None without
    # authorizer.class.name: handlers test it once per request and skip every check.

    @property
    def client_host(self) -> str:
        """The client's address as Kafka's ACL hosts name it (InetAddress.getHostAddress: no port)."""
        host = self.conn.peer_host
        return host if ":" not in host else java_host_address(host)

    def authorized(self, op: AclOperation, rtype: ResourceType, name: str = CLUSTER_NAME,
                   log_denied: bool = True) -> bool:
        authz = self.server.authorizer
        if authz is None or authz.authorize(self.conn.principal, self.client_host, op, rtype, name):
            return True
        if log_denied:
            self.refused(_DENIED_CODES[rtype], f"{self.conn.principal} may not {OPERATION_NAMES[op]}",
                         f"{RESOURCE_TYPE_NAMES[rtype]} {name!r}")
        return False

    def authorized_names(self, op: AclOperation, rtype: ResourceType, names: Iterable[str | None],
                         log_denied: bool = True) -> set[str]:
        """The names (each checked once) the principal may do op on: Kafka's AuthHelper.filterByAuthorized."""
        authz = self.server.authorizer
        wanted = {n for n in names if n is not None}
        if authz is None:
            return wanted
        allowed = authz.authorized_names(self.conn.principal, self.client_host, op, rtype, wanted)
        if log_denied and len(allowed) < len(wanted):
            for name in wanted - allowed:
                self.refused(_DENIED_CODES[rtype], f"{self.conn.principal} may not {OPERATION_NAMES[op]}",
                             f"{RESOURCE_TYPE_NAMES[rtype]} {name!r}")
        return allowed

    def authorized_operations(self, rtype: ResourceType, name: str = CLUSTER_NAME) -> int:
        authz = self.server.authorizer
        assert authz is not None
        return authz.authorized_operations(self.conn.principal, self.client_host, rtype, name)


_DENIED_CODES = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def api_name(api_key: int) -> str:
    cls = codec.REQUESTS.get(api_key)
    return cls.__name__.removesuffix("Request") if cls is not None else f"api key {api_key}"


HandlerFn = Callable[[RequestContext, Any], Any]
# A handler's direct path: (ctx, frame, body position) -> what a handler returns, or an encoded Response, or
# NOT_DIRECT when the request is not the case it serves (the body is then decoded and given to the handler).
DirectFn = Callable[[RequestContext, bytes | bytearray, int], Any]
NOT_DIRECT: Any = object()
# A handler's frame path: (apis, conn, frame) -> what KafkaApis.handle returns, before the header is decoded and without
# a RequestContext (it accounts the request itself); NOT_DIRECT: the request goes on as if there were none (header,
# direct path, handler).
FrameFn = Callable[["KafkaApis", KafkaConnection, bytes | bytearray], Any]
_PRODUCE_KEY = b"\x00\x00"  # a frame's first two bytes: its int16 api key


class EncodedLater:
    """A direct path's answer that completes later, already encoded and counted (broker/delayed_produce.py): the
    connection awaits `future` for the Response; `blocking`: it processes nothing else of the connection meanwhile."""

    __slots__ = ("future", "blocking")

    def __init__(self, future: Awaitable[Response], blocking: bool) -> None:
        self.future = future
        self.blocking = blocking


@dataclass(frozen=True)
class ApiHandler:
    api_key: int
    min_version: int
    max_version: int
    fn: HandlerFn
    direct: DirectFn | None = None
    frame: FrameFn | None = None  # Produce only (api key 0): KafkaApis.handle tests the key's bytes


def _set_throttle(body: Any, throttle: int) -> None:
    """A response tells the larger of its own throttle (a byte-rate quota's) and the request quota's."""
    if throttle and hasattr(body, "throttle_time_ms"):
        body.throttle_time_ms = max(body.throttle_time_ms or 0, throttle)


class KafkaApis:
    def __init__(self, server: KafkaServer, handlers: list[ApiHandler]) -> None:
        self.server = server
        self.handlers = {h.api_key: h for h in handlers}
        for h in handlers:
            lo, hi = codec.REQUESTS[h.api_key].VALID_VERSIONS  # type: ignore[attr-defined]
            assert lo <= h.min_version <= h.max_version <= hi, h
            assert h.frame is None or h.api_key == 0, h
        produce = self.handlers.get(0)
        self._produce_frame = produce.frame if produce is not None else None

    def supported_versions(self) -> list[tuple[int, int, int]]:
        return sorted((h.api_key, h.min_version, h.max_version) for h in self.handlers.values())

    def handle(self, conn: KafkaConnection, frame: bytes
               ) -> Response | DelayedResponse | Parked | Awaitable[Response | None] | None:
        idle = conn.idle_fetch
        if idle is not None:
            # The connection's idle Fetch again (broker/idle_fetch.py): answered or parked from its plan, before the
            # header's decode and the dispatch (a third of that path's Python).
            taken = idle.take(conn, frame)
            if taken is not None:
                return taken
        if self._produce_frame is not None and frame[:2] == _PRODUCE_KEY:
            # The common Produce from its frame to its answer (broker/handlers/produce.py), without the header object,
            # the context or the dispatch below.
            result = self._produce_frame(self, conn, frame)
            if result is not NOT_DIRECT:
                return result
        try:
            header, pos = codec.decode_request_header(frame)
        except codec.DecodeError as e:
            raise CloseConnection(f"malformed request header: {e}") from None
        api_key, version = header.request_api_key, header.request_api_version
        handler = self.handlers.get(api_key)
        if handler is None or not handler.min_version <= version <= handler.max_version:
            return self._unsupported(conn, header)
        ctx = RequestContext(self.server, conn, header)
        # A direct path answers its common requests without the message objects; its Response is already
        # encoded, so a request quota (which sets the body's throttle) sends requests the general way.
        if handler.direct is not None and not self.server.request_quota.quotas():
            started = time.perf_counter()
            result = handler.direct(ctx, frame, pos)
            if type(result) is Response:  # finish's first case, without its call: the direct path's usual answer
                shard = metrics.shard()
                elapsed = time.perf_counter() - started
                shard.busy_s += elapsed
                shard.request_done(api_key, elapsed)
                return result
            if result is not NOT_DIRECT:
                return self.finish(conn, header, started, result)
        try:
            request, end = codec.decode(codec.REQUESTS[api_key], version, frame, pos)
        except codec.DecodeError as e:
            raise CloseConnection(
                f"malformed {codec.REQUESTS[api_key].__name__} v{version} from client {header.client_id!r}: {e}"
            ) from None
        # Trailing bytes are ignored, as Kafka's request parser does: librdkafka 2.x sends three extra
        # bytes after an all-topics MetadataRequest v12, and Kafka serves it.
        del end
        started = time.perf_counter()
        return self.finish(conn, header, started, handler.fn(ctx, request))

    def finish(self, conn: KafkaConnection, header: RequestHeader, started: float, result: Any
               ) -> Response | DelayedResponse | Parked | Awaitable[Response | None] | None:
        """Account a handled request and encode its answer (or wrap what completes it later)."""
        api_key = header.request_api_key
        if type(result) is Response:  # encoded by a direct path, which counted its failed partitions
            shard = metrics.shard()
            elapsed = time.perf_counter() - started
            shard.busy_s += elapsed
            shard.request_done(api_key, elapsed)
            return result
        if isinstance(result, Parked):  # an answer completed by a callback (a parked Fetch), which counts the request
            busy = time.perf_counter() - started
            metrics.shard().busy_s += busy
            if self.server.request_quota.quotas() and isinstance(result, DelayedFetch):
                # handle_fetch's wait (direct paths are not taken under a request quota): its body tells the
                # request quota's throttle too, as _complete_later's.
                result.throttle = self._request_throttle(conn, header, busy)
            return result
        if type(result) is EncodedLater:
            metrics.shard().busy_s += time.perf_counter() - started
            return result.future if result.blocking else DelayedResponse(result.future)
        if isinstance(result, DelayedResponse):
            busy = time.perf_counter() - started
            metrics.shard().busy_s += busy
            throttle = self._request_throttle(conn, header, busy)
            return DelayedResponse(self._complete_later(header, result.answer, started, throttle))
        if type(result) is CoroutineType:  # an async handler (cheaper than isinstance against the Coroutine ABC)
            busy = time.perf_counter() - started
            metrics.shard().busy_s += busy
            return self._complete_later(header, result, started, self._request_throttle(conn, header, busy))
        if result is not None and self.server.request_quota.quotas():
            _set_throttle(result, self._request_throttle(conn, header, time.perf_counter() - started))
        response = None if result is None else self.encode(header, result)
        shard = metrics.shard()
        if api_key <= 1 and result is not None:  # Produce, Fetch: FailedProduce/FetchRequestsPerSec
            shard.answered(api_key, result)
        elapsed = time.perf_counter() - started
        shard.busy_s += elapsed
        shard.request_done(api_key, elapsed)
        return response

    def _request_throttle(self, conn: KafkaConnection, header: RequestHeader, busy_s: float) -> int:
        """request_percentage: count the handler time of this request for its client; the throttle time owed
        (the connection is muted that long) or 0."""
        quota = self.server.request_quota
        if header.request_api_key in REQUEST_QUOTA_EXEMPT or quota.quota_for(header.client_id or "") is None:
            return 0
        throttle = quota.record_time_and_get_throttle_ms(header.client_id or "", busy_s)
        if throttle:
            conn.mute_for(throttle)
        return throttle

    async def _complete_later(self, header: RequestHeader, pending: Awaitable[Any], started: float,
                              throttle: int = 0) -> Response | None:
        body = await pending
        if body is not None and throttle:
            _set_throttle(body, throttle)
        response = None if body is None else self.encode(header, body)
        shard = metrics.shard()
        if header.request_api_key <= 1 and body is not None:
            shard.answered(header.request_api_key, body)
        shard.request_done(header.request_api_key, time.perf_counter() - started)
        return response

    @staticmethod
    def encode(header: RequestHeader, body: Any) -> Response:
        ext: list[tuple[int, Any]] = []
        frame = codec.encode_response(header.correlation_id, header.request_api_key, header.request_api_version, body, ext)
        return Response(frame, ext or None)

    def _unsupported(self, conn: KafkaConnection, header: RequestHeader) -> Response:
        api_key, version = header.request_api_key, header.request_api_version
        if api_key == API_VERSIONS:
            self._log_unsupported(conn, header)
            # KIP-511: answer an unknown ApiVersions version with v0 and the versions we do support,
            # so that the client can retry with one of them.
            body = ApiVersionsResponse(error_code=ErrorCode.UNSUPPORTED_VERSION, api_keys=self.api_version_list())
            frame = codec.encode_response(header.correlation_id, api_key, 0, body)
            return Response(frame)
        cls = codec.RESPONSES.get(api_key)
        if cls is None:
            raise CloseConnection(f"unknown api key {api_key} (version {version}) from client {header.client_id!r}")
        lo, hi = cls.VALID_VERSIONS  # type: ignore[attr-defined]
        has_error_field = any(f.attr == "error_code" and f.in_versions(version) for f in cls.FIELDS)  # type: ignore[attr-defined]
        if not lo <= version <= hi or not has_error_field:
            # A response without an error code at this version could only look like success: close instead.
            raise CloseConnection(
                f"unsupported version {version} of {cls.__name__} from client {header.client_id!r}"
            )
        self._log_unsupported(conn, header)
        body = cls(error_code=ErrorCode.UNSUPPORTED_VERSION)
        return self.encode(header, body)

    def _log_unsupported(self, conn: KafkaConnection, header: RequestHeader) -> None:
        api_key = header.request_api_key
        handler = self.handlers.get(api_key)
        reason = (f"supported versions are {handler.min_version}-{handler.max_version}" if handler is not None
                  else "this API is not supported")
        REFUSALS.refused(header.client_id or "", conn.peer, f"{api_name(api_key)} v{header.request_api_version}",
                         ErrorCode.UNSUPPORTED_VERSION, reason)

    def api_version_list(self) -> list[ApiVersionsResponse.ApiVersion]:
        return [
            ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, lo, hi in self.supported_versions()
        ]

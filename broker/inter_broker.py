"""InterBrokerChannel: this broker's client for requests to other brokers (Kafka's NetworkClient +
BrokerToControllerChannel / InterBrokerSendThread, reduced to what kbroker sends).

The channel's event loop thread owns the shared connections, so callers on any other loop (network processors,
the coordinators) hop in with `send()` and await the answer there; a replica fetcher owns a BrokerClient of its
own on its own loop. Requests to one broker are pipelined on one connection per purpose and matched to
responses by correlation id. A broker's address comes from the metadata
store on the inter-broker listener at send time, so a restarted broker on a new port is found again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import uvloop
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import RequestHeader

if TYPE_CHECKING:
    from kbroker.broker.security.client import ClientSecurity

log = logging.getLogger("kbroker.inter_broker")

_SIZE = struct.Struct(">i")
# Endpoint lookup: broker id -> (host, port) on the inter-broker listener, or None when it is not alive.
EndpointLookup = Callable[[int], "tuple[str, int] | None"]

# Connection purposes (see InterBrokerChannel._conns).
CONTROLLER = "controller"  # the controller's LeaderAndIsr, UpdateMetadata, StopReplica
CONTROLLER_CLIENT = "to-controller"  # AlterPartition, ControlledShutdown
TXN_MARKERS = "txn-markers"  # WriteTxnMarkers
TXN_VERIFICATION = "txn-verification"  # AddPartitionsToTxn verification (KIP-890)
# Each replica fetcher uses its own name (ReplicaFetcherThread-<id>-<source>).


def partitions_by_topic(tps: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Topic -> partitions, in first-seen order: the shape of every per-topic request field."""
    out: dict[str, list[int]] = {}
    for topic, partition in tps:
        out.setdefault(topic, []).append(partition)
    return out


class _Connection(asyncio.Protocol):
    """One pipelined connection to one broker, owned by the loop that made it. Responses are decoded as their
    bytes arrive and resolve the waiting request's future in the same callback: a reader task between the socket
    and the request costs two more loop iterations per answer, and each iteration of a fetcher thread's loop may
    wait for the GIL (the tail of acks=all latency with replication)."""

    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.transport: asyncio.Transport | None = None
        # correlation id -> (api key, version, future); version None: the future takes the frame undecoded.
        self.pending: dict[int, tuple[int, int | None, asyncio.Future[Any]]] = {}
        self.closed = False
        self._buf = bytearray()
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        # With a SASL session lifetime the other broker closes the connection after it: it is replaced before.
        self.retire_at: float | None = None

    @classmethod
    def adopt(cls, broker_id: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Connection:
        """Take over a stream connection (TLS, after SASL): its transport now feeds this protocol."""
        conn = cls(broker_id)
        # The streams live as long as the connection: a StreamWriter that is collected closes its transport.
        conn._streams = (reader, writer)
        transport = writer.transport
        conn.transport = transport  # type: ignore[assignment]
        transport.set_protocol(conn)
        leftover = bytes(getattr(reader, "_buffer", b""))  # nothing is sent unasked after SASL, but be exact
        if leftover:
            conn.data_received(leftover)
        if reader.at_eof() or transport.is_closing():
            conn.connection_lost(None)
        return conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        if not buf:
            # The usual read holds one whole answer (a replica fetch's, each replication round): taken from `data`
            # itself, not copied into the buffer and out of it again.
            n = len(data)
            if n >= 4 and _SIZE.unpack_from(data, 0)[0] == n - 4:
                try:
                    self._answer(data[4:])
                except ConnectionError as e:
                    self.fail(e)
                return
        buf += data
        pos, end = 0, len(buf)
        try:
            while end - pos >= 4:
                (size,) = _SIZE.unpack_from(buf, pos)
                if end - pos - 4 < size:
                    break
                frame = bytes(buf[pos + 4:pos + 4 + size])
                pos += 4 + size
                self._answer(frame)
        except ConnectionError as e:
            self.fail(e)
            return
        finally:
            if pos:
                del buf[:pos]

    def _answer(self, frame: bytes) -> None:
        (correlation_id,) = _SIZE.unpack_from(frame, 0)
        entry = self.pending.pop(correlation_id, None)
        if entry is None:
            raise ConnectionError(f"response with unknown correlation id {correlation_id} from broker {self.broker_id}")
        api_key, version, fut = entry
        if fut.done():
            return
        if version is None:
            fut.set_result(frame)
            return
        try:
            _, body = codec.decode_response(api_key, version, frame)
        except codec.DecodeError as e:
            fut.set_exception(ConnectionError(f"malformed response from broker {self.broker_id}: {e}"))
            return
        fut.set_result(body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(ConnectionError(f"connection to broker {self.broker_id} lost: {exc or 'closed'}"))

    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            raise ConnectionError(f"connection to broker {self.broker_id} is closed")
        self.transport.write(data)

    def fail(self, exc: Exception) -> None:
        self.closed = True
        pending, self.pending = self.pending, {}
        for _, _, fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


def _time_out(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class BrokerClient:
    """Connections to other brokers owned by one event loop: requests are pipelined on one connection per
    (broker, purpose) and matched to responses by correlation id. The channel's loop has one; each replica
    fetcher has its own on its own loop, as each of Kafka's ReplicaFetcherThreads has its own NetworkClient,
    so a fetch and its answer never hop between threads."""

    def __init__(self, client_id: str, endpoint_of: EndpointLookup, request_timeout: float,
                 security: ClientSecurity | None) -> None:
        self.client_id = client_id
        self.endpoint_of = endpoint_of
        self.request_timeout = request_timeout
        self.security = security
        # One connection per (broker, purpose), as Kafka gives the controller, the controller's clients, each
        # replica fetcher and the transaction channels their own: a broker answers the requests of one
        # connection in order, so a long-polling replica fetch or a marker write waiting for its replicas must
        # never hold up a LeaderAndIsr or an AlterPartition behind it.
        self._conns: dict[tuple[int, str], _Connection] = {}
        self._connecting: dict[tuple[int, str], asyncio.Future[_Connection]] = {}
        self._correlation = itertools.count(1)

    async def request(self, broker_id: int, api_key: int, version: int, body: Any, purpose: str = "default") -> Any:
        """One request on the (broker, purpose) connection; must run on the loop that owns this client.

        Raises ConnectionError when the broker cannot be reached or does not answer in request.timeout.ms,
        KafkaError(BROKER_NOT_AVAILABLE) when it is not alive in the metadata.
        """
        conn = await self._connection(broker_id, purpose)
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        header = RequestHeader(request_api_key=api_key, request_api_version=version, correlation_id=correlation_id,
                               client_id=self.client_id)
        return await self._exchange(conn, broker_id, purpose, api_key, version, correlation_id,
                                    codec.encode_request(header, body))

    async def request_frame(self, broker_id: int, api_key: int, encode: Callable[[int], bytes | bytearray],
                            purpose: str = "default") -> bytes:
        """request() for a caller that writes its own request frame (`encode(correlation id)`, size-prefixed,
        this client's client id) and reads the answer frame itself: correlation id onwards, undecoded."""
        conn = await self._connection(broker_id, purpose)
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        frame: bytes = await self._exchange(conn, broker_id, purpose, api_key, None, correlation_id,
                                            encode(correlation_id))
        return frame

    async def _exchange(self, conn: _Connection, broker_id: int, purpose: str, api_key: int, version: int | None,
                        correlation_id: int, request: bytes | bytearray) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        conn.pending[correlation_id] = (api_key, version, fut)
        conn.write(bytes(request))
        # A timer on the future, not wait_for: that wraps the wait in one more future and loop iteration.
        timer = loop.call_later(self.request_timeout, _time_out, fut)
        try:
            return await fut
        except TimeoutError:
            # A broker that stopped answering (SIGSTOP, a cut network): start over with a new connection.
            log.warning("Request %d (api %d) to broker %d timed out; reconnecting", correlation_id, api_key, broker_id)
            conn.fail(ConnectionError(f"request to broker {broker_id} timed out"))
            self._conns.pop((broker_id, purpose), None)
            raise ConnectionError(f"request to broker {broker_id} timed out") from None
        finally:
            timer.cancel()

    async def _connection(self, broker_id: int, purpose: str) -> _Connection:
        key = (broker_id, purpose)
        conn = self._conns.get(key)
        if conn is not None and not conn.closed:
            if conn.retire_at is None or time.monotonic() < conn.retire_at or conn.pending:
                return conn
            conn.fail(ConnectionError(f"SASL session with broker {broker_id} ends: reconnecting"))
        waiting = self._connecting.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting)
        endpoint = self.endpoint_of(broker_id)
        if endpoint is None:
            raise KafkaError(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker_id} is not alive")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[_Connection] = loop.create_future()
        self._connecting[key] = fut
        try:
            host, port = endpoint
            lifetime_ms = 0
            if self.security is None:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(lambda: _Connection(broker_id), host, port), self.request_timeout)
            else:
                reader, writer, lifetime_ms = await asyncio.wait_for(
                    self.security.connect(host, port, self.client_id), self.request_timeout)
                conn = _Connection.adopt(broker_id, reader, writer)
            if lifetime_ms > 0:
                conn.retire_at = time.monotonic() + lifetime_ms * 0.8 / 1000
            self._conns[key] = conn
            log.info("Connected to broker %d at %s:%d for %s (%s)", broker_id, host, port, purpose,
                     self.security.protocol if self.security is not None else "PLAINTEXT")
            fut.set_result(conn)
            return conn
        except (TimeoutError, OSError) as e:
            err = ConnectionError(f"cannot connect to broker {broker_id} at {endpoint[0]}:{endpoint[1]}: {e}")
            fut.set_exception(err)
            fut.exception()  # retrieved: waiters get it through shield
            raise err from None
        finally:
            self._connecting.pop(key, None)

    def close(self) -> None:
        """On the owning loop, as it stops: every request still waiting fails with ConnectionError."""
        for conn in list(self._conns.values()):
            conn.fail(ConnectionError(f"connection to broker {conn.broker_id} closed"))
        self._conns.clear()


class InterBrokerChannel:
    def __init__(self, broker_id: int, endpoint_of: EndpointLookup, request_timeout_ms: int = 30000,
                 security: ClientSecurity | None = None) -> None:
        self.client = BrokerClient(f"kbroker-broker-{broker_id}", endpoint_of, request_timeout_ms / 1000, security)
        self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="inter-broker", daemon=True)
        self._started = threading.Event()
        # The controller's broker id, or None while an election is pending (ZooKeeper mode).
        self.controller_of: Callable[[], int | None] | None = None

    def new_client(self) -> BrokerClient:
        """A client of its own for a caller with its own loop (a replica fetcher)."""
        c = self.client
        return BrokerClient(c.client_id, c.endpoint_of, c.request_timeout, c.security)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()
        # Close what is left so no task is destroyed while pending.
        self.client.close()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def stop(self) -> None:
        if self._thread.is_alive() and self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)

    def send_to_controller(self, api_key: int, version: int, body: Any) -> Awaitable[Any]:
        """Send one request to the controller (Kafka's BrokerToControllerChannelManager); NOT_CONTROLLER when
        none is known. The controller is looked up when sent, so a retry after NOT_CONTROLLER finds a new one."""
        controller = self.controller_of() if self.controller_of is not None else None
        if controller is None:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_exception(KafkaError(ErrorCode.NOT_CONTROLLER, "no controller is known"))
            return fut
        return self.send(controller, api_key, version, body, CONTROLLER_CLIENT)

    def send(self, broker_id: int, api_key: int, version: int, body: Any, purpose: str = "default") -> Awaitable[Any]:
        """Send one request to a broker from any loop; the awaitable (on the caller's loop) yields the response
        body, with BrokerClient.request's errors."""
        fut = asyncio.run_coroutine_threadsafe(self.client.request(broker_id, api_key, version, body, purpose),
                                               self.loop)
        return asyncio.wrap_future(fut)

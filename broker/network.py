"""SocketServer: one acceptor and N processors, in the shape of Kafka's NIO network layer.

The acceptor runs on the main event loop and hands each accepted socket to a Processor, a
thread with its own uvloop event loop. A processor owns the connections it was handed: it
frames requests, runs the request handlers (KafkaApis) and writes responses, one
`transport.write` per response, or `os.sendfile` for large fetch data. Responses on one
connection go out in request order: while a request is in flight (a long-poll fetch, a produce
waiting for fsync) later requests on that connection wait in a queue.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

import uvloop
from kbroker.broker import metrics
from kbroker.broker.config import KafkaConfig, Listener
from kbroker.protocol import framing

if TYPE_CHECKING:
    from kbroker.broker.apis import KafkaApis
    from kbroker.broker.security.listener import ListenerSecurity

log = logging.getLogger("kbroker.network")

_SIZE = struct.Struct(">i")
_SPLIT_COMPILED = framing.COMPILED
# Fetch data up to this size is copied into the response frame: one write beats a write plus a sendfile.
INLINE_FILE_BYTES = 64 * 1024
# A large request whose announced size the memory pool cannot admit whole is received into a buffer that starts
# at this size and doubles as its bytes arrive, each step taken from the pool.
LARGE_REQUEST_STEP = 256 * 1024
# Stop reading a connection while this many of its requests wait behind one in flight.
MAX_QUEUED_PER_CONNECTION = 64
# Answers a connection may owe at once when requests are processed ahead of them (DelayedResponse).
MAX_ANSWERS_OWED = 64
# A client that does not read its responses: past this many unsent bytes the connection stops taking
# requests until the backlog drains; if it does not drain within request.timeout.ms it is closed.
MAX_UNSENT_BYTES = 16 * 1024 * 1024
INITIAL_BUFFER = 65536
# Over TLS fetch data cannot go through sendfile: responses with up to TLS_INLINE_FILE_BYTES of it are read
# into the frame whole, larger ones are read and written in chunks of TLS_CHUNK_BYTES, with at most about a
# chunk waiting in the transport.
TLS_INLINE_FILE_BYTES = 1024 * 1024
TLS_CHUNK_BYTES = 256 * 1024
# A TLS client gets this long to complete its handshake.
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# Out of file descriptors, the acceptor pauses this long and reports failures at most once per interval.
ACCEPT_BACKOFF_S = 0.2
ACCEPT_FAILURE_LOG_INTERVAL_S = 10.0


class CloseConnection(Exception):
    """The request cannot be answered: close this connection (and nothing else)."""


class Response:
    __slots__ = ("frame", "ext")

    def __init__(self, frame: bytearray, ext: list[tuple[int, Any]] | None = None) -> None:
        self.frame = frame
        self.ext = ext


class DelayedResponse:
    """A request whose effects are done (a Produce appended) and whose answer waits for something else (the
    ISR to reach the batch: Kafka's DelayedProduce). The connection may process its next requests meanwhile;
    answers still go out in request order."""

    __slots__ = ("answer",)

    def __init__(self, answer: Awaitable[Any]) -> None:
        self.answer = answer  # a handler's response body, or (from KafkaApis) the encoded Response

    def __await__(self) -> Generator[Any, None, Any]:
        return self.answer.__await__()


class Parked:
    """An answer a callback completes (a parked Fetch: broker/delayed_fetch.py): when nothing is owed before it the
    connection waits for it without a task of its own, and complete() sends it at once; otherwise the answer task
    awaits it in its turn."""

    __slots__ = ("conn", "answer", "done", "_future")

    def __init__(self) -> None:
        self.conn: KafkaConnection | None = None
        self.answer: Response | BaseException | None = None
        self.done = False
        self._future: asyncio.Future[None] | None = None

    def complete(self, answer: Response | BaseException) -> None:
        """The answer (an exception closes the connection, as a handler's coroutine raising does)."""
        if self.done:
            return
        self.done = True
        self.answer = answer
        if self._future is not None:
            if not self._future.done():
                self._future.set_result(None)
        elif self.conn is not None:
            self.conn._parked_done(self)

    def close(self) -> None:
        """The connection closed before the answer (a DelayedFetch leaves the purgatory then)."""

    def __await__(self) -> Generator[Any, None, Any]:
        if not self.done:
            self._future = asyncio.get_running_loop().create_future()
            yield from self._future
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


class RequestMemoryPool:
    """queued.max.request.bytes, in the shape of Kafka's MemoryPool: request bytes held by all connections
    (large requests' buffers, receive buffers past their initial size, requests queued behind one in flight).

    A large request's buffer is taken from the pool before it is allocated: whole when the announced size
    fits (the request is then received straight into its own frame), else in growing pieces as its bytes
    arrive. A connection whose next piece does not fit stops reading until memory is released, so an
    announced size never costs memory its bytes have not earned. So that partly received requests can never
    hold the whole pool waiting for each other, one connection at a time may grow its request past the
    limit until that request is complete (as Kafka's non-strict pool lets one allocation overshoot): memory
    stays within the limit plus one request.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # A plain attribute, not a property: read on every read and answer of every connection (the limit is fixed).
        self.enabled = limit > 0
        self.used = 0
        self._lock = threading.Lock()
        self._waiters: dict[KafkaConnection, int] = {}
        self._last_log = -1e9
        self._overdraft: KafkaConnection | None = None

    def _fits(self, need: int) -> bool:
        return self.used + need <= self.limit or (self.used == 0 and need > 0)

    def try_reserve(self, need: int, conn: KafkaConnection | None = None) -> bool:
        """Take need bytes if they fit (or conn may overshoot); the caller then holds them (add(-need) gives
        them back)."""
        with self._lock:
            if not self._fits(need):
                if conn is None or self._overdraft not in (None, conn):
                    return False
                self._overdraft = conn
            self.used += need
            return True

    def end_overdraft(self, conn: KafkaConnection) -> None:
        """conn's request is complete (or it is gone): another connection may overshoot now."""
        wake: list[KafkaConnection] = []
        with self._lock:
            if self._overdraft is not conn:
                return
            self._overdraft = None
            wake = list(self._waiters)
            self._waiters.clear()
        for c in wake:
            c.loop.call_soon_threadsafe(c._resume, "memory")

    def add(self, delta: int) -> bool:
        """Account delta bytes; True when the pool is now over its limit."""
        wake: list[KafkaConnection] = []
        with self._lock:
            self.used += delta
            over = self.used > self.limit
            if delta < 0 and self._waiters:
                wake = [c for c, need in self._waiters.items() if self._fits(need)]
                for c in wake:
                    del self._waiters[c]
        for conn in wake:
            conn.loop.call_soon_threadsafe(conn._resume, "memory")
        return over

    def wait(self, conn: KafkaConnection, need: int = 0) -> None:
        """Resume conn's reading once need more bytes fit (need 0: once the pool is back under its limit)."""
        with self._lock:
            if not self._fits(need):
                self._waiters[conn] = need
                now = time.monotonic()
                if now - self._last_log > 60:
                    self._last_log = now
                    log.info("queued.max.request.bytes=%d reached (%d bytes held): reads wait for memory",
                             self.limit, self.used)
                return
        conn.loop.call_soon_threadsafe(conn._resume, "memory")

    def forget(self, conn: KafkaConnection) -> None:
        with self._lock:
            self._waiters.pop(conn, None)


ANONYMOUS = "User:ANONYMOUS"


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, processor: Processor, conn_id: str, listener_name: str = "PLAINTEXT",
                 security: ListenerSecurity | None = None) -> None:
        self.processor = processor
        self.listener_name = listener_name
        self.security = security
        # Kafka's KafkaPrincipal as "User:<name>": ANONYMOUS on PLAINTEXT, the mapped certificate DN on SSL,
        # the SASL authorization id once authenticated. The authorizer reads it with peer_host.
        self.principal = ANONYMOUS
        self.peer_host = ""
        # Produce's direct path: the Writes this principal was allowed (broker/security/write_allowed.py).
        self.write_allowed: Any = None
        self.apis = processor.apis
        # Where request frames go: KafkaApis, or the SASL authenticator until the client has authenticated.
        self.handle = self.apis.handle
        # SASL v0 tokens travel as bare frames, which may be shorter than a request header.
        self.raw_frames = False
        self.tls = False
        self.conn_id = conn_id
        self.loop = processor.loop
        # run once when the connection is gone (a share session releases what its member holds)
        self.close_hooks: list[Callable[[], None]] = []
        self.max_request = processor.config["socket.request.max.bytes"]
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self._buf = bytearray(INITIAL_BUFFER)
        self._start = 0
        self._end = 0
        # _busy: requests wait in _pending until the answers owed (_answers, sent in request order by one
        # task) are out. Only a DelayedResponse lets the next request be processed while its answer is owed.
        self._busy = False
        self._pending: collections.deque[bytes | bytearray] = collections.deque()
        self._pending_since: collections.deque[float] = collections.deque()  # when each one was queued (metrics)
        self._answers: collections.deque[Response | Awaitable[Response | None] | None] = collections.deque()
        self._answering = False
        self._big: bytearray | None = None  # the frame being received when it is larger than the buffer
        self._big_size = 0  # its announced size; len(_big) is smaller while it grows as bytes arrive
        self._big_filled = 0
        self._paused: set[str] = set()
        self._pool = processor.server_ref.memory_pool
        self._held = 0  # bytes accounted in the pool
        self._pending_bytes = 0
        self._drained: asyncio.Future[None] | None = None
        self._closed = False
        self.last_active = time.monotonic()
        # Since when a partial frame has waited for its remaining bytes, and since when responses have
        # waited for the client to read them: the processor's sweep closes slow-loris and slow readers.
        self.partial_since: float | None = None
        self.blocked_since: float | None = None
        # Quota throttling: after the current response, read no request for this long (KIP-219).
        self._mute_ms = 0
        self._sendfile_remaining = 0  # bytes of the region being sendfile()d that the socket has not taken
        self._out: list[bytes | bytearray | memoryview] | None = None  # answers held for one write per read
        # The last idle Fetch's plan on this connection (broker/idle_fetch.IdleFetch): its next identical Fetch takes it.
        self.idle_fetch: Any = None
        self.idle_fetch_hooked = False  # its close hook (the plan leaves the purgatory) is registered

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = peer[0] if peer else "?"
        # high=0: pause_writing fires whenever the kernel did not take a whole write, and
        # resume_writing once the buffer is empty, which is when sendfile may take over.
        transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[attr-defined]
        self.processor.connections[self.conn_id] = self
        if self.security is not None:
            self.tls = transport.get_extra_info("ssl_object") is not None
            try:
                self.security.on_connect(self, transport)
            except Exception as e:  # noqa: BLE001  (no principal for this client: only this connection ends)
                log.warning("Closing connection %s on listener %s: %s", self.peer, self.listener_name, e)
                self.close(abort=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._pool.enabled:
            self._pool.forget(self)
            self._pool.end_overdraft(self)
            self._pool.add(-self._held)
            self._held = 0
        self.processor.connections.pop(self.conn_id, None)
        self.processor.server_ref.connection_closed(self.peer_host)
        for hook in self.close_hooks:
            hook()
        self.close_hooks.clear()
        for answer in list(self._answers):
            if isinstance(answer, Parked):
                answer.close()  # a parked Fetch releases its watch and timer now, not at its deadline
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("connection closed"))
            self._drained.exception()  # retrieved: no sender may be waiting on it

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            if self._big_filled == len(self._big):
                self._grow_big(force=True)  # a read after pause_reading: never hand out an empty buffer
            return memoryview(self._big)[self._big_filled :]
        if self._end == len(self._buf):
            self._make_room()
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        if self._big is not None:
            # A large request is received straight into its own buffer, which then becomes the frame.
            self._big_filled += nbytes
            if self._big_filled == self._big_size:
                frame, self._big = self._big, None
                self.partial_since = None
                if self._pool.enabled:
                    self._pool.end_overdraft(self)
                self._dispatch(frame)
            elif self._big_filled == len(self._big):
                self._grow_big()
            if self._pool.enabled and not self._closed:
                self._account()
            return
        self._end += nbytes
        # The answers to this read's requests go out in one write after them: a loopback send costs as much
        # as handling a small request, and clients pipeline (librdkafka up to 5 Produce requests at once).
        # Answers already held for the end of this loop iteration (_send) go first, in the same write.
        if self._out is None:
            self._out = []
        try:
            self._frames()
        finally:
            # _flush_out, inline: this read's answers in one write.
            out, self._out = self._out, None
            if out and not self._closed:
                self.transport.writelines(out)  # type: ignore[union-attr]

    def _frames(self) -> None:
        if _SPLIT_COMPILED and not self.raw_frames:
            # The complete frames of this read in one call (protocol/_frames.c); the loop below takes what stops
            # it: an incomplete or large frame, a bad size, or (after a SaslHandshake) a token's shorter frame.
            # Without the C the loop below does it all (framing.split_py would only add a call).
            for frame in framing.split(self._buf, self._start, self._end, self.max_request)[0]:
                self._start += 4 + len(frame)
                if self._busy:
                    self._dispatch(frame)  # queued behind the request it waits for
                else:
                    self._process(frame)  # _dispatch's common case, without its call
                if self._closed:
                    return
        buf = self._buf
        while self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(buf, self._start)
            if (size < 8 or size > self.max_request) and not (self.raw_frames and 0 <= size <= self.max_request):
                log.warning(
                    "Closing connection %s: request size %d outside [8, %d]", self.peer, size, self.max_request,
                )
                self.close(abort=True)
                return
            frame_end = self._start + 4 + size
            if frame_end > self._end:
                if size > INITIAL_BUFFER // 2:
                    self._start_big(size)
                elif frame_end - self._start > len(buf):
                    self._make_room(frame_end - self._start)
                break
            # A private, writable copy: a Produce's batches are then given their offsets in place in it
            # (Log.append_as_leader copies read-only records first), as a large request's own buffer already is.
            frame = bytearray(memoryview(buf)[self._start + 4 : frame_end])
            self._start = frame_end
            self._dispatch(frame)
            if self._closed:
                return
        if self._start == self._end:
            self._start = self._end = 0
            if self._big is None:
                self.partial_since = None
            if len(self._buf) > INITIAL_BUFFER:
                self._buf = bytearray(INITIAL_BUFFER)  # give a grown buffer back
        if self.partial_since is None and (self._big is not None or self._start != self._end):
            self.partial_since = self.last_active
        if self._pool.enabled:
            self._account()

    def _start_big(self, size: int) -> None:
        """A request larger than half the receive buffer: its own buffer, taken from the memory pool."""
        have = self._end - self._start - 4
        capacity = size
        if self._pool.enabled:
            if self._pool.try_reserve(size):
                self._held += size
            else:
                # The bytes already received move over (they were held anyway); the rest must be earned.
                capacity = max(have, 1)
                self._held += capacity
                self._pool.add(capacity)
        self._big = bytearray(capacity)
        self._big[:have] = memoryview(self._buf)[self._start + 4 : self._end]
        self._big_size = size
        self._big_filled = have
        self._start = self._end
        if have == capacity:
            self._grow_big()

    def _needs_growth(self) -> bool:
        big = self._big
        return big is not None and self._big_filled == len(big) < self._big_size

    def _growth_step(self) -> int:
        big = self._big
        return 0 if big is None else min(self._big_size, max(2 * len(big), LARGE_REQUEST_STEP)) - len(big)

    def _try_grow(self, force: bool = False) -> bool:
        """Double the growing request buffer if the pool has the memory (force: take it anyway)."""
        big = self._big
        if big is None or not self._needs_growth():
            return True
        need = self._growth_step()
        if self._pool.enabled:
            if force:
                self._pool.add(need)
            elif not self._pool.try_reserve(need, self):
                return False
            self._held += need
        new = bytearray(len(big) + need)
        new[: self._big_filled] = memoryview(big)[: self._big_filled]
        self._big = new
        return True

    def _grow_big(self, force: bool = False) -> None:
        """The growing request buffer is full: grow it, or stop reading until the pool has the memory."""
        if self._try_grow(force) or "memory" in self._paused:
            return
        self._pause("memory")
        self.partial_since = None  # waiting for memory is not the client being slow
        self._pool.wait(self, self._growth_step())

    def _dispatch(self, frame: bytes | bytearray) -> None:
        if self._busy:
            self._pending.append(frame)
            self._pending_since.append(time.perf_counter())
            self._pending_bytes += len(frame)
            if len(self._pending) >= MAX_QUEUED_PER_CONNECTION:
                self._pause("queue")
        else:
            self._process(frame)

    def _account(self) -> None:
        held = len(self._buf) - INITIAL_BUFFER + self._pending_bytes + (len(self._big) if self._big is not None else 0)
        delta, self._held = held - self._held, held
        if not delta:
            return
        over = self._pool.add(delta)
        # Like Kafka's MemoryPool, a request whose buffer is already allocated is read to its end; only a
        # connection that just took more (queued requests, a grown buffer) waits at its next request
        # boundary. Connections that hold nothing beyond their receive buffer read on.
        at_boundary = self._start == self._end and self._big is None
        if over and delta > 0 and at_boundary and not self._closed and "memory" not in self._paused:
            self._pause("memory")
            self._pool.wait(self)

    def _pause(self, reason: str) -> None:
        if not self._paused and self.transport is not None and not self._closed:
            self.transport.pause_reading()
        self._paused.add(reason)

    def _resume(self, reason: str) -> None:
        if reason not in self._paused:
            return
        self._paused.discard(reason)
        if reason == "memory" and self._needs_growth():
            # Memory was released: the request buffer grows now, or the connection keeps waiting.
            if not self._try_grow():
                self._paused.add(reason)
                self._pool.wait(self, self._growth_step())
                return
            self.partial_since = time.monotonic()
        if not self._paused and self.transport is not None and not self._closed:
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        return None

    # ------------------------------------------------------------ requests

    def _make_room(self, need: int = 0) -> None:
        live = self._end - self._start
        size = max(len(self._buf), need + 4096 if need else 0)
        if live + 4096 > size:
            size *= 2
        new = bytearray(size)
        new[:live] = self._buf[self._start : self._end]
        self._buf = new
        self._start, self._end = 0, live

    def _process(self, frame: bytes | bytearray) -> None:
        try:
            result = self.handle(self, frame)
        except CloseConnection as e:
            log.warning("Closing connection %s: %s", self.peer, e)
            self.close(abort=True)
            return
        except Exception:
            log.exception("Closing connection %s after an unexpected error handling a request", self.peer)
            self.close(abort=True)
            return
        if result is None:
            return
        out = self._out
        if type(result) is Response and out is not None and not result.ext and not self._answering:
            # _send's and _backlogged's usual case below without their calls: the answer joins this read's write.
            closed = self._closed
            if not closed:
                out.append(result.frame)
            t = self.transport
            if self._mute_ms or (not closed and t is not None
                                 and t.get_write_buffer_size() > MAX_UNSENT_BYTES):  # type: ignore[attr-defined]
                self._owe(None, blocking=True)
            return
        if isinstance(result, Parked):  # a parked Fetch (broker/delayed_fetch.py) is Parked itself
            if not self._answering and not self._answers and not result.done:
                # Nothing owed before it: it waits without a task, and its callback answers (_parked_done).
                result.conn = self
                self._answers.append(result)
                self._busy = True
                return
            self._owe(result, blocking=True)
            return
        if isinstance(result, Response):
            if self._answering:
                # The answer task may be sending an earlier answer still (sendfile in parts): queue behind it.
                self._owe(result, blocking=bool(self._mute_ms))
                return
            sent = self._send(result)
            if not sent or self._backlogged() or self._mute_ms:
                self._owe(None if sent else result, blocking=True)
            return
        if isinstance(result, DelayedResponse):
            # A throttled client waits after this answer (KIP-219), so nothing is processed ahead of it.
            self._owe(result.answer, blocking=bool(self._mute_ms) or len(self._answers) + 1 >= MAX_ANSWERS_OWED)
            return
        self._owe(result, blocking=True)

    def _owe(self, answer: Response | Awaitable[Response | None] | None, blocking: bool) -> None:
        self._answers.append(answer)
        if blocking:
            self._busy = True
        if not self._answering:
            self._answering = True
            self.loop.create_task(self._answer_in_order())

    def _parked_done(self, parked: Parked) -> None:
        """A parked answer completed while no task runs: send it, and if requests queued behind it or the client
        must wait (a backlog, a throttle), the answer task takes over as after any other answer."""
        if self._closed or not self._answers or self._answers[0] is not parked:
            return
        answer = parked.answer
        if isinstance(answer, BaseException):
            self._close_after(answer)
            return
        self._answers.popleft()
        t = self.transport
        if (
            type(answer) is Response
            and not answer.ext
            and self._out is None
            and not self._answers
            and not self._pending
            and not self._mute_ms
            and t is not None
        ):
            # _send's and _backlogged's usual case without their calls: a parked idle Fetch's answer at its deadline,
            # nothing else owed or queued (the idle long poll's path, bench.fetch_inprocess).
            t.write(answer.frame)
            if t.get_write_buffer_size() <= MAX_UNSENT_BYTES:  # type: ignore[attr-defined]
                self._busy = False
                if self._pool.enabled:
                    self._account()
                return
            sent = True
        else:
            sent = answer is None or self._send(answer)
        if sent and not self._pending and not self._mute_ms and not self._backlogged():
            self._busy = False
            if self._pool.enabled:
                self._account()
            return
        self._answers.appendleft(None if sent else answer)
        self._answering = True
        self.loop.create_task(self._answer_in_order())

    async def _answer_in_order(self) -> None:
        """Send the answers owed in request order; once none is owed, process the requests that waited."""
        try:
            while self._answers and not self._closed:
                answer = self._answers[0]
                if answer is not None and not isinstance(answer, Response):
                    answer = await answer
                self._answers.popleft()
                if answer is not None and not self._send(answer):
                    await self._send_file_response(answer)
                if self._backlogged():
                    await self._wait_drained()
                if self._mute_ms:
                    mute, self._mute_ms = self._mute_ms, 0
                    await asyncio.sleep(mute / 1000)
                if not self._answers:
                    self._busy = False
                    while self._pending and not self._busy and not self._closed:
                        frame = self._pending.popleft()
                        self._pending_bytes -= len(frame)
                        metrics.shard().request_queued(frame, time.perf_counter() - self._pending_since.popleft())
                        self._process(frame)
                    if self._pool.enabled and not self._closed:
                        self._account()
                    if "queue" in self._paused and len(self._pending) < MAX_QUEUED_PER_CONNECTION // 2:
                        self._resume("queue")
        except Exception as e:
            self._close_after(e)
        finally:
            self._answering = False
            if self._closed:
                self._drop_answers()

    def _close_after(self, e: BaseException) -> None:
        """An answer could not be completed or sent: the connection closes, logged by what went wrong."""
        if isinstance(e, CloseConnection):
            log.warning("Closing connection %s: %s", self.peer, e)
        elif isinstance(e, (ConnectionError, OSError)):
            if self._closed:
                return
            log.info("Connection %s failed while sending: %s", self.peer, e)
        else:
            log.error("Closing connection %s after an unexpected error completing a request", self.peer, exc_info=e)
        self.close(abort=True)

    def _drop_answers(self) -> None:
        """The connection is gone: answers still owed are never awaited, so their coroutines are closed."""
        while self._answers:
            answer = self._answers.popleft()
            close = getattr(answer, "close", None)
            if close is not None:
                close()

    # ------------------------------------------------------------ responses

    def _backlogged(self) -> bool:
        t = self.transport
        return t is not None and not self._closed and t.get_write_buffer_size() > MAX_UNSENT_BYTES  # type: ignore[attr-defined]

    def _send(self, response: Response) -> bool:
        """Write the response now if it needs no sendfile; False means the async path must send it."""
        if self._closed:
            return True
        ext = response.ext
        if not ext:
            if self._out is not None:
                self._out.append(response.frame)
            elif self._answers:
                self._hold([response.frame])
            else:
                self.transport.write(response.frame)  # type: ignore[union-attr]
            return True
        if sum(region.size for _, region in ext) > (TLS_INLINE_FILE_BYTES if self.tls else INLINE_FILE_BYTES):
            return False
        frame = response.frame
        parts: list[bytes | bytearray | memoryview] = []
        prev = 0
        for offset, region in ext:
            parts.append(memoryview(frame)[prev:offset])
            parts.append(region.read_bytes())
            prev = offset
        parts.append(memoryview(frame)[prev:])
        if self._out is not None:
            self._out.extend(parts)
        elif self._answers:
            self._hold(parts)
        else:
            self.transport.writelines(parts)  # type: ignore[union-attr]
        return True

    def _hold(self, parts: list[bytes | bytearray | memoryview]) -> None:
        """Hold an answer until the callbacks ready now have run, for one write with the answers that complete
        meanwhile: more are owed behind it (one high watermark advance completes several acks=all Produce
        requests of a connection at once)."""
        self._out = parts
        self.loop.call_soon(self._flush_out)

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out and not self._closed:
            self.transport.writelines(out)  # type: ignore[union-attr]

    async def _send_file_response(self, response: Response) -> None:
        self._flush_out()  # answers held for this loop iteration go before this one
        frame = memoryview(response.frame)
        prev = 0
        transport = self.transport
        assert transport is not None
        sock_fd = -1 if self.tls else transport.get_extra_info("socket").fileno()
        for offset, region in response.ext or ():
            if offset > prev:
                transport.write(frame[prev:offset])
            prev = offset
            if self.tls:
                await self._copy_region(region)
            else:
                await self._wait_drained()
                await self._sendfile(sock_fd, region)
        if prev < len(frame):
            transport.write(frame[prev:])

    async def _wait_drained(self) -> None:
        while self.transport is not None and self.transport.get_write_buffer_size() > 0:  # type: ignore[attr-defined]
            if self._drained is None or self._drained.done():
                self._drained = self.loop.create_future()
            if self.blocked_since is None:
                self.blocked_since = time.monotonic()
            await self._drained
        self.blocked_since = None
        if self._closed:
            raise ConnectionResetError("connection closed")

    async def _sendfile(self, sock_fd: int, region: Any) -> None:
        position, remaining = region.position, region.size
        waiter_fd = -1
        try:
            while remaining > 0:
                if self._closed:
                    raise ConnectionResetError("connection closed")
                try:
                    sent = os.sendfile(sock_fd, region.fd, position, remaining)
                except BlockingIOError:
                    sent = -1
                except OSError as e:
                    if e.errno == errno.EAGAIN:
                        sent = -1
                    else:
                        raise
                if sent == 0:
                    # The file is shorter than the region (truncated underneath): the client will
                    # see a short partial batch, which the protocol allows; pad to keep framing.
                    self.transport.write(bytes(remaining))  # type: ignore[union-attr]
                    return
                if sent > 0:
                    position += sent
                    remaining -= sent
                    continue
                self._sendfile_remaining = remaining
                # uvloop will not poll an fd its transport owns: wait on a duplicate of it.
                if waiter_fd < 0:
                    waiter_fd = os.dup(sock_fd)
                fut: asyncio.Future[None] = self.loop.create_future()
                self.loop.add_writer(waiter_fd, _set_once, fut)
                if self.blocked_since is None:
                    self.blocked_since = time.monotonic()
                try:
                    await fut
                finally:
                    self.loop.remove_writer(waiter_fd)
                self.blocked_since = None
        finally:
            self._sendfile_remaining = 0
            if waiter_fd >= 0:
                os.close(waiter_fd)

    async def _copy_region(self, region: Any) -> None:
        """A file region over TLS: pread in chunks into the encrypting transport, one chunk in flight."""
        position, remaining = region.position, region.size
        while remaining > 0:
            if self._closed:
                raise ConnectionResetError("connection closed")
            chunk = os.pread(region.fd, min(remaining, TLS_CHUNK_BYTES), position)
            if not chunk:  # a truncated file: pad to keep the framing
                self.transport.write(bytes(remaining))  # type: ignore[union-attr]
                return
            self.transport.write(chunk)  # type: ignore[union-attr]
            position += len(chunk)
            remaining -= len(chunk)
            if remaining > 0 and self.transport.get_write_buffer_size() > TLS_CHUNK_BYTES:  # type: ignore[union-attr]
                await self._wait_drained()

    def unsent_bytes(self) -> int:
        """Response bytes the client has not taken yet: the transport's buffer plus the rest of a sendfile."""
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0  # type: ignore[attr-defined]
        return buffered + self._sendfile_remaining

    def mute_for(self, ms: int) -> None:
        """Throttle a client over its quota: its next request waits ms after this response."""
        self._mute_ms = max(self._mute_ms, ms)

    def stop_reading(self) -> None:
        self._pause("shutdown")
        self._pending.clear()
        self._pending_since.clear()
        self._pending_bytes = 0

    def is_closed(self) -> bool:
        return self._closed

    def in_flight(self) -> bool:
        # The answer task runs while any answer is owed or still being sent; a parked answer is owed without it.
        return (self._answering or bool(self._answers)) and not self._closed

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if self.transport is not None:
            if self._out:
                # Answers to the requests before the one that ends the connection still go out.
                out, self._out = self._out, None
                self.transport.writelines(out)
            if abort:
                self.transport.abort()
            else:
                self.transport.close()


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Processor(threading.Thread):
    def __init__(self, index: int, config: KafkaConfig, apis: KafkaApis, server_ref: SocketServer) -> None:
        super().__init__(name=f"kafka-network-processor-{index}", daemon=True)
        self.index = index
        self.config = config
        self.apis = apis
        self.server_ref = server_ref
        self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        self.connections: dict[str, KafkaConnection] = {}
        self._next_id = 0
        self._started = threading.Event()

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        idle_ms = self.config["connections.max.idle.ms"]
        self.loop.call_later(1.0, self._sweep, idle_ms / 1000 if idle_ms >= 0 else -1.0,
                             self.config["request.timeout.ms"] / 1000)
        try:
            self.loop.run_forever()
        finally:
            # The loop stays open: late wake-ups (purgatory.notify_all at shutdown) may still be posted to it.
            self._cancel_leftover_tasks()

    def _cancel_leftover_tasks(self) -> None:
        """Requests of connections that closed while they waited (a long-poll fetch whose client went away)
        still have their tasks: end them here rather than leave them to be destroyed pending at exit."""
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    def wait_started(self) -> None:
        self._started.wait()

    def accept(self, sock: socket.socket, listener_name: str, ip: str) -> None:
        self.loop.call_soon_threadsafe(self._adopt, sock, listener_name, ip)

    def _adopt(self, sock: socket.socket, listener_name: str, ip: str) -> None:
        self._next_id += 1
        conn_id = f"{self.index}-{self._next_id}"
        self.loop.create_task(self._connect(sock, conn_id, listener_name, ip))

    async def _connect(self, sock: socket.socket, conn_id: str, listener_name: str, ip: str) -> None:
        security = self.server_ref.security.get(listener_name)
        made: list[KafkaConnection] = []

        def factory() -> KafkaConnection:
            made.append(KafkaConnection(self, conn_id, listener_name, security))
            return made[0]

        try:
            if security is not None and security.ssl_context is not None:
                await self.loop.connect_accepted_socket(factory, sock, ssl=security.ssl_context,
                                                        ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S)
            else:
                await self.loop.connect_accepted_socket(factory, sock)
        except (OSError, TimeoutError, ValueError, asyncio.CancelledError) as e:
            # A failed TLS handshake (garbage, an untrusted client certificate) never reaches connection_made.
            log.info("Could not set up connection from %s on listener %s: %s", ip, listener_name, e or type(e).__name__)
            sock.close()
            if not made or made[0].transport is None:
                self.server_ref.connection_closed(ip)

    def _sweep(self, idle_s: float, request_timeout_s: float) -> None:
        """Once a second: close idle connections, slow-loris senders and clients that never read."""
        now = time.monotonic()
        for conn in list(self.connections.values()):
            if idle_s >= 0 and not conn.in_flight() and conn.partial_since is None and now - conn.last_active > idle_s:
                log.info("Closing idle connection %s (connections.max.idle.ms)", conn.peer)
                conn.close()
            elif conn.partial_since is not None and now - conn.partial_since > request_timeout_s:
                log.warning("Closing connection %s: a request stayed incomplete for %.0f s (request.timeout.ms)",
                            conn.peer, now - conn.partial_since)
                conn.close(abort=True)
            elif conn.blocked_since is not None and now - conn.blocked_since > request_timeout_s:
                log.warning("Closing connection %s: it did not read %d bytes of responses for %.0f s",
                            conn.peer, conn.unsent_bytes(), now - conn.blocked_since)
                conn.close(abort=True)
        self.loop.call_later(1.0, self._sweep, idle_s, request_timeout_s)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop reading new requests, let in-flight ones finish (up to grace_s), then close everything."""

        async def _drain_and_stop() -> None:
            for conn in list(self.connections.values()):
                conn.stop_reading()
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(c.in_flight() for c in self.connections.values()):
                await asyncio.sleep(0.01)
            for conn in list(self.connections.values()):
                conn.close()
            await asyncio.sleep(0.05)
            self.loop.stop()

        if self.loop.is_running():
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(_drain_and_stop()))
        self.join(timeout=grace_s + 5)


class SocketServer:
    """Acceptor on the caller's loop, round-robin hand-off to the processors."""

    def __init__(self, config: KafkaConfig, apis: KafkaApis,
                 security: dict[str, ListenerSecurity] | None = None) -> None:
        self.config = config
        self.apis = apis
        # Listener name -> its TLS/SASL setup; PLAINTEXT listeners have none.
        self.security: dict[str, ListenerSecurity] = dict(security or {})
        self.memory_pool = RequestMemoryPool(config["queued.max.request.bytes"])
        self.processors = [Processor(i, config, apis, self) for i in range(config["num.network.threads"])]
        self._sockets: list[socket.socket] = []
        self._rr = 0
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._count = 0
        self._lock = threading.Lock()
        self.bound: dict[str, tuple[str, int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reload_handle: asyncio.TimerHandle | None = None
        self._accept_failures = 0
        self._accept_failure_logged = -1e9

    def start_processors(self) -> None:
        for p in self.processors:
            p.start()
        for p in self.processors:
            p.wait_started()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for listener in self.config.listeners:
            self._bind_one(loop, listener)
        if any(sec.ssl_context is not None for sec in self.security.values()):
            from kbroker.broker.security.listener import RELOAD_CHECK_S

            self._reload_handle = loop.call_later(RELOAD_CHECK_S, self._reload_tls, RELOAD_CHECK_S)

    def _reload_tls(self, every_s: float) -> None:
        for sec in self.security.values():
            sec.reload_if_changed()
        self._reload_handle = self._loop.call_later(every_s, self._reload_tls, every_s)  # type: ignore[union-attr]

    def _bind_one(self, loop: asyncio.AbstractEventLoop, listener: Listener) -> None:
        host = listener.host or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, listener.port))
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"cannot bind listener {listener.name} to {host}:{listener.port}: {e.strerror}") from None
        sock.listen(self.config["socket.listen.backlog.size"])
        sock.setblocking(False)
        self._sockets.append(sock)
        self.bound[listener.name] = sock.getsockname()[:2]
        loop.add_reader(sock.fileno(), self._on_accept, sock, listener.name)
        log.info("Listening on %s://%s:%d (%s)", listener.name, *sock.getsockname()[:2], listener.security_protocol)

    def _on_accept(self, lsock: socket.socket, listener_name: str) -> None:
        for _ in range(64):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._accept_failed(lsock, listener_name, e)
                return
            ip = addr[0]
            with self._lock:
                dynamic = self.apis.server.metadata.broker_configs
                if (self._count >= self.config.effective("max.connections", dynamic)
                        or self._per_ip[ip] >= self.config.effective("max.connections.per.ip", dynamic)):
                    log.warning("Refusing connection from %s: max.connections / max.connections.per.ip reached", ip)
                    sock.close()
                    continue
                self._count += 1
                self._per_ip[ip] += 1
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            proc = self.processors[self._rr % len(self.processors)]
            self._rr += 1
            proc.accept(sock, listener_name, ip)

    def _accept_failed(self, lsock: socket.socket, listener_name: str, e: OSError) -> None:
        """Out of descriptors (EMFILE/ENFILE) the pending connection stays in the backlog and the listener
        stays readable: stop polling it for a while instead of spinning, and log once per interval."""
        self._accept_failures += 1
        now = time.monotonic()
        if now - self._accept_failure_logged >= ACCEPT_FAILURE_LOG_INTERVAL_S:
            log.warning("accept failed on %s: %s (%d failures since the last report); pausing accepts for %.1f s",
                        listener_name, e, self._accept_failures, ACCEPT_BACKOFF_S)
            self._accept_failure_logged = now
            self._accept_failures = 0
        loop = self._loop
        if loop is None or e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            return
        fd = lsock.fileno()
        loop.remove_reader(fd)

        def resume() -> None:
            if lsock.fileno() >= 0 and lsock in self._sockets:
                loop.add_reader(fd, self._on_accept, lsock, listener_name)

        loop.call_later(ACCEPT_BACKOFF_S, resume)

    def connection_closed(self, ip: str) -> None:
        with self._lock:
            self._count -= 1
            self._per_ip[ip] -= 1
            if self._per_ip[ip] <= 0:
                del self._per_ip[ip]

    def stop_accepting(self) -> None:
        if self._reload_handle is not None:
            self._reload_handle.cancel()
        for sock in self._sockets:
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets.clear()

    def stop_processors(self) -> None:
        for p in self.processors:
            p.stop()
        for sec in self.security.values():
            sec.close()

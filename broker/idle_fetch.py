"""The idle long poll's direct path: a consumer's Fetch that finds nothing new, answered from a plan its connection
made once, parked without a task and answered from cached bytes.

An idle consumer sends the same Fetch again and again: librdkafka names its partitions at the same offsets every
fetch.wait.max.ms, moving the first partition of its list to the end each time. The general path decoded it into
objects, built a fetch context and a CachedPartition per partition, read every log (get_log, the offsets, a
PartitionData each), watched the purgatory through a waiter with its own future, ran a task per waiting request and
its coroutines, and built and encoded the empty answer at the end: ~300 us of CPU per idle Fetch of 10 partitions,
2.6-3x librdkafka's mock broker (docs/performance.md).

Here the first such Fetch on a connection is decoded and checked once (`IdleFetch.plan`): a consumer (no replica),
no fetch session (epoch -1 or Fetch < v7), read_uncommitted or read_committed, every topic known and every partition
named once, led here at the leader epoch the client names, and caught up (the high watermark, or for read_committed
the last stable offset, at or below the fetch offset, which is within the log). Each partition's answer (what the
general path sends: its offsets, no records) is encoded once, keyed by the topic and the partition's request fields.
A later Fetch with the same fields but its partitions, naming the same partitions in any order, gets those answers
joined in its order (`IdleFetch.answer`), and once seen its body is answered without a decode (`answer_body`). The
plan serves as long as nothing its answers depend on moved (`holds`): the topics map of the metadata (copy-on-write:
any topic, partition, leader or config change replaces it), the same Log object for every partition, each log's
fetch_state (log end, high watermark, log start, first unstable offset: equal states, equal answers), and a
replicated partition's leader, epoch and log. Those are C-level compares (map over operator.attrgetter), no Python
per partition.

The request then waits (`_ParkedFetch`) on one timer, as a network.Parked: the connection owes the answer without a
task. The plan is the purgatory's waiter for its partitions, watched across its requests and watched again only
after a notify, which wakes the request waiting: the general path then serves it for what is left of its wait
(handle_fetch, its answer encoded and counted as KafkaApis does), as it does when the broker closes. At the timer
the cached answer goes out with the request's correlation id; the plan is checked again first only if something was
notified since the wait began (the general path reads again only then). Anything else (an authorizer, fetch quotas,
an offline log dir, a follower, a session, an error, data to return, bytes that do not decode, Fetch v0-v3) is the
general path's from the start. KBROKER_IDLE_FETCH=0 turns the direct path off (the differential tests compare it
with the general path on the same broker state).
"""

from __future__ import annotations

import asyncio
import math
import operator
import os
import struct
import threading
import time
from types import CoroutineType
from typing import TYPE_CHECKING, Any

from kbroker.broker import metrics
from kbroker.broker.apis import NOT_DIRECT, DirectFn, HandlerFn, KafkaApis, RequestContext
from kbroker.broker.down_conversion import check_down_conversion
from kbroker.broker.network import Parked, Response
from kbroker.broker.purgatory import HIGH_WATERMARK, FetchPurgatory
from kbroker.protocol import codec
from kbroker.protocol.errors import KafkaError
from kbroker.protocol.messages import FetchRequest, FetchResponse

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer
    from kbroker.storage.log import Log

ENABLED = os.environ.get("KBROKER_IDLE_FETCH", "1") != "0"
# Fetch v4 is the first with an isolation level and the last stable offset; the general path serves v0-v3.
MIN_VERSION = 4
FINAL_EPOCH = -1
READ_COMMITTED = 1
# Down-conversion's refusals depend on the topic config for Fetch < v10 (down_conversion.check_down_conversion).
FIRST_UNCONVERTED_VERSION = 10

_FETCH_STATE = operator.attrgetter("fetch_state")
_LEADERSHIP = operator.attrgetter("leader_id", "leader_epoch", "log")
_CONFIG = operator.attrgetter("config")
# Everything of a request but its partitions: equal, and the partitions the same, the answer is the same.
_FIXED = operator.attrgetter(
    "cluster_id",
    "replica_id",
    "replica_state",
    "max_wait_ms",
    "min_bytes",
    "max_bytes",
    "isolation_level",
    "session_id",
    "session_epoch",
    "rack_id",
)
_PARTITION = operator.attrgetter(
    "partition",
    "current_leader_epoch",
    "fetch_offset",
    "last_fetched_epoch",
    "log_start_offset",
    "partition_max_bytes",
    "replica_directory_id",
)
_INT32 = struct.Struct(">i")
_HEAD = struct.Struct(">iiih")  # size, correlation id, throttle_time_ms, error_code (then the session id)
FLEXIBLE_VERSION = 12
SESSION_VERSION = 7
# What a plan remembers answers by body for: a client's rotations of one partition list (librdkafka moves one
# partition to the end on every Fetch, so as many bodies as partitions), bodies and answers together at most this
# many bytes per connection; past it, the rest are answered from the chunks.
MAX_BODY_BYTES = 64 * 1024
# The tagged structs of an answer's partitions at their defaults (the encoder's own instances, as fetch.py's _UNSET).
_UNSET = {
    "diverging_epoch": codec.tagged_default(FetchResponse.EpochEndOffset),
    "current_leader": codec.tagged_default(FetchResponse.LeaderIdAndEpoch),
    "snapshot_id": codec.tagged_default(FetchResponse.SnapshotId),
}


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Compact array lengths (n + 1) of the counts an answer usually has, written without a call.
_SMALL_UVARINTS = tuple(_uvarint(n) for n in range(128))


def _compact_length(n: int) -> bytes:
    return _SMALL_UVARINTS[n + 1] if n < 127 else _uvarint(n + 1)


class IdleFetch:
    """One connection's idle Fetch: the request's fields but its partitions (`fixed`), the encoded answer of each
    partition it names (`chunks`, by topic and partition fields), and what those answers depend on. A request with
    the same fields naming the same partitions in any order (librdkafka rotates them on every Fetch) is answered
    from the chunks."""

    __slots__ = (
        "version",
        "fixed",
        "by_id",
        "chunks",
        "topic_bytes",
        "count",
        "topics",
        "keys",
        "logs",
        "log_of",
        "states",
        "parts",
        "leadership",
        "configs",
        "max_wait_s",
        "min_bytes",
        "by_body",
        "body_bytes",
        "wants",
        "watched",
        "waiting",
        "loop",
        "thread_id",
    )

    def __init__(self, version: int, req: FetchRequest, server: KafkaServer) -> None:
        self.version = version
        self.fixed = _FIXED(req)
        self.by_id = version >= 13
        self.chunks: dict[tuple[Any, tuple[Any, ...]], bytes] = {}
        self.topic_bytes: dict[Any, bytes] = {}
        self.count = 0
        self.topics = server.metadata.topics
        self.keys: list[tuple[str, int]] = []
        self.logs: list[Log] = []
        self.log_of = server.log_manager.log_by_partition
        self.states: list[Any] = []
        self.parts: list[Any] = []
        self.leadership: list[Any] = []
        self.configs: list[Any] | None = None
        self.max_wait_s = req.max_wait_ms / 1000.0
        self.min_bytes = req.min_bytes
        # Answers already made, by request body (correlation id 0): librdkafka's rotations of its partition list
        # are a few bodies, each answered without a decode once seen.
        self.by_body: dict[bytes, bytes] = {}
        self.body_bytes = 0
        # The plan is the purgatory's waiter for its partitions (keys, wants, wake), watched across its requests: a
        # notify drops it from the partition that moved (watched False) and wakes the request waiting, if any; the
        # next request watches again. Ten purgatory entries made and removed per idle Fetch cost a sixth of it.
        self.wants = HIGH_WATERMARK
        self.watched = False
        self.waiting: _ParkedFetch | None = None
        self.loop = asyncio.get_running_loop()
        self.thread_id = threading.get_ident()

    def wake(self) -> None:
        """The purgatory's notify (from any thread)."""
        self.watched = False
        if threading.get_ident() == self.thread_id:
            self._wake_waiting()
        else:
            self.loop.call_soon_threadsafe(self._wake_waiting)

    def _wake_waiting(self) -> None:
        waiting = self.waiting
        if waiting is not None:
            waiting.woken()

    def watch(self, purgatory: FetchPurgatory) -> None:
        if not self.watched:
            self.watched = True
            purgatory.add(self)

    def release(self, purgatory: FetchPurgatory) -> None:
        """No longer the connection's plan (replaced, or the connection closed): out of the purgatory."""
        self.watched = False
        purgatory.unwatch(self)

    def holds(self, server: KafkaServer) -> bool:
        """Whether the answers are still what the general path would give (see the module doc)."""
        return (
            server.metadata.topics is self.topics
            and not server.log_manager.offline_partitions
            and list(map(self.log_of, self.keys)) == self.logs
            and list(map(_FETCH_STATE, self.logs)) == self.states
            and list(map(_LEADERSHIP, self.parts)) == self.leadership
            and (self.configs is None or list(map(_CONFIG, self.logs)) == self.configs)
        )

    def answer(self, req: FetchRequest, correlation_id: int) -> bytearray | None:
        """The answer frame to `req` from the chunks, or None when `req` is not this plan's request (other fields,
        another partition, a partition named twice)."""
        if _FIXED(req) != self.fixed or req.forgotten_topics_data:
            return None
        chunks = self.chunks
        by_id = self.by_id
        topics: list[tuple[Any, list[bytes]]] = []
        count = 0
        for t in req.topics:
            key = t.topic_id if by_id else t.topic
            parts = [chunks.get((key, fields)) for fields in map(_PARTITION, t.partitions)]
            if None in parts:
                return None
            count += len(parts)
            # Consecutive partitions of one topic share a topic entry, as the general path's answer.
            if topics and topics[-1][0] == key:
                topics[-1][1].extend(parts)  # type: ignore[arg-type]
            elif parts:
                topics.append((key, parts))  # type: ignore[arg-type]
        if count != self.count or len({id(c) for _, ps in topics for c in ps}) != count:
            return None
        return self._encode(correlation_id, topics)

    def answer_body(self, body: bytes, req: FetchRequest | None, correlation_id: int) -> bytearray | None:
        """answer() for the request whose body is `body` (decoded as `req` when not seen before); remembered by
        body, up to MAX_BODY_BYTES."""
        seen = self.by_body.get(body)
        if seen is not None:
            out = bytearray(seen)
            _INT32.pack_into(out, 4, correlation_id)
            return out
        if req is None:
            return None
        out = self.answer(req, correlation_id)
        if out is not None and self.body_bytes + len(body) + len(out) <= MAX_BODY_BYTES:
            self.by_body[body] = bytes(out)
            self.body_bytes += len(body) + len(out)
        return out

    def _encode(self, correlation_id: int, topics: list[tuple[Any, list[bytes]]]) -> bytearray:
        version = self.version
        flexible = version >= FLEXIBLE_VERSION
        out = bytearray(_HEAD.pack(0, correlation_id, 0, 0))
        if flexible:
            out[8:8] = b"\0"  # the response header's tagged fields
        if version < SESSION_VERSION:
            del out[-2:]  # no error code before v7
        else:
            out += _INT32.pack(0)  # sessionless: the session id is 0
        out += _compact_length(len(topics)) if flexible else _INT32.pack(len(topics))
        topic_bytes = self.topic_bytes
        for key, parts in topics:
            out += topic_bytes[key]
            out += _compact_length(len(parts)) if flexible else _INT32.pack(len(parts))
            for chunk in parts:
                out += chunk
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
        _INT32.pack_into(out, 0, len(out) - 4)
        return out

    @classmethod
    def plan(cls, ctx: RequestContext, req: FetchRequest) -> IdleFetch | None:
        """The plan of a Fetch whose every partition is caught up, else None (the general path serves it)."""
        server = ctx.server
        version = ctx.api_version
        replica_id = (
            (req.replica_state.replica_id if req.replica_state is not None else -1)
            if version >= 15
            else req.replica_id
        )
        if (
            replica_id >= 0
            or req.isolation_level not in (0, 1)
            or not req.topics
            or req.forgotten_topics_data
            or (version >= SESSION_VERSION and (req.session_epoch != FINAL_EPOCH or req.session_id != 0))
        ):
            return None
        plan = cls(version, req, server)
        by_id = plan.by_id
        names = server.topic_names_by_id() if by_id else None
        rm = server.replica_manager
        committed = req.isolation_level == READ_COMMITTED
        encode_partition = codec.encoder(FetchResponse.PartitionData, version)
        seen: set[tuple[str, int]] = set()
        for t in req.topics:
            name = names.get(t.topic_id) if names is not None else t.topic
            if name is None:
                return None
            key = t.topic_id if by_id else t.topic
            if key not in plan.topic_bytes:
                plan.topic_bytes[key] = _topic_bytes(version, t)
            for p in t.partitions:
                tp = (name, p.partition)
                try:
                    # Leader only, as the general path for Fetch < v11; a v11+ consumer reading a follower (KIP-392)
                    # is the general path's.
                    lg = rm.get_log(name, p.partition, p.current_leader_epoch)
                    if version < FIRST_UNCONVERTED_VERSION:
                        check_down_conversion(lg.config, version)
                except KafkaError:
                    return None
                part = rm.partitions.get(tp)
                state = lg.fetch_state
                leo, hw, log_start, _ = state
                lso = lg.last_stable_offset
                offset = p.fetch_offset
                if (
                    not (lso if committed else hw) <= offset <= leo
                    or offset < log_start
                    or tp in seen
                    or lg.fetch_state != state
                ):
                    return None
                seen.add(tp)
                plan.keys.append(tp)
                plan.logs.append(lg)
                plan.states.append(state)
                if part is not None:
                    plan.parts.append(part)
                chunk = bytearray()
                encode_partition(
                    FetchResponse.PartitionData(
                        partition_index=p.partition,
                        error_code=0,
                        high_watermark=hw,
                        last_stable_offset=lso,
                        log_start_offset=log_start,
                        aborted_transactions=[] if committed else None,
                        preferred_read_replica=-1,
                        records=b"",
                        **_UNSET,
                    ),
                    chunk,
                    None,
                )
                plan.chunks[(key, _PARTITION(p))] = bytes(chunk)
                plan.count += 1
        if not plan.count or server.metadata.topics is not plan.topics:
            return None
        plan.leadership = list(map(_LEADERSHIP, plan.parts))
        if version < FIRST_UNCONVERTED_VERSION:
            plan.configs = list(map(_CONFIG, plan.logs))
        return plan


def _topic_bytes(version: int, t: FetchRequest.FetchTopic) -> bytes:
    """A topic's key as the answer writes it: the name (v12: compact) before v13, the id from v13."""
    if version >= 13:
        return bytes(t.topic_id)
    name = t.topic.encode()
    return (_uvarint(len(name) + 1) if version >= FLEXIBLE_VERSION else struct.pack(">h", len(name))) + name


class _ParkedFetch:
    """An idle Fetch waiting out its max wait: one timer, woken through its plan's purgatory entry; the
    connection's network.Parked takes the answer."""

    __slots__ = (
        "ctx",
        "general",
        "entry",
        "req",
        "frame",
        "pos",
        "answer",
        "started",
        "deadline",
        "loop",
        "timer",
        "parked",
        "done",
        "generation",
    )

    def __init__(
        self,
        ctx: RequestContext,
        general: HandlerFn,
        entry: IdleFetch,
        req: FetchRequest | None,
        frame: bytes | bytearray,
        pos: int,
        answer: bytearray,
        started: float,
    ) -> None:
        self.ctx = ctx
        self.general = general
        self.entry = entry
        self.req = req  # None: not decoded (an answer remembered by body); _general decodes it
        self.frame = frame
        self.pos = pos
        self.answer = answer
        self.started = started
        self.deadline = time.monotonic() + entry.max_wait_s
        self.loop = entry.loop
        self.timer: asyncio.TimerHandle | None = None
        self.parked = Parked()
        self.done = False
        self.generation = 0

    def start(self) -> bool:
        """Wait, watched through the plan, then check (a change between the check and the watch is not missed);
        False: the plan no longer holds."""
        entry = self.entry
        purgatory = self.ctx.server.replica_manager.purgatory
        entry.waiting = self
        entry.watch(purgatory)
        self.generation = purgatory.generation
        if purgatory.closing or not entry.holds(self.ctx.server):
            self.done = True
            entry.waiting = None
            return False
        self.timer = self.loop.call_later(entry.max_wait_s, self._expire)
        return True

    def _finish_waiting(self) -> None:
        self.done = True
        if self.entry.waiting is self:
            self.entry.waiting = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def woken(self) -> None:
        """A notify on one of the plan's partitions (on this loop): the general path for what is left of the wait."""
        if self.done:
            return
        self._finish_waiting()
        left_ms = math.ceil((self.deadline - time.monotonic()) * 1000)
        self._general(max(0, left_ms))

    def _expire(self) -> None:
        if self.done:
            return
        self.timer = None
        self._finish_waiting()
        if self.ctx.server.replica_manager.purgatory.generation != self.generation and not self.entry.holds(
            self.ctx.server
        ):
            # Something was notified since the wait began (the general path then reads again) and what this answer
            # depends on moved: the general path answers, now.
            self._general(0)
            return
        metrics.shard().request_done(1, time.perf_counter() - self.started)
        self.parked.complete(Response(self.answer))

    def _general(self, max_wait_ms: int) -> None:
        """The general path for what is left of the wait: handled, encoded and counted as KafkaApis does."""
        try:
            req = self.req
            if req is None:
                req, _ = codec.decode(FetchRequest, self.ctx.api_version, self.frame, self.pos)
            req.max_wait_ms = max_wait_ms
            result = self.general(self.ctx, req)
        except Exception as e:  # noqa: BLE001 - the connection closes, as when a handler raises
            self.parked.complete(e)
            return
        if type(result) is CoroutineType:
            self.loop.create_task(self._await(result))
        else:
            self._answer(result)

    async def _await(self, pending: Any) -> None:
        try:
            body = await pending
        except Exception as e:  # noqa: BLE001
            self.parked.complete(e)
            return
        self._answer(body)

    def _answer(self, body: Any) -> None:
        header = self.ctx.header
        try:
            response = KafkaApis.encode(header, body)
        except Exception as e:  # noqa: BLE001
            self.parked.complete(e)
            return
        shard = metrics.shard()
        shard.answered(1, body)
        shard.request_done(1, time.perf_counter() - self.started)
        self.parked.complete(response)


def _replace_plan(ctx: RequestContext, plan: IdleFetch | None) -> IdleFetch | None:
    """The connection's plan from now on; the one before leaves the purgatory (as it does when the connection
    closes)."""
    conn = ctx.conn
    purgatory = ctx.server.replica_manager.purgatory
    old = conn.idle_fetch
    if old is not None:
        old.release(purgatory)
    if plan is not None and not conn.idle_fetch_hooked:
        conn.idle_fetch_hooked = True
        conn.close_hooks.append(lambda: _replace_plan(ctx, None))
    conn.idle_fetch = plan
    return plan


def direct_path(general: HandlerFn) -> DirectFn | None:
    """The Fetch handler's direct path over `general` (handle_fetch); None when KBROKER_IDLE_FETCH=0."""
    if not ENABLED:
        return None

    def handle_idle_fetch(ctx: RequestContext, frame: bytes | bytearray, pos: int) -> Any:
        server = ctx.server
        version = ctx.api_version
        if (
            version < MIN_VERSION
            or server.authorizer is not None
            or server.fetch_quota.quotas()
            or server.log_manager.offline_partitions
        ):
            return NOT_DIRECT
        started = time.perf_counter()
        conn = ctx.conn
        correlation_id = ctx.header.correlation_id
        body = bytes(memoryview(frame)[pos:])
        entry: IdleFetch | None = conn.idle_fetch
        req: FetchRequest | None = None
        # The connection's plan first: its answer if the request is the plan's, checked (holds) once watched.
        answer = (
            entry.answer_body(body, None, correlation_id)
            if entry is not None and entry.version == version
            else None
        )
        if answer is None:
            try:
                req, _ = codec.decode(FetchRequest, version, frame, pos)
            except codec.DecodeError:
                return NOT_DIRECT  # KafkaApis closes the connection with its message
            if entry is not None and entry.version == version:
                answer = entry.answer_body(body, req, correlation_id)
        for _ in range(2):
            if answer is None:
                if req is None:
                    req, _ = codec.decode(FetchRequest, version, frame, pos)
                entry = _replace_plan(ctx, IdleFetch.plan(ctx, req))
                answer = entry.answer_body(body, req, correlation_id) if entry is not None else None
                if entry is None or answer is None:
                    _replace_plan(ctx, None)
                    return general(ctx, req)
            assert entry is not None
            if entry.max_wait_s <= 0 or entry.min_bytes <= 0:
                # Answered at once, as the general path answers a poll that may not wait or wants nothing.
                if not entry.holds(server):
                    answer = None
                    continue
                metrics.shard().request_done(1, time.perf_counter() - started)
                return Response(answer)
            waiting = _ParkedFetch(ctx, general, entry, req, frame, pos, answer, started)
            if waiting.start():
                return waiting.parked
            answer = None  # the plan no longer holds: planned again from this request
        _replace_plan(ctx, None)
        if req is None:
            req, _ = codec.decode(FetchRequest, version, frame, pos)
        return general(ctx, req)

    return handle_idle_fetch

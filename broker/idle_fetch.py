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
joined in its order (`IdleFetch.answer`), and once seen its frame (past the correlation id) is answered without a
decode: KafkaApis.handle gives every request of a connection with a plan to `IdleFetch.take` first, before it
decodes the header or dispatches (that was a third of this path's Python).

A fetch session's idle Fetch (KIP-227; the Java client, kafka-python) is an incremental Fetch naming no partition
and forgetting none, the same bytes every time but the epoch. Its plan (`IdleFetch._plan_session`) is made when the
session is a consumer's, at the request's epoch, and every partition of it is led here, caught up, and was last told
the offsets it has now (its CachedPartition's high watermark, log start and last stable offset): the general path's
incremental answer would then be empty. A later request matching the plan's bytes but the epoch, at the epoch the
session expects, gets FetchManager.new_context's bookkeeping (the epoch checked under the cache's lock and moved on,
the session touched in the LRU order) and the empty answer; any other epoch, an evicted or replaced session, a
partition named or forgotten is the general path's (INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_ID_NOT_FOUND, ...).
Woken, or moved at its timer, it goes on in handle_fetch's incremental context at the epoch it set
(fetch.resume_incremental), which also answers INVALID_FETCH_SESSION_EPOCH if another request of the session came
meanwhile.

The plan serves as long as nothing its answers depend on moved (`holds`): the topics map of the metadata
(copy-on-write: any topic, partition, leader or config change replaces it), the log manager's logs_version (any Log
added, replaced or removed moves it), each log's fetch_state (log end, high watermark, log start, first unstable
offset: equal states, equal answers), and a replicated partition's leader, epoch and log. Those are C-level compares
(map over operator.attrgetter), no Python per partition.

The request then waits (`_ParkedFetch`, a delayed_fetch.DelayedFetch, itself the network.Parked answer) on one
timer: the connection owes the answer without a task. The plan is the purgatory's waiter for its partitions, watched
across its requests and watched again only after a notify, which wakes the request waiting: the general path then serves it for what is left of its wait
(handle_fetch, its answer encoded and counted as KafkaApis does), as it does when the broker closes. At the timer
the cached answer goes out with the request's correlation id; the plan is checked again first only if something was
notified since the wait began (the general path reads again only then). Anything else (an authorizer, fetch quotas,
an offline log dir, a follower, a full Fetch of a session, an error, data to return, bytes that do not decode, Fetch v0-v3) is the
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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kbroker.broker import metrics
from kbroker.broker.apis import NOT_DIRECT, DirectFn, HandlerFn, RequestContext
from kbroker.broker.delayed_fetch import FETCH, DelayedFetch
from kbroker.broker.down_conversion import check_down_conversion
from kbroker.broker.fetch_session import FetchSession, next_epoch
from kbroker.broker.network import KafkaConnection, Response
from kbroker.broker.purgatory import HIGH_WATERMARK, FetchPurgatory
from kbroker.protocol import codec
from kbroker.protocol.errors import KafkaError
from kbroker.protocol.messages import FetchRequest, FetchResponse
from kbroker.storage.log import Log

if TYPE_CHECKING:
    from kbroker.broker.replica_manager import ReplicaManager
    from kbroker.broker.server import KafkaServer

ENABLED = os.environ.get("KBROKER_IDLE_FETCH", "1") != "0"
# Fetch v4 is the first with an isolation level and the last stable offset; the general path serves v0-v3.
MIN_VERSION = 4
FINAL_EPOCH = -1
READ_COMMITTED = 1
# Down-conversion's refusals depend on the topic config for Fetch < v10 (down_conversion.check_down_conversion).
FIRST_UNCONVERTED_VERSION = 10

# Log.fetch_state's own getter, called without the property (a tenth of the plan's check).
_FETCH_STATE = Log.fetch_state.fget
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
# Where a request's session epoch lies after the body's start: past the replica id (before v15), max wait, min and
# max bytes, isolation level and session id.
SESSION_EPOCH_AT = 4 + 4 + 4 + 4 + 1 + 4
# handle_fetch's incremental Fetch in the context a request's session bookkeeping made: (ctx, request, session,
# the epoch the bookkeeping gave it).
ResumeFn = Callable[[RequestContext, FetchRequest, FetchSession, int], Any]
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
    from the chunks. A session's plan (`session` set) answers the session's next incremental Fetch with nothing
    changed: the same bytes but the epoch, which must be the session's."""

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
        "logs_version",
        "states",
        "parts",
        "leadership",
        "configs",
        "max_wait_s",
        "min_bytes",
        "by_body",
        "body_bytes",
        "bodies",
        "after",
        "last_body",
        "expect",
        "wants",
        "watched",
        "waiting",
        "loop",
        "thread_id",
        "head",
        "server",
        "general",
        "resume",
        "session",
        "cache",
        "session_epoch",
        "frame_len",
        "prefix",
        "suffix",
        "epoch_at",
        "session_answer",
        "shard",
        "metadata",
        "log_manager",
        "purgatory",
    )

    def __init__(
        self,
        version: int,
        req: FetchRequest,
        server: KafkaServer,
        frame: bytes | bytearray,
        general: HandlerFn,
        resume: ResumeFn,
    ) -> None:
        self.version = version
        self.fixed = _FIXED(req)
        self.by_id = version >= 13
        self.chunks: dict[tuple[Any, tuple[Any, ...]], bytes] = {}
        self.topic_bytes: dict[Any, bytes] = {}
        self.count = 0
        self.topics = server.metadata.topics
        self.keys: list[tuple[str, int]] = []
        self.logs: list[Log] = []
        # Taken before any log is looked up: a log added, replaced or removed from now on moves it (holds).
        self.logs_version = server.log_manager.logs_version
        self.states: list[Any] = []
        self.parts: list[Any] = []
        self.leadership: list[Any] = []
        self.configs: list[Any] | None = None
        self.max_wait_s = req.max_wait_ms / 1000.0
        self.min_bytes = req.min_bytes
        # Answers already made, by what follows the correlation id in the request frame (the client id and the
        # body): librdkafka's rotations of its partition list are a few frames, each answered without a decode once
        # seen, before KafkaApis decodes the header (take).
        self.by_body: dict[bytes, bytes] = {}
        self.body_bytes = 0
        # The keys of by_body, each to itself (bytes objects keep their hash: a lookup with one hashes nothing), and
        # which of them followed which last time: a client's next frame is then usually recognised by one compare
        # with the body expected (librdkafka cycles through its rotations) instead of a copy and a hash of it.
        self.bodies: dict[bytes, bytes] = {}
        self.after: dict[bytes | None, bytes] = {}
        self.last_body: bytes | None = None
        self.expect: bytes | None = None
        # The plan is the purgatory's waiter for its partitions (keys, wants, wake), watched across its requests: a
        # notify drops it from the partition that moved (watched False) and wakes the request waiting, if any; the
        # next request watches again. Ten purgatory entries made and removed per idle Fetch cost a sixth of it.
        self.wants = HIGH_WATERMARK
        self.watched = False
        self.waiting: _ParkedFetch | None = None
        self.loop = asyncio.get_running_loop()
        self.thread_id = threading.get_ident()
        # This thread's metrics shard: the plan's requests are all taken, parked and answered on this loop.
        self.shard = metrics.shard()
        # The server's parts this plan reads on every request (set once when the server starts): slot reads here
        # rather than attribute lookups in its dicts.
        self.metadata = server.metadata
        self.log_manager = server.log_manager
        self.purgatory = server.replica_manager.purgatory
        self.head = bytes(frame[:4])  # the api key (1) and version
        self.server = server
        self.general = general
        self.resume = resume
        self.session: FetchSession | None = None
        self.cache = server.fetch_manager.cache
        self.session_epoch = 0
        self.frame_len = 0
        self.prefix = b""
        self.suffix = b""
        self.epoch_at = 0
        self.session_answer = b""

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
            waiting.woken()  # DelayedFetch.woken: on this loop now

    def watch(self, purgatory: FetchPurgatory) -> None:
        if not self.watched:
            self.watched = True
            purgatory.add(self)

    def release(self, purgatory: FetchPurgatory) -> None:
        """No longer the connection's plan (replaced, or the connection closed): out of the purgatory."""
        self.watched = False
        purgatory.unwatch(self)

    def holds(self) -> bool:
        """Whether the answers are still what the general path would give (see the module doc)."""
        log_manager = self.log_manager
        return (
            self.metadata.topics is self.topics
            and not log_manager.offline_partitions
            and log_manager.logs_version == self.logs_version
            and list(map(_FETCH_STATE, self.logs)) == self.states
            and list(map(_LEADERSHIP, self.parts)) == self.leadership
            and (self.configs is None or list(map(_CONFIG, self.logs)) == self.configs)
        )

    # ------------------------------------------------------------ requests

    def take(self, conn: KafkaConnection, frame: bytes | bytearray) -> Response | _ParkedFetch | None:
        """KafkaApis.handle's first look, before the header is decoded: this plan's request again (a frame seen
        before but for its correlation id, or the session's next epoch), answered or parked and counted as
        KafkaApis counts a direct path's; None: anything else, which takes the general dispatch."""
        if not frame.startswith(self.head):
            return None
        server = self.server
        if (
            server.authorizer is not None
            # What request_quota.quotas() and fetch_quota.quotas() return (server.py's sources), without their two
            # calls: a request or fetch quota anywhere sends the request the general way.
            or self.metadata.client_quotas
            or self.log_manager.offline_partitions
        ):
            return None
        started = time.perf_counter()
        if self.session is None:
            body = self.expect
            if body is None or len(frame) != len(body) + 8 or not frame.endswith(body):
                body = self.bodies.get(bytes(memoryview(frame)[8:]))
                if body is None:
                    return None
                self.after[self.last_body] = body
            self.last_body = body
            self.expect = self.after.get(body)
            seen = self.by_body[body]
        elif self.session_matches(frame):
            seen = self.session_answer
        else:
            return None
        answer = bytearray(seen)
        answer[4:8] = frame[4:8]  # the correlation id
        if self.session is None and self.max_wait_s > 0 and self.min_bytes > 0:
            # serve()'s usual case without its call: parked until the deadline.
            waiting = _ParkedFetch(self, conn, frame, answer, started, None, None)
            if not waiting.start():
                return None
            self.shard.busy_s += time.perf_counter() - started
            return waiting
        result = self.serve(conn, frame, answer, started, None, None)
        if result is not None:
            shard = self.shard
            elapsed = time.perf_counter() - started
            shard.busy_s += elapsed
            if type(result) is Response:
                shard.request_done(1, elapsed)
        return result

    def session_matches(self, frame: bytes | bytearray) -> bool:
        """The frame is the session plan's request at the epoch the session expects (no partition changed, none
        forgotten, the same fields)."""
        return (
            len(frame) == self.frame_len
            and frame.startswith(self.prefix, 8)
            and frame.endswith(self.suffix)
            and _INT32.unpack_from(frame, self.epoch_at)[0] == self.session_epoch
        )

    def answer_request(
        self, frame: bytes | bytearray, req: FetchRequest, correlation_id: int
    ) -> bytearray | None:
        """The answer frame to a decoded request if it is this plan's, else None."""
        if self.session is not None:
            if not self.session_matches(frame):
                return None
            out = bytearray(self.session_answer)
            _INT32.pack_into(out, 4, correlation_id)
            return out
        return self.answer_body(bytes(memoryview(frame)[8:]), req, correlation_id)

    def serve(
        self,
        conn: KafkaConnection,
        frame: bytes | bytearray,
        answer: bytearray,
        started: float,
        req: FetchRequest | None,
        ctx: RequestContext | None,
    ) -> Response | _ParkedFetch | None:
        """The request answered now (no wait) or parked, the session's bookkeeping done; None (nothing done):
        the plan no longer holds, or the session moved on."""
        if self.max_wait_s <= 0 or self.min_bytes <= 0:
            # Answered at once, as the general path answers a poll that may not wait or wants nothing.
            if not self.holds() or (self.session is not None and not self._next_epoch()):
                return None
            return Response(answer)
        waiting = _ParkedFetch(self, conn, frame, answer, started, req, ctx)
        if not waiting.start():
            return None
        if self.session is not None:
            # FetchManager.new_context's bookkeeping of an incremental Fetch naming no partition, after the check
            # (which the general path makes after it: a plan that fails leaves the session to the general path).
            if not self._next_epoch():
                waiting.cancel()
                return None
            waiting.expected = self.session_epoch
        return waiting

    def _next_epoch(self) -> bool:
        """new_context for the session: still the cache's, at the epoch the request names; touched (LRU) and its
        epoch moved on. False: anything else (the general path answers it, with its error)."""
        session = self.session
        assert session is not None
        cache = self.cache
        with cache.lock:
            if cache.sessions.get(session.id) is not session or session.epoch != self.session_epoch:
                return False
            cache.touch(session, cache.clock_ms())
            session.epoch = next_epoch(session.epoch)
        self.session_epoch = session.epoch
        return True

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

    def answer_body(self, body: bytes, req: FetchRequest, correlation_id: int) -> bytearray | None:
        """answer() for the request whose frame past its correlation id is `body`; remembered by it, up to
        MAX_BODY_BYTES."""
        seen = self.by_body.get(body)
        if seen is not None:
            out = bytearray(seen)
            _INT32.pack_into(out, 4, correlation_id)
            return out
        out = self.answer(req, correlation_id)
        if out is not None and self.body_bytes + len(body) + len(out) <= MAX_BODY_BYTES:
            self.by_body[body] = bytes(out)
            self.bodies[body] = body
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

    # ------------------------------------------------------------ plans

    @classmethod
    def plan(
        cls,
        ctx: RequestContext,
        req: FetchRequest,
        frame: bytes | bytearray,
        pos: int,
        general: HandlerFn,
        resume: ResumeFn,
    ) -> IdleFetch | None:
        """The plan of a Fetch whose every partition is caught up (or of a session's incremental Fetch whose every
        partition is caught up and was told so), else None (the general path serves it)."""
        server = ctx.server
        version = ctx.api_version
        replica_id = (
            (req.replica_state.replica_id if req.replica_state is not None else -1)
            if version >= 15
            else req.replica_id
        )
        if replica_id >= 0 or req.isolation_level not in (0, 1):
            return None
        if version >= SESSION_VERSION and req.session_epoch > 0:
            if req.topics or req.forgotten_topics_data or req.session_id == 0:
                return None
            return cls(version, req, server, frame, general, resume)._plan_session(req, frame, pos)
        if (
            not req.topics
            or req.forgotten_topics_data
            or (version >= SESSION_VERSION and (req.session_epoch != FINAL_EPOCH or req.session_id != 0))
        ):
            return None
        plan = cls(version, req, server, frame, general, resume)
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
                state = _caught_up(plan, rm, tp, p, committed) if tp not in seen else None
                if state is None:
                    return None
                seen.add(tp)
                _, hw, log_start, lso = state
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
        return plan._complete()

    def _plan_session(self, req: FetchRequest, frame: bytes | bytearray, pos: int) -> IdleFetch | None:
        """This plan for an incremental Fetch naming no partition and forgetting none (the Java client's idle Fetch):
        made when the session is at the request's epoch, a consumer's, and every partition of it is led here, caught
        up and was last told the offsets it has now, so that the general path's incremental answer would be empty."""
        plan = self
        server = plan.server
        version = plan.version
        cache = plan.cache
        with cache.lock:
            session = cache.get(req.session_id)
            if (
                session is None
                or session.epoch != req.session_epoch
                or session.privileged
                or session.uses_topic_ids != (version >= 13)
            ):
                return None
            cached = list(session.partitions.values())
        rm = server.replica_manager
        committed = req.isolation_level == READ_COMMITTED
        topics = server.metadata.topics
        for cp in cached:
            name = cp.topic
            if name is None:
                return None
            if plan.by_id:
                rec = topics.get(name)
                if rec is None or rec.topic_id != cp.topic_id:
                    return None
            state = _caught_up(plan, rm, (name, cp.partition), cp.req, committed)
            if (
                state is None
                or (cp.high_watermark, cp.local_log_start_offset, cp.last_stable_offset) != state[1:]
            ):
                return None
        if not cached:
            return None
        plan.session = session
        plan.session_epoch = req.session_epoch
        plan.epoch_at = pos + (SESSION_EPOCH_AT if version < 15 else SESSION_EPOCH_AT - 4)
        plan.frame_len = len(frame)
        plan.prefix = bytes(frame[8 : plan.epoch_at])
        plan.suffix = bytes(frame[plan.epoch_at + 4 :])
        plan.session_answer = bytes(
            codec.encode_response(
                0,
                1,
                version,
                FetchResponse(throttle_time_ms=0, error_code=0, session_id=session.id, responses=[]),
            )
        )
        return plan._complete()

    def _complete(self) -> IdleFetch | None:
        """The plan, if the metadata did not change while it was made."""
        if not self.keys or self.server.metadata.topics is not self.topics:
            return None
        self.leadership = list(map(_LEADERSHIP, self.parts))
        if self.version < FIRST_UNCONVERTED_VERSION:
            self.configs = list(map(_CONFIG, self.logs))
        return self


def _caught_up(
    plan: IdleFetch, rm: ReplicaManager, tp: tuple[str, int], p: FetchRequest.FetchPartition, committed: bool
) -> tuple[int, int, int, int] | None:
    """A partition's (log end, high watermark, log start, last stable offset) when it is led here at the epoch
    the request names, may be read at this version and the fetch offset is at the end of what the consumer may
    read; the plan then depends on it. None: the general path's partition."""
    try:
        # Leader only, as the general path for Fetch < v11; a v11+ consumer reading a follower (KIP-392) is the
        # general path's.
        lg = rm.get_log(tp[0], tp[1], p.current_leader_epoch)
        if plan.version < FIRST_UNCONVERTED_VERSION:
            check_down_conversion(lg.config, plan.version)
    except KafkaError:
        return None
    state = lg.fetch_state
    leo, hw, log_start, _ = state
    lso = lg.last_stable_offset
    offset = p.fetch_offset
    if not (lso if committed else hw) <= offset <= leo or offset < log_start or lg.fetch_state != state:
        return None
    plan.keys.append(tp)
    plan.logs.append(lg)
    plan.states.append(state)
    part = rm.partitions.get(tp)
    if part is not None:
        plan.parts.append(part)
    return leo, hw, log_start, lso


def _topic_bytes(version: int, t: FetchRequest.FetchTopic) -> bytes:
    """A topic's key as the answer writes it: the name (v12: compact) before v13, the id from v13."""
    if version >= 13:
        return bytes(t.topic_id)
    name = t.topic.encode()
    return (_uvarint(len(name) + 1) if version >= FLEXIBLE_VERSION else struct.pack(">h", len(name))) + name


class _ParkedFetch(DelayedFetch):
    """An idle Fetch waiting out its max wait (a delayed_fetch.DelayedFetch: one timer, the connection's Parked
    answer), woken through its plan's purgatory entry: the plan, not the request, is the purgatory's waiter."""

    __slots__ = ("plan", "client", "frame", "ready", "req", "generation", "expected")

    def __init__(
        self,
        plan: IdleFetch,
        client: KafkaConnection,
        frame: bytes | bytearray,
        ready: bytearray,
        started: float,
        req: FetchRequest | None,
        ctx: RequestContext | None,
    ) -> None:
        # DelayedFetch's and Parked's fields, set here rather than through their __init__ (a call less per request;
        # the purgatory's waiter fields are the plan's; deadline and timer are start()'s).
        self.conn = None
        self.answer = None
        self.done = False
        self._future = None
        # None, both: the request came through IdleFetch.take, undecoded; _general decodes it when needed.
        self.ctx = ctx
        self.started = started
        self.throttle = 0  # no request quota on this path (IdleFetch.take, KafkaApis' direct paths)
        self.loop = plan.loop
        self.waiting = False
        self.outer = None
        self.inner = None
        # Watched through its plan, which stays watched across its requests: the plan's waiting is this fetch until
        # the next request's (a wake-up of a fetch no longer waiting is ignored), so there is nothing to unwatch.
        self.purgatory = None
        self.plan = plan
        self.client = client
        self.frame = frame
        self.ready = ready
        self.req = req
        self.generation = 0
        self.expected = 0  # a session's epoch after this request's bookkeeping

    def start(self) -> bool:
        """Wait, watched through the plan, then check (a change between the check and the watch is not missed);
        False: the plan no longer holds."""
        plan = self.plan
        purgatory = plan.purgatory
        plan.waiting = self  # watched through the plan (its partitions, across its requests)
        if not plan.watched:  # plan.watch(purgatory), inline
            plan.watched = True
            purgatory.add(plan)
        self.generation = purgatory.generation
        if purgatory.closing or not plan.holds():
            plan.waiting = None
            return False
        # The deadline on the clock `started` is on (perf_counter): try_complete's time left, without a clock read.
        self.deadline = self.started + plan.max_wait_s
        # DelayedFetch.park, inline (as above).
        self.waiting = True
        self.timer = plan.loop.call_later(plan.max_wait_s, self._expired)
        return True

    def cancel(self) -> None:
        """Not to be answered after all (start() succeeded, the session's bookkeeping did not)."""
        self._stop()

    def try_complete(self) -> Any:
        """A notify on one of the plan's partitions: the general path for what is left of the wait."""
        left_ms = math.ceil((self.deadline - time.perf_counter()) * 1000)
        return self._general(max(0, left_ms))

    def _expired(self) -> None:
        """DelayedFetch._expired for the usual case in one call: the plan's answer at the deadline, with nothing that
        answers for this fetch or that it answers for, and no purgatory of its own to leave; anything else (the
        general path's answer) goes through DelayedFetch's own steps."""
        if not self.waiting:
            return
        plan = self.plan
        if self.outer is None and plan.session is None and plan.purgatory.generation == self.generation:
            self.waiting = False
            self.timer = None
            plan.shard.request_done(FETCH, time.perf_counter() - self.started)
            answer = Response(self.ready)
            conn = self.conn
            if self._future is None and conn is not None and not self.done:
                # Parked.complete's usual case without its call: nothing owed before it, no task waits for it.
                self.done = True
                self.answer = answer
                conn._parked_done(self)
            else:
                self.complete(answer)
            return
        DelayedFetch._expired(self)

    def on_expiration(self) -> Any:
        plan = self.plan
        session = plan.session
        if (plan.purgatory.generation != self.generation and not plan.holds()) or (
            session is not None and session.epoch != self.expected
        ):
            # Something was notified since the wait began (the general path then reads again) and what this answer
            # depends on moved, or another request of the session came meanwhile (INVALID_FETCH_SESSION_EPOCH, as
            # the general path's update_and_generate answers): the general path answers, now.
            return self._general(0)
        return Response(self.ready)

    def _general(self, max_wait_ms: int) -> Any:
        """The general path for what is left of the wait (for a session, in the incremental context this request's
        bookkeeping made): its body, or its own wait (a DelayedFetch answering for this one)."""
        plan = self.plan
        req = self.req
        if self.ctx is None or req is None:
            header, pos = codec.decode_request_header(self.frame)
            self.ctx = RequestContext(plan.server, self.client, header)
            req, _ = codec.decode(FetchRequest, plan.version, self.frame, pos)
        req.max_wait_ms = max_wait_ms
        if plan.session is None:
            return plan.general(self.ctx, req)
        return plan.resume(self.ctx, req, plan.session, self.expected)


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


def direct_path(general: HandlerFn, resume: ResumeFn) -> DirectFn | None:
    """The Fetch handler's direct path over `general` (handle_fetch; `resume`: its incremental Fetch in a context
    already made); None when KBROKER_IDLE_FETCH=0. A plan's own requests are taken before this, by
    KafkaApis.handle (IdleFetch.take); this plans, and answers what take left (a plan's first rotations)."""
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
        try:
            req, _ = codec.decode(FetchRequest, version, frame, pos)
        except codec.DecodeError:
            return NOT_DIRECT  # KafkaApis closes the connection with its message
        conn = ctx.conn
        correlation_id = ctx.header.correlation_id
        entry: IdleFetch | None = conn.idle_fetch
        answer = (
            entry.answer_request(frame, req, correlation_id)
            if entry is not None and entry.version == version
            else None
        )
        for _ in range(2):
            if answer is None:
                entry = _replace_plan(ctx, IdleFetch.plan(ctx, req, frame, pos, general, resume))
                answer = entry.answer_request(frame, req, correlation_id) if entry is not None else None
                if answer is None:
                    break
            assert entry is not None
            result = entry.serve(conn, frame, answer, started, req, ctx)
            if result is not None:
                return result
            answer = None  # the plan no longer holds: planned again from this request
        _replace_plan(ctx, None)
        return general(ctx, req)

    return handle_idle_fetch

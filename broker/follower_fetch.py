"""A follower's incremental Fetch on the leader without the generated response objects, and its long poll without
a task.

Every replication round a leader answers each follower's Fetch: the follower's position moved, so the request
names that partition at its new offset (KIP-227 incremental session), parks until the next append, and is answered
with the new batches. The general path decoded the request into a FetchRequest with its topic and partition objects,
ran the long poll as a coroutine awaited by KafkaApis' own coroutine (a FetchWaiter with its future, a task wake-up
per step), built a FetchResponse with a topic object per answer and had the generated encoder walk it: about a third
of the leader's CPU per round was the two Fetch requests (docs/performance.md).

Here (`follower_fetch`) a follower's Fetch v12 (replica id set, read_uncommitted, an existing session at epoch > 0)
goes from its decoded request to its answer without those steps, and the general path's own pieces run unchanged in
between: the fetch manager's context (the session's epoch, its partitions updated and forgotten), `_FetchPlan.read`
(each partition read, the follower's position and the high watermark recorded through
ReplicaManager.record_follower_fetch: ISR expansion, high watermark advance, the purgatories notified; the quiet
partitions left unread), and `update_and_generate`. The wait is `_FollowerPoll`, the purgatory's waiter itself,
with one timer, answering through a network.Parked; it follows `_long_poll` step for step (watch, read again only if
something was notified since, re-read on a wake-up, answer at the deadline). The answer is written by
replica_fetch_codec.encode_fetch_answer (header, per-partition fields, the segment's file region spliced in by the
sender, not copied). The request itself is decoded by the generated decoder: compiled, it takes ~2.5 us for a
follower's request and its objects are the session's entries as they are, where reading the same fields in Python
took 6-7 us (and the objects would still be made for the session).

Anything else is the general path's: another version, a consumer, a new or closing session, a session error (once
the context is made: serve_fetch), any partition answering an error or a diverging epoch (the general response,
handlers/fetch.response_of, encoded as KafkaApis does). KBROKER_FOLLOWER_FETCH_DIRECT=0 turns the path off;
tests/coordinator/test_replication_paths.py runs a cluster of both kinds.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import time
from typing import Any

from kbroker.broker import metrics
from kbroker.broker.apis import NOT_DIRECT, DirectFn, HandlerFn, KafkaApis, RequestContext
from kbroker.broker.fetch_session import INVALID_SESSION_ID, IncrementalFetchContext, session_id_has_no_shard
from kbroker.broker.handlers.fetch import (
    _UNSET,
    _fetch_data,
    _FetchPlan,
    _forgotten,
    _respond,
    response_of,
    serve_fetch,
)
from kbroker.broker.network import Parked, Response
from kbroker.broker.purgatory import LOG_END
from kbroker.broker.replica_fetch_codec import FETCH_VERSION, encode_fetch_answer
from kbroker.protocol import codec
from kbroker.protocol.messages import FetchRequest

ENABLED = os.environ.get("KBROKER_FOLLOWER_FETCH_DIRECT", "1") != "0"
_I32 = struct.Struct(">i")
_NO_NAMES: dict[bytes, str] = {}  # Fetch v12 names its topics: no topic ids to resolve
_NO_DIVERGING = _UNSET["diverging_epoch"]
_NO_LEADER = _UNSET["current_leader"]
_NO_SNAPSHOT = _UNSET["snapshot_id"]


def direct_path(general: HandlerFn, idle: DirectFn | None) -> DirectFn | None:
    """The Fetch handler's direct path: a follower's incremental fetch here, else `idle` (a consumer's idle long
    poll, broker/idle_fetch.py), if any."""
    if not ENABLED:
        return idle

    def handle_fetch_direct(ctx: RequestContext, frame: bytes | bytearray, pos: int) -> Any:
        if ctx.api_version == FETCH_VERSION:
            result = follower_fetch(ctx, frame, pos, general)
            if result is not NOT_DIRECT:
                return result
        return NOT_DIRECT if idle is None else idle(ctx, frame, pos)

    return handle_fetch_direct


def follower_fetch(ctx: RequestContext, frame: bytes | bytearray, pos: int, general: HandlerFn) -> Any:
    """A follower's Fetch v12: its Response, a Parked answer, a general body or coroutine (handle_fetch's: not an
    incremental fetch, a session error, an error in a partition), or NOT_DIRECT for a consumer's (nothing read)."""
    if len(frame) - pos < 4 or _I32.unpack_from(frame, pos)[0] < 0:
        return NOT_DIRECT  # a consumer's (replica_id -1): the idle long poll's path, which may not decode it at all
    try:
        # The generated decoder, compiled: cheaper than reading these fields in Python (see the module doc).
        req, _ = codec.decode(FetchRequest, FETCH_VERSION, frame, pos)
    except codec.DecodeError:
        return NOT_DIRECT  # KafkaApis closes the connection with its message
    session_id, epoch = req.session_id, req.session_epoch
    if (
        req.isolation_level != 0
        or session_id == INVALID_SESSION_ID
        or epoch <= 0
        or session_id_has_no_shard(session_id)
    ):
        return general(ctx, req)
    started = time.perf_counter()
    context = ctx.server.fetch_manager.new_context(
        FETCH_VERSION,
        session_id,
        epoch,
        True,
        _fetch_data(req, False, _NO_NAMES),
        _forgotten(req, False),
        _NO_NAMES,
    )
    if type(context) is not IncrementalFetchContext:
        # The session is unknown, at another epoch, or was emptied by this request: the general path from here.
        return serve_fetch(ctx, req, context, False, req.replica_id)
    plan = _FetchPlan(ctx, req, context.partitions(), False, req.replica_id, context.session)
    return _FollowerPoll(ctx, plan, context, started, req.max_wait_ms, req.min_bytes).first()


class _FollowerPoll:
    """One follower Fetch from its first read to its answer: handle_fetch's read and _long_poll's loop, with this
    object as the purgatory's waiter (wake, keys, wants) and one timer instead of a coroutine and a future."""

    __slots__ = (
        "ctx",
        "plan",
        "context",
        "started",
        "max_wait_ms",
        "min_bytes",
        "purgatory",
        "keys",
        "wants",
        "loop",
        "thread_id",
        "deadline",
        "read",
        "generation",
        "timer",
        "waiting",
        "parked",
    )

    def __init__(
        self,
        ctx: RequestContext,
        plan: _FetchPlan,
        context: IncrementalFetchContext,
        started: float,
        max_wait_ms: int,
        min_bytes: int,
    ) -> None:
        self.ctx = ctx
        self.plan = plan
        self.context = context
        self.started = started
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.purgatory = ctx.server.replica_manager.purgatory
        self.keys: list[tuple[str, int]] = []
        self.wants = LOG_END  # a follower copies up to the log end
        self.deadline = 0.0
        self.read: tuple[list[Any], int, bool] = ([], 0, False)
        self.generation = 0
        self.timer: asyncio.TimerHandle | None = None
        self.waiting = False

    def first(self) -> Any:
        """The answer now (a Response or a general body), or the Parked answer of the wait."""
        plan = self.plan
        self.generation = self.purgatory.generation
        self.read = plan.read()
        _, nbytes, has_error = self.read
        # plan.has_keys(): a session of Fetch v12 names its topics, so any partition is one to watch.
        if nbytes >= self.min_bytes or self.max_wait_ms <= 0 or has_error or not plan.parts:
            return self._answer()
        self.keys = plan.keys()
        self.loop = asyncio.get_running_loop()
        self.thread_id = threading.get_ident()
        self.deadline = time.monotonic() + self.max_wait_ms / 1000.0
        answer = self._poll()
        if answer is not None:
            return answer
        self.parked = Parked()
        return self.parked

    def _poll(self) -> Any:
        """_long_poll's loop head: watch (while time is left), read again if something was notified since the last
        read, then answer or wait (None)."""
        purgatory = self.purgatory
        watching = time.monotonic() < self.deadline
        if watching:
            purgatory.add(self)
        if purgatory.generation != self.generation:
            self.generation = purgatory.generation
            self.read = self.plan.read()
        _, nbytes, has_error = self.read
        left = self.deadline - time.monotonic()
        if not watching or nbytes >= self.min_bytes or has_error or left <= 0 or purgatory.closing:
            if watching:
                purgatory.unwatch(self)
            return self._answer()
        self.waiting = True
        self.timer = self.loop.call_later(left, self._expire)
        return None

    def wake(self) -> None:
        """The purgatory's notify (from any thread): handled on this loop, as a waiter's future would be."""
        if threading.get_ident() == self.thread_id:
            self.loop.call_soon(self._woken)
        else:
            self.loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        if not self.waiting:
            return  # answered, or already woken by another of its partitions
        self.waiting = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.purgatory.unwatch(self)
        self._step(self._after_wake)

    def _after_wake(self) -> Any:
        # Woken by a change: read before watching again (a notify after this read began moves the generation).
        purgatory = self.purgatory
        self.generation = purgatory.generation
        self.read = self.plan.read()
        _, nbytes, has_error = self.read
        if nbytes >= self.min_bytes or has_error or purgatory.closing:
            return self._answer()
        return self._poll()

    def _expire(self) -> None:
        if not self.waiting:
            return
        self.waiting = False
        self.timer = None
        self.purgatory.unwatch(self)
        self.deadline = 0.0  # the wait is over: the loop head answers without watching again
        self._step(self._poll)

    def _step(self, step: Any) -> None:
        try:
            answer = step()
        except Exception as e:  # noqa: BLE001 - the connection closes, as when the general path's coroutine raises
            self.parked.complete(e)
            return
        if answer is None:
            return
        shard = metrics.shard()
        if type(answer) is not Response:
            # A general body (an error somewhere): encoded and its failed partitions counted, as KafkaApis does.
            try:
                response = KafkaApis.encode(self.ctx.header, answer)
            except Exception as e:  # noqa: BLE001
                self.parked.complete(e)
                return
            shard.answered(1, answer)
            answer = response
        shard.request_done(1, time.perf_counter() - self.started)
        self.parked.complete(answer)

    def _answer(self) -> Any:
        """The answer to what was read last: encoded here when every partition it sends is plain data, else the
        general response."""
        results, nbytes, has_error = self.read
        ctx, plan = self.ctx, self.plan
        if has_error:
            return _respond(ctx, plan, self.context, results, nbytes, has_error)
        error, session_id, selected = self.context.update_and_generate(results)
        topics: list[tuple[str, list[tuple[int, int, int, int, Any]]]] = []
        last: str | None = None
        for cp, pd in selected:
            if (
                cp.topic is None
                or pd.diverging_epoch is not _NO_DIVERGING
                or pd.current_leader is not _NO_LEADER
                or pd.snapshot_id is not _NO_SNAPSHOT
                or pd.preferred_read_replica != -1
                or pd.aborted_transactions != []
                or pd.error_code
            ):
                return response_of(ctx, plan, error, session_id, selected, nbytes, has_error)
            if cp.topic != last:
                last = cp.topic
                topics.append((last, []))
            topics[-1][1].append(
                (
                    pd.partition_index,
                    pd.high_watermark,
                    pd.last_stable_offset,
                    pd.log_start_offset,
                    pd.records,
                )
            )
        if error:
            return response_of(ctx, plan, error, session_id, selected, nbytes, has_error)
        frame, ext = encode_fetch_answer(ctx.header.correlation_id, session_id, topics)
        return Response(frame, ext or None)

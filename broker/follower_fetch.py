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
partitions left unread), and `update_and_generate`. The wait is handle_fetch's own (`_FollowerPoll`, a
`_LongPoll`: a delayed_fetch.DelayedFetch, the purgatory's waiter itself with one timer, answering through a
network.Parked). The answer is written by replica_fetch_codec.encode_fetch_answer (header, per-partition fields,
the segment's file region spliced in by the sender, not copied). The request itself is decoded by the generated decoder: compiled, it takes ~2.5 us for a
follower's request and its objects are the session's entries as they are, where reading the same fields in Python
took 6-7 us (and the objects would still be made for the session).

Anything else is the general path's: another version, a consumer, a new or closing session, a session error (once
the context is made: serve_fetch), any partition answering an error or a diverging epoch (the general response,
handlers/fetch.response_of, encoded as KafkaApis does). KBROKER_FOLLOWER_FETCH_DIRECT=0 turns the path off;
tests/coordinator/test_replication_paths.py runs a cluster of both kinds.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

from kbroker.broker.apis import NOT_DIRECT, DirectFn, HandlerFn, RequestContext
from kbroker.broker.fetch_session import INVALID_SESSION_ID, IncrementalFetchContext, session_id_has_no_shard
from kbroker.broker.handlers.fetch import (
    _UNSET,
    _fetch_data,
    _FetchPlan,
    _forgotten,
    _LongPoll,
    _respond,
    response_of,
    serve_fetch,
)
from kbroker.broker.network import Response
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
    """A follower's Fetch v12: its Response, a Parked answer, a general body or parked wait (handle_fetch's: not an
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
        return serve_fetch(ctx, req, context, False, req.replica_id, started)
    plan = _FetchPlan(ctx, req, context.partitions(), False, req.replica_id, context.session)
    return _FollowerPoll(ctx, plan, context, req.max_wait_ms, req.min_bytes, started).serve()


class _FollowerPoll(_LongPoll):
    """One follower Fetch from its first read to its answer: handle_fetch's read and wait (a _LongPoll, a
    delayed_fetch.DelayedFetch: the purgatory's waiter itself, one timer, no coroutine or future), answered by
    `respond` below."""

    __slots__ = ()

    def respond(self) -> Any:
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

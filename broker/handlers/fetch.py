"""Fetch (key 1), ListOffsets (key 2) and OffsetForLeaderEpoch (key 23)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kbroker.broker import idle_fetch, metrics
from kbroker.broker.apis import ApiHandler, DirectFn, RequestContext
from kbroker.broker.delayed_fetch import DelayedFetch
from kbroker.broker.down_conversion import check_down_conversion, down_convert_fetched, legacy_fetch_magic
from kbroker.broker.fetch_session import (
    INVALID_SESSION_ID,
    NOT_QUIET,
    CachedPartition,
    FetchContext,
    FetchSession,
    FollowerQuiet,
    IncrementalFetchContext,
    PartitionKey,
    SessionErrorContext,
    SessionlessFetchContext,
    not_quiet,
    quiet_holds,
    session_id_has_no_shard,
)
from kbroker.broker.leader_hints import FETCH_VERSION as HINTS_VERSION
from kbroker.broker.leader_hints import LeaderHints
from kbroker.broker.purgatory import HIGH_WATERMARK, LOG_END
from kbroker.broker.replica_manager import LEADER_EPOCH, error_of
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kbroker.storage.legacy_offsets import legacy_offsets_before

log = logging.getLogger("kbroker.fetch")

INT32_MAX = 2**31 - 1
PartitionData = FetchResponse.PartitionData
AbortedTransaction = FetchResponse.AbortedTransaction
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


# Response bytes per partition besides its records (the fixed PartitionData fields, a topic entry, tagged
# fields), with room to spare: the records budget leaves this much per partition under the 32-bit frame size.
_PARTITION_OVERHEAD = 128
_RESPONSE_OVERHEAD = 4096


_NONE_DENIED: frozenset[str] = frozenset()

# A PartitionData's three tagged structs at their defaults: the encoders' own instances (codec.tagged_default),
# which they recognise by identity. The generated constructor would build three objects for every partition of every
# Fetch, and the encoder compare each with the dataclass's __eq__. Never edited in place: a partition that diverges
# or names its leader is given its own.
_UNSET = {"diverging_epoch": codec.tagged_default(FetchResponse.EpochEndOffset),
          "current_leader": codec.tagged_default(FetchResponse.LeaderIdAndEpoch),
          "snapshot_id": codec.tagged_default(FetchResponse.SnapshotId)}


# How often a follower is marked caught up on its session's quiet partitions (their ISR clock): far below
# replica.lag.time.max.ms, and not on every fetch.
QUIET_TOUCH_MS = 50


class _FetchPlan:
    """The partitions one Fetch reads (the request's, or all of its session's for an incremental fetch), with
    what the principal may read."""

    def __init__(self, ctx: RequestContext, req: FetchRequest, parts: list[CachedPartition], by_id: bool,
                 replica_id: int, follower_session: FetchSession | None = None) -> None:
        self.ctx = ctx
        self.req = req
        self.parts = parts
        self.by_id = by_id
        # A follower broker replicating (Kafka's replica id); consumers send -1.
        self.replica_id = replica_id
        # A follower's incremental fetch in this session: it answers only the partitions that changed, so a quiet one
        # need not be read at all.
        self.follower_session = follower_session
        # Topics this principal may not read (Kafka answers their partitions TOPIC_AUTHORIZATION_FAILED).
        self.denied: frozenset[str] | set[str] = _NONE_DENIED
        if ctx.server.authorizer is not None:
            names = {cp.topic for cp in parts if cp.topic is not None}
            if self.replica_id >= 0:
                # A follower's fetch: ClusterAction on the cluster, or nothing at all.
                if not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER):
                    self.denied = names
            else:
                self.denied = names - ctx.authorized_names(AclOperation.READ, ResourceType.TOPIC, names)

    def any_to_read(self) -> bool:
        """Whether a partition passes Kafka's checks before the read (topic id known, topic readable, partition in
        the metadata): Kafka's `interesting` partitions, the only ones that reach ReplicaManager.fetchMessages."""
        server = self.ctx.server
        return any(cp.topic is not None and cp.topic not in self.denied
                   and server.topic_partition_exists(cp.topic, cp.partition) for cp in self.parts)

    def unnamed_partition_not_last(self) -> bool:
        """Kafka 3.9 builds a v13+ response in one pass comparing each partition's topic name with the previous
        one's (FetchResponse.toMessage): a partition of an unknown topic id (no name) followed by any other throws
        a NullPointerException, and the whole request fails. Its response lists the partitions read first, then
        those refused before the read: a consumer's unknown topic ids first, the rest in the request's order."""
        if len(self.parts) < 2 or all(cp.topic is not None for cp in self.parts):
            return False
        server = self.ctx.server
        refused = [cp for cp in self.parts if cp.topic is None or cp.topic in self.denied
                   or not server.topic_partition_exists(cp.topic, cp.partition)]
        if self.replica_id < 0:
            refused.sort(key=lambda cp: cp.topic is not None)  # stable: request order within each kind
        return any(cp.topic is None for cp in refused[:-1])

    def keys(self) -> list[tuple[str, int]]:
        """What a long poll watches: every partition read, so data on any partition of a session wakes it."""
        return [(cp.topic, cp.partition) for cp in self.parts if cp.topic is not None]

    def has_keys(self) -> bool:
        return any(cp.topic is not None for cp in self.parts)

    def read(self) -> tuple[list[tuple[CachedPartition, PartitionData]], int, bool]:
        """Read every partition now; returns ((partition, data) pairs, bytes read, whether any partition has an error)."""
        rm = self.ctx.server.replica_manager
        req = self.req
        # The client's max_bytes, and never past what a response frame (a 32-bit size) can carry.
        frame_budget = INT32_MAX - _RESPONSE_OVERHEAD - _PARTITION_OVERHEAD * len(self.parts)
        remaining = min(req.max_bytes, frame_budget)
        min_one = True
        total = 0
        has_error = False
        committed_only = req.isolation_level == READ_COMMITTED
        # Fetch v0-v3 consumers read message sets of magic 0 (v0-v1) or 1 (v2-v3): the log's batches are converted.
        version = self.ctx.api_version
        legacy_magic = legacy_fetch_magic(version) if self.replica_id < 0 else None
        denied = self.denied
        # Topic ids of session partitions whose names were resolved earlier: a topic since recreated under the
        # same name has another id (Kafka's INCONSISTENT_TOPIC_ID).
        topics = self.ctx.server.metadata.topics if self.by_id else None
        parts = self.parts
        # Quiet partitions are left out unread; not when a partition may have to answer an error (a topic the principal
        # may no longer read, a topic id recreated under its name).
        if self.follower_session is not None and not denied and topics is None:
            now_ms = int(time.time() * 1000)
            if now_ms - self.follower_session.quiet_touched_ms >= QUIET_TOUCH_MS:
                parts = self._touch_quiet(now_ms)
            else:
                parts = not_quiet(parts)
        out = []
        for cp in parts:
            name = cp.topic
            p = cp.req
            if name is None:
                out.append((cp, _error(cp.partition, ErrorCode.UNKNOWN_TOPIC_ID)))
                has_error = True
                continue
            if denied and name in denied:
                out.append((cp, _error(cp.partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED)))
                has_error = True
                continue
            try:
                if topics is not None:
                    rec = topics.get(name)
                    if rec is not None and rec.topic_id != cp.topic_id:
                        raise KafkaError(ErrorCode.INCONSISTENT_TOPIC_ID)
                if self.replica_id >= 0:
                    part, size = self._follower_read(cp, name, p, remaining if remaining > 0 or min_one else 0)
                    out.append((cp, part))
                    if size:
                        remaining -= size
                        total += size
                        min_one = False
                    continue
                # KIP-392: from v11 a consumer may read a follower too, up to the follower's high watermark (Kafka's
                # FetchParams.fetchOnlyLeader is false once the request carries client metadata).
                lg = rm.get_log(name, p.partition, p.current_leader_epoch, leader_only=version < 11)
                if version < 10:  # every Fetch that may convert is below v10 too
                    check_down_conversion(lg.config, version)
                hw = lg.high_watermark
                lso = lg.last_stable_offset
                log_start = lg.log_start_offset
                fetch_offset = p.fetch_offset
                records: Any = b""
                aborted: list[Any] | None = [] if committed_only else None  # Kafka: null unless read_committed
                # A consumer already at the end of what it may read (an idle partition, most of a long poll's
                # partitions) is answered without a read; an offset out of range still goes to the read, which raises.
                caught_up = (lso if committed_only else hw) <= fetch_offset <= lg.log_end_offset and fetch_offset >= log_start
                if not caught_up and (remaining > 0 or min_one):
                    budget = max(0, min(p.partition_max_bytes, remaining))
                    info = lg.read(fetch_offset, budget, max_offset=hw,
                                   min_one_message=min_one or legacy_magic is not None,
                                   isolation_committed=committed_only)
                    if info.records is not None and info.records.size > 0:
                        records = info.records
                        size = records.size
                        if legacy_magic is not None:
                            records = down_convert_fetched(records, legacy_magic, p.fetch_offset, budget,
                                                           whole_first=min_one and version >= 3,
                                                           config=lg.config)
                            size = len(records)
                        remaining -= size
                        total += size
                        min_one = False
                        if committed_only and info.aborted_transactions:
                            aborted = [AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                                       for a in info.aborted_transactions]
                out.append((cp, PartitionData(
                    partition_index=p.partition,
                    error_code=0,
                    high_watermark=hw,
                    last_stable_offset=lso,
                    log_start_offset=log_start,
                    aborted_transactions=aborted,
                    preferred_read_replica=-1,
                    records=records,
                    **_UNSET,
                )))
            except Exception as e:  # noqa: BLE001 - each partition answers with its own error code
                code = error_of(e)
                if code == ErrorCode.UNKNOWN_SERVER_ERROR:
                    log.exception("Fetch from %s-%d failed", name, p.partition)
                out.append((cp, _error(p.partition, code)))
                has_error = True
        if has_error:
            out = self._refused_last(out)
        return out, total, has_error

    def _refused_last(self, out: list[tuple[CachedPartition, PartitionData]]
                      ) -> list[tuple[CachedPartition, PartitionData]]:
        """Kafka's order: the partitions that reached the read first, then those refused before it (unknown topic
        id, not authorized, not in the metadata; a consumer's unknown topic ids ahead of the rest), each in the
        request's order. Consecutive partitions of a topic share a topic entry, so this shows in the response."""
        server = self.ctx.server
        read, refused = [], []
        for item in out:
            cp = item[0]
            if cp.topic is None or cp.topic in self.denied or not server.topic_partition_exists(cp.topic, cp.partition):
                refused.append(item)
            else:
                read.append(item)
        if self.replica_id < 0:
            refused.sort(key=lambda item: item[0].topic is not None)  # stable: request order within each kind
        return read + refused

    def _touch_quiet(self, now_ms: int) -> list[CachedPartition]:
        """not_quiet, and the follower marked caught up on the quiet partitions (as a read at the log end would: this
        keeps it in the ISR), for the whole session at most every QUIET_TOUCH_MS. A partition that cannot be marked
        so (the follower outside the ISR, an ISR change pending) is read in full."""
        session = self.follower_session
        assert session is not None
        session.quiet_touched_ms = now_ms
        out = []
        for cp in self.parts:
            if not quiet_holds(cp) or not cp.follower_quiet.partition.touch_caught_up_follower(
                    self.replica_id, cp.req.fetch_offset, now_ms):
                out.append(cp)
        return out

    def _follower_read(self, cp: CachedPartition, name: str, p: FetchRequest.FetchPartition,
                       budget: int) -> tuple[PartitionData, int]:
        """A follower's fetch: up to the log end, its position recorded (Kafka's Partition.fetchRecords for a
        replica); a last fetched epoch the leader's log does not agree with gets the diverging epoch."""
        rm = self.ctx.server.replica_manager
        cp.follower_quiet = NOT_QUIET
        part = rm.get_partition(name, p.partition)
        if part is None:
            # Kafka answers a follower's partition the metadata does not know before any read.
            exists = self.ctx.server.topic_partition_exists(name, p.partition)
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER if exists else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        # The epoch first, as Kafka's localLogWithEpochOrThrow: a new leader that has not applied its LeaderAndIsr
        # yet answers a follower already told of it UNKNOWN_LEADER_EPOCH, which it retries at once.
        leader_epoch = part.leader_epoch
        part.check_leader_epoch(p.current_leader_epoch)
        lg = part.leader_log()
        if p.last_fetched_epoch >= 0:
            epoch, end = lg.end_offset_for_epoch(p.last_fetched_epoch)
            if epoch < p.last_fetched_epoch or end < p.fetch_offset:
                return PartitionData(partition_index=p.partition, error_code=0, high_watermark=lg.high_watermark,
                                     last_stable_offset=lg.last_stable_offset, log_start_offset=lg.log_start_offset,
                                     diverging_epoch=FetchResponse.EpochEndOffset(epoch=epoch, end_offset=end),
                                     preferred_read_replica=-1, records=b""), 0
        leo = lg.log_end_offset
        records: Any = b""
        size = 0
        # A follower at the log end (its fetch on arrival, each replication round) has nothing to read: the read is
        # left out (an append racing this has notified, so a long poll reads again).
        if budget > 0 and p.fetch_offset != leo:
            info = lg.read(p.fetch_offset, max(0, min(p.partition_max_bytes, budget)), min_one_message=True)
            if info.records is not None and info.records.size > 0:
                records, size = info.records, info.records.size
        rm.record_follower_fetch(part, self.replica_id, p.fetch_offset, leo)
        # Taken after the fetch moved the high watermark; a change after it shows in the next check (not_quiet).
        state = lg.fetch_state
        hw, log_start = state[1], state[2]
        lso = lg.last_stable_offset
        if p.fetch_offset == state[0]:
            cp.follower_quiet = FollowerQuiet(part, (p, state, leader_epoch, hw, log_start, lso))
        return PartitionData(partition_index=p.partition, error_code=0, high_watermark=hw, last_stable_offset=lso,
                             log_start_offset=log_start, preferred_read_replica=-1, records=records, **_UNSET), size


def _replica_id(ctx: RequestContext, req: FetchRequest) -> int:
    if ctx.api_version >= 15:
        return req.replica_state.replica_id if req.replica_state is not None else -1
    return req.replica_id


# Refused before any log is read (Kafka's KafkaApis: FetchResponse.partitionResponse) the aborted transactions are an
# empty array; refused by the read itself (ReplicaManager: out of range, not leader, fenced epoch...) they are null.
_REFUSED_BEFORE_READ = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID,
                                  ErrorCode.TOPIC_AUTHORIZATION_FAILED})


def _error(partition: int, code: ErrorCode) -> PartitionData:
    return PartitionData(partition_index=partition, error_code=code, high_watermark=-1, last_stable_offset=-1,
                         log_start_offset=-1, records=b"",
                         aborted_transactions=[] if code in _REFUSED_BEFORE_READ else None)


def _fetch_data(req: FetchRequest, by_id: bool, topic_names: dict[bytes, str]) -> dict[PartitionKey, CachedPartition]:
    """The request's partitions by topic-partition (Kafka's fetchData, a LinkedHashMap): a partition named twice is
    read once, at its first position, with the last of its requests. From v13 topics come as ids."""
    data: dict[PartitionKey, CachedPartition] = {}
    for t in req.topics:
        tid = t.topic_id
        name = topic_names.get(tid) if by_id else t.topic
        for p in t.partitions:
            data[(tid if by_id else name, p.partition)] = CachedPartition(name, tid, p.partition, p)
    return data


def _forgotten(req: FetchRequest, by_id: bool) -> list[PartitionKey]:
    return [(t.topic_id if by_id else t.topic, p) for t in req.forgotten_topics_data for p in t.partitions]


def handle_fetch(ctx: RequestContext, req: FetchRequest) -> Any:
    started = time.perf_counter()
    by_id = ctx.api_version >= 13
    topic_names = ctx.server.topic_names_by_id() if by_id else {}
    fetch_data = _fetch_data(req, by_id, topic_names)
    replica_id = _replica_id(ctx, req)
    context: FetchContext
    if ctx.api_version >= 7:
        if req.session_id != INVALID_SESSION_ID and session_id_has_no_shard(req.session_id):
            return _whole_request_error(ctx, req)
        context = ctx.server.fetch_manager.new_context(ctx.api_version, req.session_id, req.session_epoch,
                                                       replica_id >= 0, fetch_data, _forgotten(req, by_id),
                                                       topic_names)
    else:
        context = SessionlessFetchContext(fetch_data)
    return serve_fetch(ctx, req, context, by_id, replica_id, started)


def resume_incremental(ctx: RequestContext, req: FetchRequest, session: FetchSession, epoch: int) -> Any:
    """A consumer's incremental Fetch naming no partition whose session bookkeeping (new_context: the epoch checked
    and moved on to `epoch`, the session touched) broker/idle_fetch.py made: the rest of handle_fetch, when it
    cannot answer it from its plan (a partition moved)."""
    by_id = ctx.api_version >= 13
    context = IncrementalFetchContext(ctx.server.fetch_manager.cache, session,
                                      ctx.server.topic_names_by_id() if by_id else {})
    context.expected_epoch = epoch
    return serve_fetch(ctx, req, context, by_id, -1, time.perf_counter())


def serve_fetch(ctx: RequestContext, req: FetchRequest, context: FetchContext, by_id: bool, replica_id: int,
                started: float) -> Any:
    """handle_fetch once the request has its context (broker/follower_fetch.py's and broker/idle_fetch.py's way
    back to the general path after they made one): a FetchResponse, or the request parked (_LongPoll), which
    counts itself from `started` when answered."""
    if isinstance(context, SessionErrorContext):
        return FetchResponse(error_code=context.error, session_id=INVALID_SESSION_ID, responses=[])
    plan = _FetchPlan(ctx, req, context.partitions(), by_id, replica_id,
                      context.session if replica_id >= 0 and isinstance(context, IncrementalFetchContext) else None)
    if req.isolation_level not in (0, 1) and plan.any_to_read():
        # Kafka reads the isolation level (IsolationLevel.forId, which throws) only when a partition is to be read:
        # the whole request is answered UNKNOWN_SERVER_ERROR (FetchRequest.getErrorResponse).
        return _whole_request_error(ctx, req)
    if by_id and not isinstance(context, IncrementalFetchContext) and plan.unnamed_partition_not_last():
        return _whole_request_error(ctx, req)
    return _LongPoll(ctx, plan, context, req.max_wait_ms, req.min_bytes, started).serve()


def _whole_request_error(ctx: RequestContext, req: FetchRequest) -> FetchResponse:
    """What Kafka answers when its handler throws (FetchRequest.getErrorResponse): UNKNOWN_SERVER_ERROR at the top
    (v7+) and, before v13, in every partition the request names, as named."""
    code = ErrorCode.UNKNOWN_SERVER_ERROR
    responses = [] if ctx.api_version >= 13 else [
        FetchResponse.FetchableTopicResponse(topic=t.topic, topic_id=t.topic_id, partitions=[
            PartitionData(partition_index=p.partition, error_code=code, high_watermark=-1, last_stable_offset=-1,
                          log_start_offset=-1, records=None, aborted_transactions=[])
            for p in t.partitions])
        for t in req.topics]
    return FetchResponse(throttle_time_ms=0, error_code=code, session_id=req.session_id, responses=responses)


def _respond(ctx: RequestContext, plan: _FetchPlan, context: FetchContext,
             results: list[tuple[CachedPartition, PartitionData]], nbytes: int, has_error: bool) -> FetchResponse:
    """The response: empty with throttle_time_ms for a client over its quota (consumer_byte_rate, as Kafka; no
    client quota applies to followers' replication), else what the context picks (and, for a session, remembers)."""
    replica = plan.replica_id >= 0
    if not replica:
        quota = ctx.server.fetch_quota
        throttle = quota.record_and_get_throttle_ms(ctx.client_id, nbytes)
        if throttle > 0:
            quota.unrecord(ctx.client_id, nbytes)
            ctx.conn.mute_for(throttle)
            error, session_id = context.throttled()
            return FetchResponse(throttle_time_ms=throttle, error_code=error, session_id=session_id, responses=[])
    error, session_id, selected = context.update_and_generate(results)
    return response_of(ctx, plan, error, session_id, selected, nbytes, has_error)


def response_of(ctx: RequestContext, plan: _FetchPlan, error: int, session_id: int,
                selected: list[tuple[CachedPartition, PartitionData]], nbytes: int, has_error: bool) -> FetchResponse:
    """The response of what update_and_generate selected."""
    replica = plan.replica_id >= 0
    responses: list[FetchResponse.FetchableTopicResponse] = []
    # Consecutive partitions of one topic share a topic entry, as in Kafka's FetchResponse.of.
    by_id = plan.by_id
    last_key: Any = object()
    for cp, pd in selected:
        key = cp.topic_id if by_id else cp.topic
        if key != last_key:
            responses.append(FetchResponse.FetchableTopicResponse(topic=cp.topic or "", topic_id=cp.topic_id,
                                                                  partitions=[]))
            last_key = key
        responses[-1].partitions.append(pd)
    response = FetchResponse(throttle_time_ms=0, error_code=error, session_id=session_id, responses=responses)
    if has_error and ctx.api_version >= HINTS_VERSION:
        _name_leaders(ctx, response, selected)
    if nbytes and not replica:
        metrics.shard().fetched(response)
    return response


def _name_leaders(ctx: RequestContext, response: FetchResponse,
                  selected: list[tuple[CachedPartition, PartitionData]]) -> None:
    """KIP-951 (v16+): partitions answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH carry their current leader
    and epoch, and the response those leaders' endpoints (Kafka's KafkaApis.handleFetchRequest)."""
    hints = LeaderHints(ctx.server, ctx.conn.listener_name)
    for cp, pd in selected:
        if pd.error_code in _LEADER_MOVED and cp.topic is not None:
            pd.current_leader = hints.leader(cp.topic, pd.partition_index, FetchResponse.LeaderIdAndEpoch)
    response.node_endpoints = hints.endpoints(FetchResponse.NodeEndpoint)


_LEADER_MOVED = (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH)


class _LongPoll(DelayedFetch):
    """handle_fetch's wait (Kafka's DelayedFetch over this module's read): parked until a notify on a partition it
    reads (LOG_END for a follower, which copies up to the log end; HIGH_WATERMARK for a consumer, which reads up to
    the high watermark or the last stable offset, which only markers and the high watermark move) brings min_bytes,
    or until max_wait_ms. A callback answers it through the connection (broker/delayed_fetch.py): no coroutine, task
    or future per parked request."""

    __slots__ = ("plan", "context", "min_bytes", "max_wait_ms", "generation", "seen", "read")

    def __init__(self, ctx: RequestContext, plan: _FetchPlan, context: FetchContext, max_wait_ms: int,
                 min_bytes: int, started: float) -> None:
        super().__init__(ctx, started, ctx.conn.loop, 0.0)
        self.purgatory = ctx.server.replica_manager.purgatory
        self.wants = LOG_END if plan.replica_id >= 0 else HIGH_WATERMARK
        self.wake_pending = False
        self.plan = plan
        self.context = context
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes

    def serve(self) -> Any:
        """The first read, then the answer (a body, or a Response of a kind encoding its own) or this fetch, parked."""
        plan = self.plan
        purgatory = self.purgatory
        self.generation = purgatory.generation
        self.seen = self._wanted_generation()
        self.read = plan.read()
        _, nbytes, has_error = self.read
        if nbytes >= self.min_bytes or self.max_wait_ms <= 0 or has_error or not plan.has_keys():
            return self.respond()
        self.keys = plan.keys()
        self.thread_id = threading.get_ident()
        self.deadline = time.monotonic() + self.max_wait_ms / 1000.0
        answer = self.poll()
        return self if answer is None else answer

    def poll(self) -> Any:
        """The wait's head: watch (while time is left), read again if something was notified since the last read,
        then the answer, or None (parked).

        Watch before re-reading, so an append between the read and the wait still wakes it. The last read still
        counts when nothing was notified since it began (appends, high watermarks, markers and leadership changes
        all notify): an idle long poll reads its partitions once, not again after watching and again when its wait
        expires. An expired poll answers without watching again: a change after its check comes after the answer,
        and the client's next Fetch sees it."""
        purgatory = self.purgatory
        watching = time.monotonic() < self.deadline
        if watching:
            purgatory.add(self)
        # Watching, only a notify this fetch would be woken by calls for a new read (a follower's own read moving
        # the high watermark does not); the final answer reads again after any notify (its high watermark current).
        if self._wanted_generation() != self.seen if watching else purgatory.generation != self.generation:
            self.generation = purgatory.generation
            self.seen = self._wanted_generation()
            self.read = self.plan.read()
        _, nbytes, has_error = self.read
        left = self.deadline - time.monotonic()
        if not watching or nbytes >= self.min_bytes or has_error or left <= 0 or purgatory.closing:
            if watching:
                purgatory.unwatch(self)
            return self.respond()
        self.park(left)
        return None

    def try_complete(self) -> Any:
        # Woken by a change: read before watching again. Most wake-ups find what they wait for and answer without a
        # second watch (for a follower, one entry per partition of its session); a notify after this read began
        # moves the generation, so the next watch reads again.
        purgatory = self.purgatory
        self.generation = purgatory.generation
        self.seen = self._wanted_generation()
        self.read = self.plan.read()
        _, nbytes, has_error = self.read
        if nbytes >= self.min_bytes or has_error or purgatory.closing:
            return self.respond()
        return self.poll()

    def _wanted_generation(self) -> int:
        """The purgatory's count of the notifies this fetch's wait is woken by (FetchPurgatory.notify)."""
        purgatory = self.purgatory
        return purgatory.log_end_generation if self.wants == LOG_END else purgatory.hw_generation

    def on_expiration(self) -> Any:
        # The timer's (uvloop's may fire up to 1 ms early): the wait is over. Waiting again for what was left cost a
        # quarter of idle long polls a second watch, timer and wake-up.
        self.deadline = 0.0
        return self.poll()

    def respond(self) -> Any:
        """The answer to what was read last."""
        results, nbytes, has_error = self.read
        return _respond(self.ctx, self.plan, self.context, results, nbytes, has_error)  # type: ignore[arg-type]


# ---------------------------------------------------------------- ListOffsets

EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -3, -4, -5
CONSUMER_REPLICA, DEBUGGING_REPLICA = -1, -2  # Kafka's ListOffsetsRequest.CONSUMER_REPLICA_ID, DEBUGGING_REPLICA_ID
# Kafka's ReplicaManager.timestampMinSupportedVersion: the first ListOffsets version knowing each special timestamp.
# (Kafka 3.9 refuses -1 and -2 in v0 too; kbroker keeps serving them to the 0.8-0.10 clients that send v0.)
TIMESTAMP_MIN_VERSION = {EARLIEST: 0, LATEST: 0, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9}


def handle_list_offsets(ctx: RequestContext, req: ListOffsetsRequest) -> ListOffsetsResponse:
    rm = ctx.server.replica_manager
    v = ctx.api_version
    allowed = (ctx.authorized_names(AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in req.topics))
               if ctx.server.authorizer is not None else None)
    if req.replica_id == -1 and req.isolation_level not in (0, 1) and any(t.partitions for t in req.topics):
        # Kafka reads a consumer's isolation level with IsolationLevel.forId, which throws: the whole request is
        # answered UNKNOWN_SERVER_ERROR (ListOffsetsRequest.getErrorResponse).
        return ListOffsetsResponse(throttle_time_ms=0, topics=[
            ListOffsetsResponse.ListOffsetsTopicResponse(name=t.name, partitions=[
                ListOffsetsResponse.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index, error_code=ErrorCode.UNKNOWN_SERVER_ERROR, offset=-1,
                    timestamp=-1)
                for p in t.partitions])
            for t in req.topics])
    seen: set[tuple[str, int]] = set()
    duplicates = set()
    for t in req.topics:
        for p in t.partitions:
            if (t.name, p.partition_index) in seen:
                duplicates.add((t.name, p.partition_index))
            seen.add((t.name, p.partition_index))
    topics = []
    for t in req.topics:
        if allowed is not None and t.name not in allowed:
            topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=t.name, partitions=[
                ListOffsetsResponse.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    offset=-1, timestamp=-1)
                for p in t.partitions]))
            continue
        parts = []
        topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        for p in t.partitions:
            resp = ListOffsetsResponse.ListOffsetsPartitionResponse(partition_index=p.partition_index)
            parts.append(resp)
            try:
                if (t.name, p.partition_index) in duplicates:  # each time it is named, as Kafka answers
                    raise KafkaError(ErrorCode.INVALID_REQUEST, "partition named more than once")
                if p.timestamp < 0 and TIMESTAMP_MIN_VERSION.get(p.timestamp, 99) > v:
                    raise KafkaError(ErrorCode.UNSUPPORTED_VERSION, f"timestamp {p.timestamp} in version {v}")
                # The debugging replica (-2) may ask a follower (Kafka's fetchOnlyFromLeader is false for it).
                lg = rm.get_log(t.name, p.partition_index, p.current_leader_epoch,
                                leader_only=req.replica_id != DEBUGGING_REPLICA)
                if v == 0:
                    # Offsets of segment starts, as clients of Kafka 0.8-0.10 expect from v0.
                    resp.error_code = 0
                    resp.old_style_offsets = legacy_offsets_before(lg, p.timestamp, p.max_num_offsets,
                                                                   from_consumer=req.replica_id == -1)
                    continue
                ts = p.timestamp
                if ts == LATEST_TIERED:
                    # KIP-1005's last tiered offset: nothing is tiered here, which Kafka 3.9 answers (no error)
                    # with offset, timestamp and leader epoch -1 for a topic without remote storage
                    resp.error_code, resp.offset, resp.timestamp, resp.leader_epoch = 0, -1, -1, -1
                    continue
                if ts == EARLIEST_LOCAL:
                    ts = EARLIEST
                # read_committed consumers see up to the last stable offset (Kafka's lastFetchableOffset).
                if req.replica_id != CONSUMER_REPLICA:
                    # Kafka reads no isolation level but a consumer's: a broker or the debugging replica gets the
                    # whole local log.
                    fetchable = lg.log_end_offset
                elif req.isolation_level == READ_COMMITTED:
                    fetchable = lg.last_stable_offset
                else:
                    fetchable = lg.high_watermark
                if ts == LATEST:
                    found: tuple[int, int] | None = (fetchable, -1)
                else:
                    found = lg.offset_for_timestamp(ts)
                    if found is not None and ts != EARLIEST and found[0] >= fetchable:
                        found = None
                part = rm.partitions.get((t.name, p.partition_index))
                if (req.replica_id == -1 and ts != EARLIEST and (found is None or found[0] >= fetchable)
                        and part is not None and part.high_watermark_lagging):
                    # The new leader's "latest" would move backwards: the client is told to ask again.
                    raise KafkaError(ErrorCode.OFFSET_NOT_AVAILABLE if v >= 5 else ErrorCode.LEADER_NOT_AVAILABLE,
                                     f"the high watermark {lg.high_watermark} of {t.name}-{p.partition_index} is "
                                     f"below the start of its leader epoch")
                offset, timestamp = found if found is not None else (-1, -1)
                resp.error_code = 0
                resp.offset = offset
                resp.timestamp = timestamp
                resp.leader_epoch = rm.leader_epoch(t.name, p.partition_index) if offset >= 0 else -1
                resp.old_style_offsets = [offset] if offset >= 0 else []
            except Exception as e:  # noqa: BLE001
                code = error_of(e)
                if code == ErrorCode.UNKNOWN_SERVER_ERROR:
                    log.exception("ListOffsets on %s-%d failed", t.name, p.partition_index)
                resp.error_code = code
                resp.offset = -1
                resp.timestamp = -1
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


# ---------------------------------------------------------------- OffsetForLeaderEpoch


def handle_offset_for_leader_epoch(ctx: RequestContext, req: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse:
    rm = ctx.server.replica_manager
    R = OffsetForLeaderEpochResponse
    allowed: set[str] | None = None
    if ctx.server.authorizer is not None and not ctx.authorized(
        AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, log_denied=False
    ):
        # Kafka: a broker (CLUSTER_ACTION) sees every topic, anyone else the topics it may describe, whatever
        # replica id the request names.
        allowed = ctx.authorized_names(AclOperation.DESCRIBE, ResourceType.TOPIC, (t.topic for t in req.topics))
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            out = R.EpochEndOffset(partition=p.partition, leader_epoch=-1, end_offset=-1)
            if allowed is not None and t.topic not in allowed:
                out.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                parts.append(out)
                continue
            try:
                lg = rm.get_log(t.topic, p.partition, p.current_leader_epoch)
                if lg.latest_epoch < 0 and rm.get_partition(t.topic, p.partition) is None:
                    # A log written before leader epochs were recorded: all of it is epoch 0's.
                    if 0 <= p.leader_epoch <= LEADER_EPOCH:
                        out.leader_epoch, out.end_offset = LEADER_EPOCH, lg.log_end_offset
                    elif p.leader_epoch < -1:
                        # Older than the one epoch there is: Kafka's LeaderEpochFileCache answers the requested epoch
                        # and the start of the first known one.
                        out.leader_epoch, out.end_offset = p.leader_epoch, lg.log_start_offset
                else:
                    out.leader_epoch, out.end_offset = lg.end_offset_for_epoch(p.leader_epoch)
                out.error_code = 0
            except Exception as e:  # noqa: BLE001
                out.error_code = error_of(e)
            parts.append(out)
        topics.append(R.OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
    return R(throttle_time_ms=0, topics=topics)


def _direct_path() -> DirectFn | None:
    """The Fetch handler's direct paths: a follower's incremental fetch (broker/follower_fetch.py, which builds on
    this module's read and answer, hence imported here), then a consumer's idle long poll."""
    from kbroker.broker import follower_fetch

    return follower_fetch.direct_path(handle_fetch, idle_fetch.direct_path(handle_fetch, resume_incremental))


HANDLERS = [
    ApiHandler(1, 0, 17, handle_fetch, direct=_direct_path()),
    ApiHandler(2, 0, 9, handle_list_offsets),
    ApiHandler(23, 0, 4, handle_offset_for_leader_epoch),
]

"""Fetch (key 1), ListOffsets (key 2) and OffsetForLeaderEpoch (key 23)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from broker import metrics
from broker.apis import ApiHandler, RequestContext
from broker.replica_manager import LEADER_EPOCH, error_of
from broker.security.acls import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)

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


class _FetchPlan:
    """The partitions of one fetch request, resolved to names, each once, in request order.

    Kafka keys a fetch by topic-partition (FetchRequest.fetchData is a LinkedHashMap): a partition named
    twice is answered once, at its first position, for the last of its requests.
    """

    def __init__(self, ctx: RequestContext, req: FetchRequest) -> None:
        self.ctx = ctx
        self.req = req
        self.by_id = ctx.api_version >= 13
        ids = ctx.server.topic_names_by_id() if self.by_id else {}
        chosen: dict[tuple[Any, int], tuple[FetchRequest.FetchTopic, str | None, FetchRequest.FetchPartition]] = {}
        for t in req.topics:
            name = ids.get(t.topic_id) if self.by_id else t.topic
            for p in t.partitions:
                chosen[(t.topic_id if self.by_id else name, p.partition)] = (t, name, p)
        # Consecutive partitions of one topic share a topic entry, as in Kafka's FetchResponse.of.
        self.topics: list[tuple[FetchRequest.FetchTopic, str | None, list[FetchRequest.FetchPartition]]] = []
        last_key: Any = object()
        for (topic_key, _), (t, name, p) in chosen.items():
            if topic_key != last_key:
                self.topics.append((t, name, []))
                last_key = topic_key
            self.topics[-1][2].append(p)
        self.num_partitions = len(chosen)
        # A follower broker replicating (Kafka's replica id); consumers send -1.
        self.replica_id = _replica_id(ctx, req)
        # Topics this principal may not read (Kafka answers their partitions TOPIC_AUTHORIZATION_FAILED).
        self.denied: frozenset[str] | set[str] = _NONE_DENIED
        if ctx.server.authorizer is not None:
            names = {name for _, name, _ in self.topics if name is not None}
            if self.replica_id >= 0:
                # A follower's fetch: ClusterAction on the cluster, or nothing at all.
                if not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER):
                    self.denied = names
            else:
                self.denied = names - ctx.authorized_names(AclOperation.READ, ResourceType.TOPIC, names)

    def keys(self) -> list[tuple[str, int]]:
        return [(name, p.partition) for _, name, parts in self.topics if name is not None for p in parts]

    def read(self) -> tuple[FetchResponse, int, bool]:
        """Read every partition now; returns (response, bytes read, whether any partition has an error)."""
        rm = self.ctx.server.replica_manager
        req = self.req
        # The client's max_bytes, and never past what a response frame (a 32-bit size) can carry.
        frame_budget = INT32_MAX - _RESPONSE_OVERHEAD - _PARTITION_OVERHEAD * self.num_partitions
        remaining = min(req.max_bytes, frame_budget)
        min_one = True
        total = 0
        has_error = False
        committed_only = req.isolation_level == READ_COMMITTED
        denied = self.denied
        responses = []
        for t, name, partitions in self.topics:
            parts = []
            for p in partitions:
                if name is None:
                    parts.append(_error(p.partition, ErrorCode.UNKNOWN_TOPIC_ID))
                    has_error = True
                    continue
                if denied and name in denied:
                    parts.append(_error(p.partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    has_error = True
                    continue
                try:
                    if self.replica_id >= 0:
                        part, size = self._follower_read(name, p, remaining if remaining > 0 or min_one else 0)
                        parts.append(part)
                        if size:
                            remaining -= size
                            total += size
                            min_one = False
                        continue
                    rm.check_leader_epoch(name, p.partition, p.current_leader_epoch)
                    lg = rm.get_log(name, p.partition)
                    hw = lg.high_watermark
                    lso = lg.last_stable_offset
                    records: Any = b""
                    aborted = [] if committed_only else None  # Kafka: null unless read_committed
                    if remaining > 0 or min_one:
                        info = lg.read(p.fetch_offset, max(0, min(p.partition_max_bytes, remaining)),
                                       max_offset=hw, min_one_message=min_one, isolation_committed=committed_only)
                        if info.records is not None and info.records.size > 0:
                            records = info.records
                            remaining -= records.size
                            total += records.size
                            min_one = False
                            if committed_only and info.aborted_transactions:
                                aborted = [AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                                           for a in info.aborted_transactions]
                    parts.append(
                        PartitionData(
                            partition_index=p.partition,
                            error_code=0,
                            high_watermark=hw,
                            last_stable_offset=lso,
                            log_start_offset=lg.log_start_offset,
                            aborted_transactions=aborted,
                            preferred_read_replica=-1,
                            records=records,
                        )
                    )
                except Exception as e:  # noqa: BLE001 - each partition answers with its own error code
                    code = error_of(e)
                    if code == ErrorCode.UNKNOWN_SERVER_ERROR:
                        log.exception("Fetch from %s-%d failed", name, p.partition)
                    parts.append(_error(p.partition, code))
                    has_error = True
            responses.append(FetchResponse.FetchableTopicResponse(topic=name or "", topic_id=t.topic_id, partitions=parts))
        return FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=responses), total, has_error

    def _follower_read(self, name: str, p: FetchRequest.FetchPartition, budget: int) -> tuple[PartitionData, int]:
        """A follower's fetch: up to the log end, its position recorded (Kafka's Partition.fetchRecords for a
        replica); a last fetched epoch the leader's log does not agree with gets the diverging epoch."""
        rm = self.ctx.server.replica_manager
        part = rm.get_partition(name, p.partition)
        if part is None:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        lg = part.leader_log()
        part.check_leader_epoch(p.current_leader_epoch)
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
        if budget > 0:
            info = lg.read(p.fetch_offset, max(0, min(p.partition_max_bytes, budget)), min_one_message=True)
            if info.records is not None and info.records.size > 0:
                records, size = info.records, info.records.size
        rm.record_follower_fetch(part, self.replica_id, p.fetch_offset, leo)
        return PartitionData(partition_index=p.partition, error_code=0, high_watermark=lg.high_watermark,
                             last_stable_offset=lg.last_stable_offset, log_start_offset=lg.log_start_offset,
                             preferred_read_replica=-1, records=records), size


def _replica_id(ctx: RequestContext, req: FetchRequest) -> int:
    if ctx.api_version >= 15:
        return req.replica_state.replica_id if req.replica_state is not None else -1
    return req.replica_id


def _error(partition: int, code: ErrorCode) -> PartitionData:
    return PartitionData(partition_index=partition, error_code=code, high_watermark=-1, last_stable_offset=-1,
                         log_start_offset=-1, records=b"")


def handle_fetch(ctx: RequestContext, req: FetchRequest) -> Any:
    if ctx.api_version >= 7 and req.session_id != 0:
        # Incremental fetch sessions (KIP-227) are not kept: we never hand out a session id, so a
        # client naming one is told it is gone and falls back to full fetch requests.
        return FetchResponse(error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
    plan = _FetchPlan(ctx, req)
    response, nbytes, has_error = plan.read()
    if nbytes >= req.min_bytes or req.max_wait_ms <= 0 or has_error or not plan.keys():
        return _apply_quota(ctx, response, nbytes, plan.replica_id >= 0)
    return _long_poll(ctx, plan, req.max_wait_ms / 1000.0, req.min_bytes)


def _apply_quota(ctx: RequestContext, response: FetchResponse, nbytes: int, replica: bool = False) -> FetchResponse:
    """consumer_byte_rate: a client over its quota gets an empty response with throttle_time_ms (as Kafka).
    Followers' replication is not a client's consumption: no client quota applies to it (Kafka's are separate)."""
    if replica:
        return response
    quota = ctx.server.fetch_quota
    throttle = quota.record_and_get_throttle_ms(ctx.client_id, nbytes)
    if throttle <= 0:
        if nbytes:
            metrics.shard().fetched(response)
        return response
    quota.unrecord(ctx.client_id, nbytes)
    ctx.conn.mute_for(throttle)
    return FetchResponse(throttle_time_ms=throttle, error_code=0, session_id=0, responses=[])


async def _long_poll(ctx: RequestContext, plan: _FetchPlan, max_wait: float, min_bytes: int) -> FetchResponse:
    purgatory = ctx.server.replica_manager.purgatory
    deadline = time.monotonic() + max_wait
    keys = plan.keys()
    while True:
        # Watch before re-reading, so an append between the read and the wait still wakes us.
        waiter = purgatory.watch(keys)
        try:
            response, nbytes, has_error = plan.read()
            left = deadline - time.monotonic()
            if nbytes >= min_bytes or has_error or left <= 0:
                return _apply_quota(ctx, response, nbytes, plan.replica_id >= 0)
            # A plain timer on the waiter's future: cheaper than wait_for(shield()), which makes a task per wait.
            timer = asyncio.get_running_loop().call_later(left, _expire, waiter.future)
            try:
                await waiter.future
            finally:
                timer.cancel()
        finally:
            purgatory.unwatch(waiter)


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


# ---------------------------------------------------------------- ListOffsets

EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -2, -1, -3, -4


def handle_list_offsets(ctx: RequestContext, req: ListOffsetsRequest) -> ListOffsetsResponse:
    rm = ctx.server.replica_manager
    v = ctx.api_version
    allowed = (ctx.authorized_names(AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in req.topics))
               if ctx.server.authorizer is not None else None)
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            resp = ListOffsetsResponse.ListOffsetsPartitionResponse(partition_index=p.partition_index)
            if allowed is not None and t.name not in allowed:
                resp.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                resp.offset = -1
                resp.timestamp = -1
                parts.append(resp)
                continue
            try:
                rm.check_leader_epoch(t.name, p.partition_index, p.current_leader_epoch)
                lg = rm.get_log(t.name, p.partition_index)
                ts = p.timestamp
                if ts == EARLIEST_LOCAL:
                    ts = EARLIEST
                if ts == MAX_TIMESTAMP and v < 7:
                    raise KafkaError(ErrorCode.UNSUPPORTED_VERSION)
                if ts < MAX_TIMESTAMP:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, f"unsupported timestamp {ts}")
                # read_committed consumers see up to the last stable offset (Kafka's lastFetchableOffset).
                if req.replica_id >= 0:
                    fetchable = lg.log_end_offset  # a follower's question: the whole local log
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
            parts.append(resp)
        topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=t.name, partitions=parts))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


# ---------------------------------------------------------------- OffsetForLeaderEpoch


def handle_offset_for_leader_epoch(ctx: RequestContext, req: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse:
    rm = ctx.server.replica_manager
    R = OffsetForLeaderEpochResponse
    allowed: set[str] | None = None
    cluster_denied = False
    if ctx.server.authorizer is not None:
        if ctx.api_version >= 3 and req.replica_id >= 0:
            cluster_denied = not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
        else:
            allowed = ctx.authorized_names(AclOperation.DESCRIBE, ResourceType.TOPIC, (t.topic for t in req.topics))
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            out = R.EpochEndOffset(partition=p.partition, leader_epoch=-1, end_offset=-1)
            if cluster_denied or (allowed is not None and t.topic not in allowed):
                out.error_code = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED if cluster_denied
                                  else ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                parts.append(out)
                continue
            try:
                rm.check_leader_epoch(t.topic, p.partition, p.current_leader_epoch)
                lg = rm.get_log(t.topic, p.partition)
                if lg.latest_epoch < 0 and rm.get_partition(t.topic, p.partition) is None:
                    # A log written before leader epochs were recorded: all of it is epoch 0's.
                    if 0 <= p.leader_epoch <= LEADER_EPOCH:
                        out.leader_epoch, out.end_offset = LEADER_EPOCH, lg.log_end_offset
                else:
                    out.leader_epoch, out.end_offset = lg.end_offset_for_epoch(p.leader_epoch)
                out.error_code = 0
            except Exception as e:  # noqa: BLE001
                out.error_code = error_of(e)
            parts.append(out)
        topics.append(R.OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
    return R(throttle_time_ms=0, topics=topics)


HANDLERS = [
    ApiHandler(1, 4, 17, handle_fetch),
    ApiHandler(2, 0, 8, handle_list_offsets),
    ApiHandler(23, 0, 4, handle_offset_for_leader_epoch),
]

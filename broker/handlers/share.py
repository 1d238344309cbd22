"""KIP-932 share-group APIs: ShareGroupHeartbeat (76) v1, ShareGroupDescribe (77) v1, ShareFetch (78) v1-2 and
ShareAcknowledge (79) v1-2, the versions Kafka 4.2's KafkaShareConsumer sends.

The handlers translate wire structures (topic ids, acknowledgement batches); the state is
broker.share_partition_manager's, on the share loop, reached through `call()`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.handlers.groups import (
    DESCRIBE,
    GROUP,
    GROUP_OPERATIONS,
    READ,
    _client_host,
    _group_denied,
)
from kbroker.broker.share_partition import SharePartition, Undo
from kbroker.broker.share_partition_manager import SharePartitionManager, ShareSession
from kbroker.coordinator.group_coordinator import OFFSETS_TOPIC
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    ShareAcknowledgeRequest,
    ShareAcknowledgeResponse,
    ShareFetchRequest,
    ShareFetchResponse,
    ShareGroupDescribeRequest,
    ShareGroupDescribeResponse,
    ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse,
)

# The share-partition's state is not readable yet (its __share_group_state partition is being created or moved)
_STATE_LOADING = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE)
# (topic id, partition) -> (error code, acknowledge error code, records, acquired ranges)
_Result = dict[tuple[bytes, int], list[Any]]
# (topic id, partition) -> the share-partition a request acknowledged records of, and how to take each batch back
_Applied = dict[tuple[bytes, int], tuple[SharePartition, list[Undo]]]
# ShareFetch v2's ShareAcquireMode (KIP-1206): 0 batch_optimized (v1's behaviour), 1 record_limit
SHARE_ACQUIRE_RECORD_LIMIT = 1


def share_coordinator_error(server: Any, group_id: str) -> ErrorCode | None:
    """Whether this broker coordinates a share group, as Kafka's coordinator runtime answers: on ZooKeeper a
    broker must lead the group's __consumer_offsets partition (its LeaderAndIsr came); one that has not yet heard
    of the topic (just created by another broker's FindCoordinator) or of its leadership answers NOT_COORDINATOR
    and never takes itself for the coordinator; a partition still loading answers COORDINATOR_LOAD_IN_PROGRESS.
    A single node coordinates every group (it makes __consumer_offsets on first use)."""
    gc = server.group_coordinator
    err = gc.coordinator_error(group_id)
    if err is not None or not server.config["zookeeper.connect"]:
        return err
    if server.replica_manager.leads(OFFSETS_TOPIC, gc.offsets_partition(group_id)) is not True:
        return ErrorCode.NOT_COORDINATOR
    return None


async def handle_share_group_heartbeat(
    ctx: RequestContext, req: ShareGroupHeartbeatRequest
) -> ShareGroupHeartbeatResponse:
    R = ShareGroupHeartbeatResponse
    if _group_denied(ctx, READ, req.group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    spm = SharePartitionManager.of(ctx.server)
    client_id, host = ctx.client_id, _client_host(ctx)
    not_here = share_coordinator_error(ctx.server, req.group_id)
    if not_here is not None:
        return R(error_code=not_here, error_message=f"{not_here.name} for group {req.group_id}")

    r = await spm.call(
        spm.heartbeat,
        req.group_id,
        req.member_id,
        req.member_epoch,
        req.rack_id,
        req.subscribed_topic_names,
        client_id,
        host,
    )
    if r.error:
        ctx.refused(r.error, r.message, f"group {req.group_id!r}")
        return R(error_code=r.error, error_message=r.message)
    assignment = None
    if r.assignment is not None:
        assignment = R.Assignment(
            topic_partitions=[
                R.TopicPartitions(topic_id=t, partitions=ps) for t, ps in sorted(r.assignment.items())
            ]
        )
    return R(
        member_id=r.member_id,
        member_epoch=r.member_epoch,
        heartbeat_interval_ms=r.heartbeat_interval_ms,
        assignment=assignment,
    )


async def handle_share_group_describe(
    ctx: RequestContext, req: ShareGroupDescribeRequest
) -> ShareGroupDescribeResponse:
    R = ShareGroupDescribeResponse
    spm = SharePartitionManager.of(ctx.server)
    names = ctx.server.topic_names_by_id()

    async def run() -> list[Any]:
        out = []
        for gid in req.group_ids:
            if _group_denied(ctx, DESCRIBE, gid):
                out.append(R.DescribedGroup(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, group_id=gid))
                continue
            not_here = share_coordinator_error(ctx.server, gid)
            if not_here is not None:
                out.append(R.DescribedGroup(error_code=not_here, group_id=gid))
                continue
            g = spm.coordinator.groups.get(gid)
            if g is None:
                out.append(
                    R.DescribedGroup(
                        error_code=ErrorCode.GROUP_ID_NOT_FOUND,
                        group_id=gid,
                        group_state="Dead",
                        error_message=f"Group {gid} not found.",
                    )
                )
                continue
            ops = -(2**31)
            if req.include_authorized_operations:
                ops = (
                    GROUP_OPERATIONS
                    if ctx.server.authorizer is None
                    else ctx.authorized_operations(GROUP, gid)
                )
            members = [
                R.Member(
                    member_id=m.member_id,
                    rack_id=m.rack_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=sorted(m.subscribed),
                    assignment=R.Assignment(
                        topic_partitions=[
                            R.TopicPartitions(topic_id=t, topic_name=names.get(t, ""), partitions=ps)
                            for t, ps in sorted(m.current.items())
                        ]
                    ),
                )
                for m in g.members.values()
            ]
            out.append(
                R.DescribedGroup(
                    group_id=gid,
                    group_state=g.state,
                    group_epoch=g.group_epoch,
                    assignment_epoch=g.assignment_epoch,
                    assignor_name="simple",
                    members=members,
                    authorized_operations=ops,
                )
            )
        return out

    return R(groups=await spm.call(run))


def _acknowledge(
    ctx: RequestContext,
    spm: SharePartitionManager,
    group_id: str,
    member_id: str,
    topics: list[Any],
    out: _Result,
) -> dict[tuple[bytes, int], SharePartition]:
    """Apply the acknowledgement batches of a ShareFetch or ShareAcknowledge; their codes go into out. Returns
    the share-partitions acknowledged with what takes each batch back, for `_unconfirmed`."""
    applied: _Applied = {}
    names = ctx.server.topic_names_by_id()
    limit = spm.delivery_limit
    lock_ms = spm.lock_ms(group_id)
    for t in topics:
        name = names.get(bytes(t.topic_id))
        for p in t.partitions:
            key = (bytes(t.topic_id), p.partition_index)
            entry = out.setdefault(key, [ErrorCode.NONE, ErrorCode.NONE, [], []])
            if not p.acknowledgement_batches:
                continue
            if name is None:
                entry[1] = ErrorCode.UNKNOWN_TOPIC_ID
                continue
            sp = spm.partitions.get((group_id, name, p.partition_index))
            if sp is not None and not spm.leads(sp):
                # leadership moved since the records were acquired: the new leader owns them now
                del spm.partitions[(group_id, name, p.partition_index)]
                entry[1] = ErrorCode.NOT_LEADER_OR_FOLLOWER
                continue
            if sp is None:
                entry[1] = (
                    ErrorCode.NOT_LEADER_OR_FOLLOWER
                    if ctx.server.replica_manager.leads(name, p.partition_index) is False
                    else ErrorCode.INVALID_RECORD_STATE
                )
                continue
            undo = applied.setdefault(key, (sp, []))[1]
            for b in p.acknowledgement_batches:
                code = sp.acknowledge(
                    member_id, b.first_offset, b.last_offset, list(b.acknowledge_types), limit, lock_ms, undo
                )
                if code:
                    entry[1] = code
    if applied:
        spm.wake_fetches()  # released records, or a start offset moved: room under the in-flight limit
    return applied


def _acquire(
    ctx: RequestContext,
    spm: SharePartitionManager,
    group_id: str,
    member_id: str,
    session: ShareSession,
    max_records: int,
    max_bytes: int,
    record_limit: bool,
    out: _Result,
    batch_size: int = 0,
) -> int:
    names = ctx.server.topic_names_by_id()
    rm = ctx.server.replica_manager
    lock_ms = spm.lock_ms(group_id)
    committed = spm.read_committed(group_id)
    acquired = 0
    # As Kafka's PartitionRotateStrategy: each fetch of a session starts one partition further on, so a member
    # holding several partitions fills its max_records from each in turn, not always from the first
    order = sorted(session.partitions)
    if order:
        k = session.epoch % len(order)
        order = order[k:] + order[:k]
    for topic_id, partition in order:
        entry = out.setdefault((topic_id, partition), [ErrorCode.NONE, ErrorCode.NONE, [], []])
        name = names.get(topic_id)
        if name is None:
            entry[0] = ErrorCode.UNKNOWN_TOPIC_ID
            continue
        if rm.leads(name, partition) is False:
            entry[0] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            continue
        if acquired >= max_records or max_bytes <= 0:
            continue
        try:
            lg = rm.get_log(name, partition)
            sp = spm.share_partition(group_id, name, partition, lg)
            limit = lg.last_stable_offset if committed else lg.high_watermark
            chunks, ranges = sp.acquire(
                lg,
                member_id,
                max_records - acquired,
                max_bytes,
                lock_ms,
                spm.max_locks,
                limit,
                committed,
                record_limit,
                batch_size,
            )
        except Exception as e:  # a storage error answers for this partition only
            code = getattr(e, "code", None)
            if code in _STATE_LOADING:
                continue  # as Kafka's share-partition still initializing: the fetch waits, no error
            entry[0] = code if isinstance(code, int) else ErrorCode.UNKNOWN_SERVER_ERROR
            continue
        entry[2].extend(chunks)
        entry[3].extend(ranges)
        acquired += sum(last - first + 1 for first, last, _ in ranges)
        max_bytes -= sum(len(c) for c in chunks)
    return acquired


async def handle_share_fetch(ctx: RequestContext, req: ShareFetchRequest) -> ShareFetchResponse:
    R = ShareFetchResponse
    group_id, member_id = req.group_id or "", req.member_id or ""
    if _group_denied(ctx, READ, group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    spm = SharePartitionManager.of(ctx.server)
    max_records = req.max_records if req.max_records > 0 else 500
    max_bytes = req.max_bytes if req.max_bytes > 0 else 2**31 - 1
    record_limit = req.share_acquire_mode == SHARE_ACQUIRE_RECORD_LIMIT
    deadline = time.monotonic() + max(req.max_wait_ms, 0) / 1000

    async def run() -> tuple[int, _Result]:
        out: _Result = {}
        if not spm.knows_member(group_id, member_id):
            return ErrorCode.UNKNOWN_MEMBER_ID, out
        if req.share_session_epoch == 0 and any(
            p.acknowledgement_batches for t in req.topics for p in t.partitions
        ):
            return ErrorCode.INVALID_REQUEST, out
        session, code = spm.session_for(group_id, member_id, req.share_session_epoch, ctx.conn)
        if session is None:
            return code, out
        waiting = spm.waiting_fetches()
        applied = _acknowledge(ctx, spm, group_id, member_id, req.topics, out)
        if req.share_session_epoch == -1:
            spm.release_session(group_id, member_id)
            _unconfirmed(ctx, group_id, applied, out, await spm.persist())
            return ErrorCode.NONE, out
        if applied and waiting:
            # As Kafka's, the records these acknowledgements free go first to the fetches already waiting (the
            # wake-up runs them before this one acquires): else the member that acknowledges, whose next fetch
            # carries its acknowledgements, would take every batch its acknowledgement made room for.
            await asyncio.sleep(0)
        for t in req.topics:
            for p in t.partitions:
                session.partitions.add((bytes(t.topic_id), p.partition_index))
        for f in req.forgotten_topics_data:
            for idx in f.partitions:
                session.partitions.discard((bytes(f.topic_id), idx))
        if req.share_session_epoch == 0:
            await spm.check_states(group_id, session.partitions)
        names = ctx.server.topic_names_by_id()
        purgatory = ctx.server.replica_manager.purgatory
        while True:
            keys = []
            for topic_id, partition in sorted(session.partitions):
                name = names.get(topic_id)
                if name is not None and ctx.server.replica_manager.leads(name, partition) is not False:
                    await spm.prepare(group_id, name, partition, max(deadline, time.monotonic() + 0.5))
                    keys.append((name, partition))
            seen = (spm.changes, purgatory.generation)
            if (
                _acquire(
                    ctx,
                    spm,
                    group_id,
                    member_id,
                    session,
                    max_records,
                    max_bytes,
                    record_limit,
                    out,
                    req.batch_size,
                )
                > 0
            ):
                break
            if any(e[0] for e in out.values()) or time.monotonic() >= deadline:
                break
            spm.persist_dirty()
            # a share-partition still loading its state is not watched for: look again soon
            loading = len(keys) > sum(1 for k in keys if (group_id, *k) in spm.partitions)
            await spm.wait_for_records(
                keys, min(deadline, time.monotonic() + 0.05) if loading else deadline, seen
            )
        _unconfirmed(ctx, group_id, applied, out, await spm.persist())
        return ErrorCode.NONE, out

    code, out = await spm.call(run)
    if code:
        ctx.refused(code, None, f"group {group_id!r}")
        return R(error_code=code)
    lock_ms = spm.lock_ms(group_id)
    by_topic: dict[bytes, list[Any]] = {}
    rm = ctx.server.replica_manager
    names = ctx.server.topic_names_by_id()
    for (topic_id, partition), (err, ack_err, chunks, ranges) in sorted(out.items()):
        if not err and not ack_err and not chunks and (topic_id, partition) not in _acked(req.topics):
            continue
        name = names.get(topic_id)
        epoch = rm.leader_epoch(name, partition) if name is not None and not err else -1
        by_topic.setdefault(topic_id, []).append(
            R.PartitionData(
                partition_index=partition,
                error_code=err,
                acknowledge_error_code=ack_err,
                current_leader=R.LeaderIdAndEpoch(
                    leader_id=ctx.server.broker_id if not err else -1, leader_epoch=epoch
                ),
                records=b"".join(chunks),
                acquired_records=[
                    R.AcquiredRecords(first_offset=f, last_offset=la, delivery_count=c) for f, la, c in ranges
                ],
            )
        )
    return R(
        acquisition_lock_timeout_ms=lock_ms,
        responses=[R.ShareFetchableTopicResponse(topic_id=t, partitions=ps) for t, ps in by_topic.items()],
    )


def _unconfirmed(
    ctx: RequestContext,
    group_id: str,
    acked: _Applied,
    out: _Result,
    failed: dict[tuple[str, str, int], int],
) -> None:
    """Acknowledgements whose state could not be written are answered with the write's error and taken back, as
    Kafka's SharePartition rolls back the state transitions of a failed persister write (rollbackOrProcessState
    Updates): the records are the member's again until their locks expire, then go to the group again; a later
    write carries the state without them. Those applied to a share-partition dropped for a leadership change
    before its write answer NOT_LEADER_OR_FOLLOWER (the new leader has the state as last written)."""
    for key, (sp, _) in acked.items():
        entry = out.get(key)
        if sp.lost and entry is not None and not entry[1]:
            entry[1] = ErrorCode.NOT_LEADER_OR_FOLLOWER
    if not failed:
        return
    topics = ctx.server.metadata.topics
    for (g, topic, partition), code in failed.items():
        rec = topics.get(topic)
        if g != group_id or rec is None:
            continue
        key = (bytes(rec.topic_id), partition)
        entry = out.get(key)
        if key not in acked or entry is None:
            continue
        if not entry[1]:
            entry[1] = code
        sp, undo = acked[key]
        for u in reversed(undo):
            sp.rollback(u)


def _acked(topics: list[Any]) -> set[tuple[bytes, int]]:
    return {
        (bytes(t.topic_id), p.partition_index)
        for t in topics
        for p in t.partitions
        if p.acknowledgement_batches
    }


async def handle_share_acknowledge(
    ctx: RequestContext, req: ShareAcknowledgeRequest
) -> ShareAcknowledgeResponse:
    R = ShareAcknowledgeResponse
    group_id, member_id = req.group_id or "", req.member_id or ""
    if _group_denied(ctx, READ, group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    spm = SharePartitionManager.of(ctx.server)

    async def run() -> tuple[int, _Result]:
        out: _Result = {}
        if req.share_session_epoch == 0:
            return ErrorCode.INVALID_SHARE_SESSION_EPOCH, out
        if not spm.knows_member(group_id, member_id) and req.share_session_epoch != -1:
            return ErrorCode.UNKNOWN_MEMBER_ID, out
        session, code = spm.session_for(group_id, member_id, req.share_session_epoch)
        if session is None:
            return code, out
        applied = _acknowledge(ctx, spm, group_id, member_id, req.topics, out)
        if req.share_session_epoch == -1:
            spm.release_session(group_id, member_id)
        _unconfirmed(ctx, group_id, applied, out, await spm.persist())
        return ErrorCode.NONE, out

    code, out = await spm.call(run)
    if code:
        ctx.refused(code, None, f"group {group_id!r}")
        return R(error_code=code)
    rm = ctx.server.replica_manager
    names = ctx.server.topic_names_by_id()
    by_topic: dict[bytes, list[Any]] = {}
    for (topic_id, partition), (_, ack_err, _, _) in sorted(out.items()):
        name = names.get(topic_id)
        epoch = rm.leader_epoch(name, partition) if name is not None else -1
        by_topic.setdefault(topic_id, []).append(
            R.PartitionData(
                partition_index=partition,
                error_code=ack_err,
                current_leader=R.LeaderIdAndEpoch(leader_id=ctx.server.broker_id, leader_epoch=epoch),
            )
        )
    return R(
        acquisition_lock_timeout_ms=spm.lock_ms(group_id),
        responses=[R.ShareAcknowledgeTopicResponse(topic_id=t, partitions=ps) for t, ps in by_topic.items()],
    )


HANDLERS = [
    ApiHandler(76, 1, 1, handle_share_group_heartbeat),
    ApiHandler(77, 1, 1, handle_share_group_describe),
    ApiHandler(78, 1, 2, handle_share_fetch),
    ApiHandler(79, 1, 2, handle_share_acknowledge),
]

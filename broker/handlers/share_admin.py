"""Share-group offsets admin APIs: DescribeShareGroupOffsets (90) v0-1, the share-partition start offsets and lag of
a share group, read from the live share-partitions or their last snapshot in __share_group_state; and
AlterShareGroupOffsets (91) v0, which sets them for a group without members, and DeleteShareGroupOffsets (92) v0,
which forgets them."""

from __future__ import annotations

from typing import Any

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.handlers.groups import DELETE, DESCRIBE, READ, _group_denied
from kbroker.broker.handlers.share import share_coordinator_error
from kbroker.broker.share_partition_manager import SharePartitionManager
from kbroker.coordinator.share_group_records import TopicPartitions
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import (
    AlterShareGroupOffsetsRequest,
    AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse,
    DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsResponse,
)


async def handle_describe_share_group_offsets(
    ctx: RequestContext, req: DescribeShareGroupOffsetsRequest
) -> DescribeShareGroupOffsetsResponse:
    R = DescribeShareGroupOffsetsResponse
    spm = SharePartitionManager.of(ctx.server)
    topics = ctx.server.metadata.topics
    rm = ctx.server.replica_manager

    async def partition(group_id: str, topic: str, index: int) -> Any:
        rec = topics.get(topic)
        if rec is None or not 0 <= index < rec.num_partitions:
            return R.DescribeShareGroupOffsetsResponsePartition(
                partition_index=index,
                start_offset=-1,
                leader_epoch=-1,
                lag=-1,
                error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            )
        sp = spm.partitions.get((group_id, topic, index))
        start, done = -1, 0
        if sp is not None:
            start = sp.start
            done = sp.delivery_complete()
        else:
            code, start, done = await spm.summary(group_id, topic, index)
            if code:
                return R.DescribeShareGroupOffsetsResponsePartition(
                    partition_index=index, start_offset=-1, leader_epoch=-1, lag=-1, error_code=code
                )
        lag = -1
        if start >= 0:
            lag = max(rm.get_log(topic, index).high_watermark - start - done, 0)
        return R.DescribeShareGroupOffsetsResponsePartition(
            partition_index=index, start_offset=start, leader_epoch=rm.leader_epoch(topic, index), lag=lag
        )

    async def run() -> list[Any]:
        out = []
        for g in req.groups:
            if _group_denied(ctx, DESCRIBE, g.group_id):
                out.append(
                    R.DescribeShareGroupOffsetsResponseGroup(
                        group_id=g.group_id, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED
                    )
                )
                continue
            if g.topics is None:
                wanted: dict[str, list[int]] = {}
                for gid, topic, index in spm.partitions:
                    if gid == g.group_id:
                        wanted.setdefault(topic, []).append(index)
            else:
                wanted = {t.topic_name: list(t.partitions) for t in g.topics}
            out.append(
                R.DescribeShareGroupOffsetsResponseGroup(
                    group_id=g.group_id,
                    topics=[
                        R.DescribeShareGroupOffsetsResponseTopic(
                            topic_name=name,
                            topic_id=topics[name].topic_id if name in topics else bytes(16),
                            partitions=[await partition(g.group_id, name, i) for i in sorted(parts)],
                        )
                        for name, parts in sorted(wanted.items())
                    ],
                )
            )
        return out

    return R(groups=await spm.call(run))


HANDLERS = [ApiHandler(90, 0, 1, handle_describe_share_group_offsets)]


async def handle_alter_share_group_offsets(
    ctx: RequestContext, req: AlterShareGroupOffsetsRequest
) -> AlterShareGroupOffsetsResponse:
    """Set share-partition start offsets of a group without members, as Kafka 4.x's group coordinator does: a new
    group epoch, and the share coordinators initialize the share-partitions' state at it with the new start
    offsets (InitializeShareGroupState); their leaders, fenced by the new state epoch, read it again."""
    R = AlterShareGroupOffsetsResponse
    if _group_denied(ctx, READ, req.group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    not_here = share_coordinator_error(ctx.server, req.group_id)
    if not_here is not None:
        return R(error_code=not_here, error_message=not_here.name)
    spm = SharePartitionManager.of(ctx.server)
    topics = ctx.server.metadata.topics
    rm = ctx.server.replica_manager

    async def run() -> R:
        group = spm.coordinator.groups.get(req.group_id)
        if group is not None and group.members:
            return R(
                error_code=ErrorCode.NON_EMPTY_GROUP,
                error_message="The group is not empty: stop its share consumers first.",
            )
        errors: dict[tuple[str, int], int] = {}
        wanted: TopicPartitions = {}
        starts: dict[tuple[bytes, int], int] = {}
        for t in req.topics:
            rec = topics.get(t.topic_name)
            for p in t.partitions:
                index = p.partition_index
                if rec is None or not 0 <= index < rec.num_partitions:
                    errors[(t.topic_name, index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                start = p.start_offset
                if start < -1:
                    errors[(t.topic_name, index)] = ErrorCode.INVALID_REQUEST
                    continue
                # -1 is Kafka's uninitialized start offset, stored as such wherever the leader is: the leader
                # resolves it by share.auto.offset.reset on its first read (SharePartition's
                # startOffsetDuringInitialization), so no broker needs the log here
                if start >= 0:
                    try:
                        lg = rm.get_log(t.topic_name, index)
                    except KafkaError:  # led by another broker
                        lg = None
                    if lg is not None:  # the leader is here: the offset kept within the log
                        start = min(max(start, lg.log_start_offset), lg.high_watermark)
                wanted.setdefault(rec.topic_id, (t.topic_name, []))[1].append(index)
                starts[(rec.topic_id, index)] = start
        if wanted:
            before = spm.coordinator.snapshot(req.group_id)
            spm.coordinator.create(req.group_id)
            epoch = spm.coordinator.bump_epoch(req.group_id)
            code = await spm.write_group(req.group_id, before)
            if code:
                return R(error_code=code, error_message=code.name)
            for tid, (name, parts) in wanted.items():
                for index in parts:
                    spm.drop(req.group_id, name, index)
                    if starts[(tid, index)] < 0:
                        # Kafka's share coordinator overwrites the state with the uninitialized start offset;
                        # kbroker's keeps a state initialized again without one (a heartbeat's retry), so the
                        # state is deleted first
                        code = await spm.delete_partition_state(req.group_id, tid, name, index)
                        if code:
                            errors[(name, index)] = code
            wanted = {
                tid: (name, [i for i in parts if (name, i) not in errors])
                for tid, (name, parts) in wanted.items()
            }
            done = await spm.initialize_state(req.group_id, wanted, epoch, starts)
            for tid, (name, parts) in wanted.items():
                for index in parts:
                    errors[(name, index)] = done.get((tid, index), ErrorCode.UNKNOWN_SERVER_ERROR)
        out = []
        for t in req.topics:
            rec = topics.get(t.topic_name)
            out.append(
                R.AlterShareGroupOffsetsResponseTopic(
                    topic_name=t.topic_name,
                    topic_id=rec.topic_id if rec is not None else bytes(16),
                    partitions=[
                        R.AlterShareGroupOffsetsResponsePartition(
                            partition_index=p.partition_index,
                            error_code=errors[(t.topic_name, p.partition_index)],
                            error_message=ErrorCode(errors[(t.topic_name, p.partition_index)]).name
                            if errors[(t.topic_name, p.partition_index)]
                            else None,
                        )
                        for p in t.partitions
                    ],
                )
            )
        return R(responses=out)

    return await spm.call(run)


HANDLERS.append(ApiHandler(91, 0, 0, handle_alter_share_group_offsets))


async def handle_delete_share_group_offsets(
    ctx: RequestContext, req: DeleteShareGroupOffsetsRequest
) -> DeleteShareGroupOffsetsResponse:
    """Forget a group's share-partition state for whole topics (Kafka 4.x's DeleteShareGroupOffsets): the group
    must exist and have no members; the topics are recorded as deleting in the group's
    ShareGroupStatePartitionMetadata while their share coordinators tombstone the state, then forgotten; the
    next share consumer of a topic starts by share.auto.offset.reset."""
    R = DeleteShareGroupOffsetsResponse
    if _group_denied(ctx, DELETE, req.group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    not_here = share_coordinator_error(ctx.server, req.group_id)
    if not_here is not None:
        return R(error_code=not_here, error_message=not_here.name)
    spm = SharePartitionManager.of(ctx.server)
    topics = ctx.server.metadata.topics

    async def run() -> R:
        group = spm.coordinator.groups.get(req.group_id)
        if group is None:
            return R(
                error_code=ErrorCode.GROUP_ID_NOT_FOUND, error_message=f"Group {req.group_id} not found."
            )
        if group.members:
            return R(
                error_code=ErrorCode.NON_EMPTY_GROUP,
                error_message="The group is not empty: stop its share consumers first.",
            )
        known = {t.topic_name: topics[t.topic_name] for t in req.topics if t.topic_name in topics}
        before = spm.coordinator.snapshot(req.group_id)
        spm.coordinator.deleting(req.group_id, {rec.topic_id: name for name, rec in known.items()})
        code = await spm.write_group(req.group_id, before)
        if code:
            return R(error_code=code, error_message=code.name)
        out = []
        deleted = set()
        for t in req.topics:
            rec = known.get(t.topic_name)
            if rec is None:
                out.append(
                    R.DeleteShareGroupOffsetsResponseTopic(
                        topic_name=t.topic_name,
                        topic_id=bytes(16),
                        error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        error_message=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.name,
                    )
                )
                continue
            code = await spm.delete_state(req.group_id, t.topic_name, rec.num_partitions)
            if not code:
                deleted.add(rec.topic_id)
            out.append(
                R.DeleteShareGroupOffsetsResponseTopic(
                    topic_name=t.topic_name,
                    topic_id=rec.topic_id,
                    error_code=code,
                    error_message=ErrorCode(code).name if code else None,
                )
            )
        before = spm.coordinator.snapshot(req.group_id)
        spm.coordinator.forget_topics(req.group_id, deleted)
        await spm.write_group(req.group_id, before)
        return R(responses=out)

    return await spm.call(run)


HANDLERS.append(ApiHandler(92, 0, 0, handle_delete_share_group_offsets))

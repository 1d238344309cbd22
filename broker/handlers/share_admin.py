"""Share-group offsets admin APIs: DescribeShareGroupOffsets (90) v0-1, the share-partition start offsets and lag of
a share group, read from the live share-partitions or their last snapshot in __share_group_state; and
AlterShareGroupOffsets (91) v0, which sets them for a group without members, and DeleteShareGroupOffsets (92) v0,
which forgets them."""

from __future__ import annotations

from typing import Any

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.handlers.groups import DELETE, DESCRIBE, READ, _group_denied
from kbroker.broker.share_partition_manager import SharePartitionManager
from kbroker.protocol.errors import ErrorCode
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
    """Set share-partition start offsets of a group without members; the in-flight state starts over there."""
    R = AlterShareGroupOffsetsResponse
    if _group_denied(ctx, READ, req.group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
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
        out = []
        for t in req.topics:
            rec = topics.get(t.topic_name)
            parts = []
            for p in t.partitions:
                if rec is None or not 0 <= p.partition_index < rec.num_partitions:
                    parts.append(
                        R.AlterShareGroupOffsetsResponsePartition(
                            partition_index=p.partition_index, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        )
                    )
                    continue
                lg = rm.get_log(t.topic_name, p.partition_index)
                await spm.prepare(req.group_id, t.topic_name, p.partition_index)
                sp = spm.share_partition(req.group_id, t.topic_name, p.partition_index, lg)
                start = p.start_offset if p.start_offset >= 0 else lg.high_watermark
                sp.reset(min(max(start, lg.log_start_offset), lg.high_watermark))
                parts.append(R.AlterShareGroupOffsetsResponsePartition(partition_index=p.partition_index))
            out.append(
                R.AlterShareGroupOffsetsResponseTopic(
                    topic_name=t.topic_name,
                    topic_id=rec.topic_id if rec is not None else bytes(16),
                    partitions=parts,
                )
            )
        await spm.persist()
        return R(responses=out)

    return await spm.call(run)


HANDLERS.append(ApiHandler(91, 0, 0, handle_alter_share_group_offsets))


async def handle_delete_share_group_offsets(
    ctx: RequestContext, req: DeleteShareGroupOffsetsRequest
) -> DeleteShareGroupOffsetsResponse:
    """Forget a group's share-partition state for whole topics (Kafka 4.x's DeleteShareGroupOffsets): the group
    must exist and have no members; the next share consumer of a topic starts by share.auto.offset.reset."""
    R = DeleteShareGroupOffsetsResponse
    if _group_denied(ctx, DELETE, req.group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
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
        out = []
        for t in req.topics:
            rec = topics.get(t.topic_name)
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
            out.append(
                R.DeleteShareGroupOffsetsResponseTopic(
                    topic_name=t.topic_name,
                    topic_id=rec.topic_id,
                    error_code=code,
                    error_message=ErrorCode(code).name if code else None,
                )
            )
        return R(responses=out)

    return await spm.call(run)


HANDLERS.append(ApiHandler(92, 0, 0, handle_delete_share_group_offsets))

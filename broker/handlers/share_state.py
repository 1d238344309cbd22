"""InitializeShareGroupState (83), ReadShareGroupState (84), WriteShareGroupState (85), DeleteShareGroupState (86)
v0 and ReadShareGroupStateSummary (87) v0-1, the share-state RPCs sent to the leader of the share-partition's
__share_group_state partition (Kafka's share coordinator): the group coordinator initializes and deletes the
state there; a share-partition's new leader reads it there; a write is the whole state as one ShareSnapshot,
replicated before the answer."""

from __future__ import annotations

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.broker.share_partition_manager import (
    READ_UNINITIALIZED,
    WRITE_UNINITIALIZED,
    SharePartitionManager,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    DeleteShareGroupStateRequest,
    DeleteShareGroupStateResponse,
    InitializeShareGroupStateRequest,
    InitializeShareGroupStateResponse,
    ReadShareGroupStateRequest,
    ReadShareGroupStateResponse,
    ReadShareGroupStateSummaryRequest,
    ReadShareGroupStateSummaryResponse,
    WriteShareGroupStateRequest,
    WriteShareGroupStateResponse,
)


def _message(code: int, partition: int, uninitialized: str) -> str | None:
    """Kafka's message: an INVALID_REQUEST for a valid partition is its uninitialized share-partition."""
    if not code:
        return None
    if code == ErrorCode.INVALID_REQUEST and partition >= 0:
        return uninitialized
    return ErrorCode(code).name


async def handle_write_share_group_state(
    ctx: RequestContext, req: WriteShareGroupStateRequest
) -> WriteShareGroupStateResponse:
    R = WriteShareGroupStateResponse
    denied = not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
    spm = SharePartitionManager.of(ctx.server)
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            if denied:
                code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            else:
                batches = [
                    (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                    for b in p.state_batches
                ]
                code = await spm.call(
                    spm.write_state,
                    req.group_id,
                    bytes(t.topic_id),
                    p.partition,
                    p.start_offset,
                    batches,
                    p.leader_epoch,
                    p.state_epoch,
                )
            parts.append(
                R.PartitionResult(
                    partition=p.partition,
                    error_code=code,
                    error_message=_message(code, p.partition, WRITE_UNINITIALIZED),
                )
            )
        results.append(R.WriteStateResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)


async def handle_read_share_group_state(
    ctx: RequestContext, req: ReadShareGroupStateRequest
) -> ReadShareGroupStateResponse:
    R = ReadShareGroupStateResponse
    denied = not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
    spm = SharePartitionManager.of(ctx.server)
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            if denied:
                code, epoch, start, batches = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, 0, -1, []
            else:
                code, epoch, start, batches = await spm.call(
                    spm.read_state, req.group_id, bytes(t.topic_id), p.partition, p.leader_epoch
                )
            parts.append(
                R.PartitionResult(
                    partition=p.partition,
                    error_code=code,
                    error_message=_message(code, p.partition, READ_UNINITIALIZED),
                    state_epoch=epoch,
                    start_offset=start,
                    state_batches=[
                        R.StateBatch(first_offset=f, last_offset=la, delivery_state=s, delivery_count=c)
                        for f, la, s, c in batches
                    ],
                )
            )
        results.append(R.ReadStateResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)


async def handle_read_share_group_state_summary(
    ctx: RequestContext, req: ReadShareGroupStateSummaryRequest
) -> ReadShareGroupStateSummaryResponse:
    R = ReadShareGroupStateSummaryResponse
    denied = not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
    spm = SharePartitionManager.of(ctx.server)
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            if denied:
                code, state_epoch, leader_epoch, start, done = (
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    0,
                    -1,
                    -1,
                    -1,
                )
            else:
                code, state_epoch, leader_epoch, start, done = await spm.call(
                    spm.read_summary, req.group_id, bytes(t.topic_id), p.partition
                )
            parts.append(
                R.PartitionResult(
                    partition=p.partition,
                    error_code=code,
                    error_message=ErrorCode(code).name if code else None,
                    state_epoch=state_epoch,
                    leader_epoch=leader_epoch,
                    start_offset=start,
                    delivery_complete_count=done,
                )
            )
        results.append(R.ReadStateSummaryResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)


async def handle_delete_share_group_state(
    ctx: RequestContext, req: DeleteShareGroupStateRequest
) -> DeleteShareGroupStateResponse:
    R = DeleteShareGroupStateResponse
    denied = not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
    spm = SharePartitionManager.of(ctx.server)
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            if denied:
                code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            else:
                code = await spm.call(spm.delete_state_of, req.group_id, bytes(t.topic_id), p.partition)
            parts.append(
                R.PartitionResult(
                    partition=p.partition,
                    error_code=code,
                    error_message=ErrorCode(code).name if code else None,
                )
            )
        results.append(R.DeleteStateResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)


async def handle_initialize_share_group_state(
    ctx: RequestContext, req: InitializeShareGroupStateRequest
) -> InitializeShareGroupStateResponse:
    R = InitializeShareGroupStateResponse
    denied = not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
    spm = SharePartitionManager.of(ctx.server)
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            if denied:
                code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            elif not req.group_id:
                code = ErrorCode.INVALID_REQUEST
            else:
                code = await spm.call(
                    spm.initialize_state_of,
                    req.group_id,
                    bytes(t.topic_id),
                    p.partition,
                    p.state_epoch,
                    p.start_offset,
                )
            parts.append(
                R.PartitionResult(
                    partition=p.partition,
                    error_code=code,
                    error_message=ErrorCode(code).name if code else None,
                )
            )
        results.append(R.InitializeStateResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)


HANDLERS = [
    ApiHandler(83, 0, 0, handle_initialize_share_group_state),
    ApiHandler(84, 0, 0, handle_read_share_group_state),
    ApiHandler(85, 0, 0, handle_write_share_group_state),
    ApiHandler(86, 0, 0, handle_delete_share_group_state),
    ApiHandler(87, 0, 1, handle_read_share_group_state_summary),
]

"""InitializeShareGroupState (83), ReadShareGroupState (84), WriteShareGroupState (85), DeleteShareGroupState (86)
v0 and ReadShareGroupStateSummary (87) v0-1, the share-state RPCs sent to the leader of the share-partition's
__share_group_state partition (Kafka's share coordinator): the group coordinator initializes and deletes the
state there; a share-partition's new leader reads it there; a write is the whole state as one ShareSnapshot,
replicated before the answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

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


# Errors.CLUSTER_AUTHORIZATION_FAILED.message(), which Kafka's toGlobalErrorResponse sets on every partition
CLUSTER_AUTHORIZATION_FAILED_MESSAGE = "Cluster authorization failed."


async def _each_partition(
    ctx: RequestContext,
    topics: Any,
    topic_result: Any,
    partition_result: Any,
    answer: Callable[[bytes, Any], Awaitable[Any]],
) -> list[Any]:
    """The share-state RPCs' walk: every partition of every topic answered in order by `answer(topic id,
    partition)`; a caller without CLUSTER_ACTION on the cluster gets Kafka's toGlobalErrorResponse instead: each
    partition CLUSTER_AUTHORIZATION_FAILED with its message, the other fields at the schema's defaults."""
    denied = not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
    return [
        topic_result(
            topic_id=t.topic_id,
            partitions=[
                partition_result(
                    partition=p.partition,
                    error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    error_message=CLUSTER_AUTHORIZATION_FAILED_MESSAGE,
                )
                if denied
                else await answer(bytes(t.topic_id), p)
                for p in t.partitions
            ],
        )
        for t in topics
    ]


async def handle_write_share_group_state(
    ctx: RequestContext, req: WriteShareGroupStateRequest
) -> WriteShareGroupStateResponse:
    R = WriteShareGroupStateResponse
    spm = SharePartitionManager.of(ctx.server)

    async def answer(topic_id: bytes, p: Any) -> Any:
        batches = [
            (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in p.state_batches
        ]
        code = await spm.call(
            spm.write_state,
            req.group_id,
            topic_id,
            p.partition,
            p.start_offset,
            batches,
            p.leader_epoch,
            p.state_epoch,
        )
        return R.PartitionResult(
            partition=p.partition,
            error_code=code,
            error_message=_message(code, p.partition, WRITE_UNINITIALIZED),
        )

    return R(results=await _each_partition(ctx, req.topics, R.WriteStateResult, R.PartitionResult, answer))


async def handle_read_share_group_state(
    ctx: RequestContext, req: ReadShareGroupStateRequest
) -> ReadShareGroupStateResponse:
    R = ReadShareGroupStateResponse
    spm = SharePartitionManager.of(ctx.server)

    async def answer(topic_id: bytes, p: Any) -> Any:
        code, epoch, start, batches = await spm.call(
            spm.read_state, req.group_id, topic_id, p.partition, p.leader_epoch
        )
        return R.PartitionResult(
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

    return R(results=await _each_partition(ctx, req.topics, R.ReadStateResult, R.PartitionResult, answer))


async def handle_read_share_group_state_summary(
    ctx: RequestContext, req: ReadShareGroupStateSummaryRequest
) -> ReadShareGroupStateSummaryResponse:
    R = ReadShareGroupStateSummaryResponse
    spm = SharePartitionManager.of(ctx.server)

    async def answer(topic_id: bytes, p: Any) -> Any:
        code, state_epoch, leader_epoch, start, done = await spm.call(
            spm.read_summary, req.group_id, topic_id, p.partition
        )
        return R.PartitionResult(
            partition=p.partition,
            error_code=code,
            error_message=ErrorCode(code).name if code else None,
            state_epoch=state_epoch,
            leader_epoch=leader_epoch,
            start_offset=start,
            delivery_complete_count=done,
        )

    return R(
        results=await _each_partition(ctx, req.topics, R.ReadStateSummaryResult, R.PartitionResult, answer)
    )


async def handle_delete_share_group_state(
    ctx: RequestContext, req: DeleteShareGroupStateRequest
) -> DeleteShareGroupStateResponse:
    R = DeleteShareGroupStateResponse
    spm = SharePartitionManager.of(ctx.server)

    async def answer(topic_id: bytes, p: Any) -> Any:
        code = await spm.call(spm.delete_state_of, req.group_id, topic_id, p.partition)
        return R.PartitionResult(
            partition=p.partition, error_code=code, error_message=ErrorCode(code).name if code else None
        )

    return R(results=await _each_partition(ctx, req.topics, R.DeleteStateResult, R.PartitionResult, answer))


async def handle_initialize_share_group_state(
    ctx: RequestContext, req: InitializeShareGroupStateRequest
) -> InitializeShareGroupStateResponse:
    R = InitializeShareGroupStateResponse
    spm = SharePartitionManager.of(ctx.server)

    async def answer(topic_id: bytes, p: Any) -> Any:
        if not req.group_id:
            code = ErrorCode.INVALID_REQUEST
        else:
            code = await spm.call(
                spm.initialize_state_of, req.group_id, topic_id, p.partition, p.state_epoch, p.start_offset
            )
        return R.PartitionResult(
            partition=p.partition, error_code=code, error_message=ErrorCode(code).name if code else None
        )

    return R(
        results=await _each_partition(ctx, req.topics, R.InitializeStateResult, R.PartitionResult, answer)
    )


HANDLERS = [
    ApiHandler(83, 0, 0, handle_initialize_share_group_state),
    ApiHandler(84, 0, 0, handle_read_share_group_state),
    ApiHandler(85, 0, 0, handle_write_share_group_state),
    ApiHandler(86, 0, 0, handle_delete_share_group_state),
    ApiHandler(87, 0, 1, handle_read_share_group_state_summary),
]

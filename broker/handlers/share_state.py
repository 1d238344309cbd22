"""WriteShareGroupState (85) v0, the share-state RPC a share-partition leader sends to the leader of the
share-partition's __share_group_state partition (Kafka's share coordinator): the whole state is written as one
ShareSnapshot and replicated before the answer."""

from __future__ import annotations

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.broker.share_partition_manager import SharePartitionManager
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import WriteShareGroupStateRequest, WriteShareGroupStateResponse


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
                )
            parts.append(R.PartitionResult(partition=p.partition, error_code=code))
        results.append(R.WriteStateResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)


HANDLERS = [ApiHandler(85, 0, 0, handle_write_share_group_state)]

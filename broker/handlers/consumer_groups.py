"""KIP-848 consumer group APIs: ConsumerGroupHeartbeat (68) v0-1 and ConsumerGroupDescribe (69) v0.

ConsumerGroupHeartbeat v1 (Kafka 4.0: SubscribedTopicRegex) is there because librdkafka's consumer protocol
speaks only v1; Kafka 3.9 has v0, which the Java client 3.9 uses.

The handlers translate wire structures (topic ids on the wire, names for describe); the state machine is
coordinator.ConsumerGroupManager on the group coordinator's loop.
"""

from __future__ import annotations

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.handlers.groups import (
    DESCRIBE,
    GROUP,
    GROUP_OPERATIONS,
    READ,
    _client_host,
    _group_denied,
)
from kbroker.coordinator.consumer_group_manager import ConsumerHeartbeat
from kbroker.coordinator.consumer_group_records import Assignment
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)


async def handle_consumer_group_heartbeat(ctx: RequestContext,
                                          req: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse:
    R = ConsumerGroupHeartbeatResponse
    if _group_denied(ctx, READ, req.group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    owned: Assignment | None = None
    if req.topic_partitions is not None:
        owned = {}
        for tp in req.topic_partitions:
            owned.setdefault(bytes(tp.topic_id), set()).update(tp.partitions)
    gc = ctx.server.group_coordinator
    r = await gc.call(gc.consumer_group_heartbeat, ConsumerHeartbeat(
        group_id=req.group_id, member_id=req.member_id, member_epoch=req.member_epoch, instance_id=req.instance_id,
        rack_id=req.rack_id, rebalance_timeout_ms=req.rebalance_timeout_ms,
        subscribed_topic_names=None if req.subscribed_topic_names is None else list(req.subscribed_topic_names),
        subscribed_topic_regex=req.subscribed_topic_regex,
        server_assignor=req.server_assignor, owned=owned, client_id=ctx.client_id or "",
        client_host=_client_host(ctx), api_version=ctx.api_version))
    if r.error:
        return R(error_code=r.error, error_message=r.message)
    assignment = None
    if r.assignment is not None:
        assignment = R.Assignment(topic_partitions=[
            R.TopicPartitions(topic_id=t, partitions=sorted(ps)) for t, ps in sorted(r.assignment.items())])
    return R(error_code=0, member_id=r.member_id, member_epoch=r.member_epoch,
             heartbeat_interval_ms=r.heartbeat_interval_ms, assignment=assignment)


async def handle_consumer_group_describe(ctx: RequestContext,
                                         req: ConsumerGroupDescribeRequest) -> ConsumerGroupDescribeResponse:
    R = ConsumerGroupDescribeResponse
    gc = ctx.server.group_coordinator
    authz = ctx.server.authorizer
    allowed = [g for g in req.group_ids if not _group_denied(ctx, DESCRIBE, g)]
    described = {d.group_id: d for d in await gc.call(gc.consumer_group_describe, allowed)}
    names = ctx.server.topic_names_by_id()

    def assignment(a: Assignment) -> ConsumerGroupDescribeResponse.Assignment:
        return R.Assignment(topic_partitions=[
            R.TopicPartitions(topic_id=t, topic_name=names.get(t, ""), partitions=sorted(ps))
            for t, ps in sorted(a.items()) if ps])

    out = []
    for gid in req.group_ids:
        d = described.get(gid)
        if d is None:
            out.append(R.DescribedGroup(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, group_id=gid))
            continue
        if d.error:
            # Kafka leaves the state of a group it did not find empty (3.9 and 4.x alike)
            out.append(R.DescribedGroup(error_code=d.error, error_message=d.message, group_id=gid))
            continue
        ops = -(2**31)
        if req.include_authorized_operations:
            ops = GROUP_OPERATIONS if authz is None else ctx.authorized_operations(GROUP, gid)
        out.append(R.DescribedGroup(
            error_code=0, group_id=gid, group_state=d.state, group_epoch=d.group_epoch,
            assignment_epoch=d.assignment_epoch, assignor_name=d.assignor, authorized_operations=ops,
            members=[R.Member(member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                              member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
                              subscribed_topic_names=list(m.subscribed_topic_names),
                              # Kafka's member keeps "" for no regex and describes it so
                              subscribed_topic_regex=m.subscribed_topic_regex or "",
                              assignment=assignment(m.assigned), target_assignment=assignment(target))
                     for m, target in d.members or []]))
    return R(groups=out)


HANDLERS = [
    ApiHandler(68, 0, 1, handle_consumer_group_heartbeat),
    ApiHandler(69, 0, 0, handle_consumer_group_describe),
]

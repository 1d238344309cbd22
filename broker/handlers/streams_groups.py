"""KIP-1071 streams group APIs: StreamsGroupHeartbeat (88) v0-1 and StreamsGroupDescribe (89) v0-1.

The state machine is coordinator.StreamsGroupManager on the group coordinator's loop; the handler creates the
internal topics (repartition, changelog) the coordinator asks for, as Kafka's KafkaApis does with the
heartbeat's creatable topics.
"""

from __future__ import annotations

import logging

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.handlers.groups import (
    DESCRIBE,
    GROUP,
    GROUP_OPERATIONS,
    READ,
    _client_host,
    _group_denied,
)
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.coordinator.streams_group import MISSING_INTERNAL_TOPICS
from kbroker.coordinator.streams_group_manager import StreamsHeartbeat
from kbroker.coordinator.streams_group_records import Tasks
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import (
    StreamsGroupDescribeRequest,
    StreamsGroupDescribeResponse,
    StreamsGroupHeartbeatRequest,
    StreamsGroupHeartbeatResponse,
    StreamsGroupTopologyValue,
)

log = logging.getLogger("kbroker.group")


def _create_internal_topics(
    ctx: RequestContext, wanted: dict[str, tuple[int, int, dict[str, str]]]
) -> str | None:
    """Kafka's KafkaApis.streamsGroupHeartbeat: the internal topics are created when the member may CREATE them
    (on the cluster or on each topic); otherwise the status says so. Returns that status detail, or None."""
    names = sorted(n for n in wanted if n not in ctx.server.metadata.topics)
    if ctx.server.authorizer is not None and not ctx.authorized(
        AclOperation.CREATE, ResourceType.CLUSTER, log_denied=False
    ):
        allowed = ctx.authorized_names(AclOperation.CREATE, ResourceType.TOPIC, names)
        denied = [n for n in names if n not in allowed]
        if denied:
            return f"Unauthorized to CREATE on topics {', '.join(denied)}."
    admin = ctx.server.admin
    for name in names:
        partitions, rf, configs = wanted[name]
        try:
            admin.create_topic(name, partitions, rf if rf > 0 else -1, configs)
        except KafkaError as e:
            if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                log.warning("Could not create internal topic %s of a streams group: %s", name, e.message or e)
    return None


async def handle_streams_group_heartbeat(
    ctx: RequestContext, req: StreamsGroupHeartbeatRequest
) -> StreamsGroupHeartbeatResponse:
    R = StreamsGroupHeartbeatResponse
    if _group_denied(ctx, READ, req.group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    gc = ctx.server.group_coordinator
    r = await gc.call(
        gc.streams_group_heartbeat,
        StreamsHeartbeat(req, client_id=ctx.client_id or "", client_host=_client_host(ctx)),
    )
    if r.error:
        return R(error_code=r.error, error_message=r.message)
    status = list(r.status)
    if r.to_create:
        denied = _create_internal_topics(ctx, r.to_create)
        if denied is not None:
            status = [(c, f"{d} {denied}" if c == MISSING_INTERNAL_TOPICS else d) for c, d in status]

    def ids(t: Tasks) -> list[StreamsGroupHeartbeatResponse.TaskIds]:
        return [R.TaskIds(subtopology_id=s, partitions=sorted(ps)) for s, ps in sorted(t.items()) if ps]

    a = r.assignment
    return R(
        error_code=0,
        member_id=r.member_id,
        member_epoch=r.member_epoch,
        heartbeat_interval_ms=r.heartbeat_interval_ms,
        task_offset_interval_ms=60000,
        acceptable_recovery_lag_legacy=10000,
        acceptable_recovery_lag=10000,
        status=[R.Status(status_code=c, status_detail=d) for c, d in status],
        active_tasks=None if a is None else ids(a.active),
        standby_tasks=None if a is None else ids(a.standby),
        warmup_tasks=None if a is None else ids(a.warmup),
        endpoint_information_epoch=0,
        partitions_by_user_endpoint=None,
    )


async def handle_streams_group_describe(
    ctx: RequestContext, req: StreamsGroupDescribeRequest
) -> StreamsGroupDescribeResponse:
    R = StreamsGroupDescribeResponse
    gc = ctx.server.group_coordinator
    authz = ctx.server.authorizer
    allowed = [g for g in req.group_ids if not _group_denied(ctx, DESCRIBE, g)]
    described = {
        gid: (err, msg, sg) for gid, err, msg, sg in await gc.call(gc.streams_group_describe, allowed)
    }

    def ids(t: Tasks) -> list[StreamsGroupDescribeResponse.TaskIds]:
        return [R.TaskIds(subtopology_id=s, partitions=sorted(ps)) for s, ps in sorted(t.items()) if ps]

    def info(ti: StreamsGroupTopologyValue.TopicInfo) -> StreamsGroupDescribeResponse.TopicInfo:
        return R.TopicInfo(
            name=ti.name,
            partitions=ti.partitions,
            replication_factor=ti.replication_factor,
            topic_configs=[R.KeyValue(key=c.key, value=c.value) for c in ti.topic_configs],
        )

    out = []
    for gid in req.group_ids:
        if gid not in described:
            out.append(R.DescribedGroup(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, group_id=gid))
            continue
        err, msg, sg = described[gid]
        if err or sg is None:
            out.append(R.DescribedGroup(error_code=err, error_message=msg, group_id=gid, group_state="Dead"))
            continue
        ops = -(2**31)
        if req.include_authorized_operations:
            ops = GROUP_OPERATIONS if authz is None else ctx.authorized_operations(GROUP, gid)
        topology = None
        if sg.topology is not None:
            topology = R.Topology(
                epoch=sg.topology.epoch,
                subtopologies=[
                    R.Subtopology(
                        subtopology_id=s.subtopology_id,
                        source_topics=list(s.source_topics),
                        repartition_sink_topics=list(s.repartition_sink_topics),
                        state_changelog_topics=[info(x) for x in s.state_changelog_topics],
                        repartition_source_topics=[info(x) for x in s.repartition_source_topics],
                    )
                    for s in sg.topology.subtopologies
                ],
            )
        members = []
        for m in sg.members.values():
            target = sg.target.get(m.member_id)
            members.append(
                R.Member(
                    member_id=m.member_id,
                    member_epoch=m.member_epoch,
                    instance_id=m.instance_id,
                    rack_id=m.rack_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    topology_epoch=m.topology_epoch,
                    process_id=m.process_id,
                    user_endpoint=None
                    if m.user_endpoint is None
                    else R.Endpoint(host=m.user_endpoint[0], port=m.user_endpoint[1]),
                    client_tags=[R.KeyValue(key=k, value=v) for k, v in sorted(m.client_tags.items())],
                    task_offsets=[],
                    task_end_offsets=[],
                    assignment=R.Assignment(
                        active_tasks=ids(m.assigned.active),
                        standby_tasks=ids(m.assigned.standby),
                        warmup_tasks=ids(m.assigned.warmup),
                    ),
                    target_assignment=R.Assignment(
                        active_tasks=ids(target.active) if target else [],
                        standby_tasks=ids(target.standby) if target else [],
                        warmup_tasks=ids(target.warmup) if target else [],
                    ),
                    is_classic=False,
                )
            )
        out.append(
            R.DescribedGroup(
                error_code=0,
                group_id=gid,
                group_state=sg.state.value,
                group_epoch=sg.group_epoch,
                assignment_epoch=sg.assignment_epoch,
                topology=topology,
                members=members,
                authorized_operations=ops,
                # v1 (KIP-1331): no topology description is stored (none is asked of members), so NOT_STORED (1)
                # when one is requested; the assignor is Kafka's default, `sticky`.
                topology_description_status=1 if req.include_topology_description else 0,
                assignor_name="sticky",
            )
        )
    return R(groups=out)


HANDLERS = [
    ApiHandler(88, 0, 1, handle_streams_group_heartbeat),
    ApiHandler(89, 0, 1, handle_streams_group_describe),
]

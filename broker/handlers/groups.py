"""Consumer group APIs: FindCoordinator (10), JoinGroup (11), Heartbeat (12), LeaveGroup (13), SyncGroup (14),
DescribeGroups (15), ListGroups (16), DeleteGroups (42), OffsetCommit (8), OffsetFetch (9), OffsetDelete (47).

The handlers translate wire structures; the group state machine is coordinator.GroupCoordinator.
"""

from __future__ import annotations

import time
from typing import Any

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.security.acls import SUPPORTED_OPERATIONS, AclOperation, ResourceType, bit_field
from kbroker.broker.share_partition_manager import SharePartitionManager
from kbroker.coordinator.group_coordinator import partition_for
from kbroker.coordinator.group_metadata import GroupState, OffsetAndMetadata
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

GROUP_KEY, TRANSACTION_KEY = 0, 1
# Without an authorizer every group operation is allowed (READ, DESCRIBE, DELETE).
GROUP_OPERATIONS = bit_field(SUPPORTED_OPERATIONS[ResourceType.GROUP])
READ, DESCRIBE, DELETE = AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE
GROUP, TOPIC = ResourceType.GROUP, ResourceType.TOPIC


def _group_denied(ctx: RequestContext, op: AclOperation, group_id: str) -> bool:
    return ctx.server.authorizer is not None and not ctx.authorized(op, GROUP, group_id)


def _topics_denied(ctx: RequestContext, op: AclOperation, names: list[str]) -> set[str]:
    if ctx.server.authorizer is None:
        return set()
    return set(names) - ctx.authorized_names(op, TOPIC, names)


def _client_host(ctx: RequestContext) -> str:
    return "/" + ctx.conn.peer.rsplit(":", 1)[0]


# ---------------------------------------------------------------- FindCoordinator


def _find_one(ctx: RequestContext, key: str, key_type: int) -> tuple[ErrorCode, str | None, int, str, int]:
    server = ctx.server
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        return ErrorCode.INVALID_REQUEST, f"unknown key type {key_type}", -1, "", -1
    # An empty key has a coordinator too (Kafka's getCoordinator hashes it like any other); the APIs that use it
    # refuse "" themselves.
    if server.authorizer is not None:
        if key_type == GROUP_KEY and not ctx.authorized(DESCRIBE, GROUP, key):
            return ErrorCode.GROUP_AUTHORIZATION_FAILED, None, -1, "", -1
        if key_type == TRANSACTION_KEY and not ctx.authorized(DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None, -1, "", -1
    try:
        rec = server.ensure_offsets_topic() if key_type == GROUP_KEY else server.ensure_transaction_state_topic()
    except KafkaError as e:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, e.message or None, -1, "", -1
    leader = rec.leaders[partition_for(key, rec.num_partitions)]
    for broker_id, host, port, _ in server.brokers(ctx.conn.listener_name):
        if broker_id == leader:
            return ErrorCode.NONE, None, broker_id, host, port
    return ErrorCode.COORDINATOR_NOT_AVAILABLE, None, -1, "", -1


def handle_find_coordinator(ctx: RequestContext, req: FindCoordinatorRequest) -> FindCoordinatorResponse:
    if ctx.api_version < 4:
        err, msg, node, host, port = _find_one(ctx, req.key, req.key_type)
        return FindCoordinatorResponse(error_code=err, error_message=msg, node_id=node, host=host, port=port)
    coordinators = []
    for key in req.coordinator_keys:
        err, msg, node, host, port = _find_one(ctx, key, req.key_type)
        coordinators.append(FindCoordinatorResponse.Coordinator(
            key=key, node_id=node, host=host, port=port, error_code=err, error_message=msg))
    return FindCoordinatorResponse(coordinators=coordinators)


# ---------------------------------------------------------------- membership


async def handle_join_group(ctx: RequestContext, req: JoinGroupRequest) -> JoinGroupResponse:
    gc = ctx.server.group_coordinator
    if _group_denied(ctx, READ, req.group_id):
        return JoinGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, generation_id=-1,
                                 protocol_name=None if ctx.api_version >= 7 else "", leader="", member_id="",
                                 members=[])
    r = await gc.call(
        gc.join_group, req.group_id, req.member_id, req.group_instance_id, ctx.api_version >= 4, ctx.client_id,
        _client_host(ctx), req.rebalance_timeout_ms if ctx.api_version >= 1 else req.session_timeout_ms,
        req.session_timeout_ms, req.protocol_type, [(p.name, bytes(p.metadata)) for p in req.protocols],
        ctx.api_version >= 9,
    )
    return JoinGroupResponse(
        error_code=r.error,
        generation_id=r.generation_id,
        protocol_type=r.protocol_type,
        protocol_name=r.protocol_name if ctx.api_version >= 7 else (r.protocol_name or ""),
        leader=r.leader_id,
        skip_assignment=r.skip_assignment,
        member_id=r.member_id,
        members=[JoinGroupResponse.JoinGroupResponseMember(member_id=m, group_instance_id=i, metadata=meta)
                 for m, i, meta in r.members],
    )


async def handle_sync_group(ctx: RequestContext, req: SyncGroupRequest) -> SyncGroupResponse:
    gc = ctx.server.group_coordinator
    if ctx.api_version >= 5 and (req.protocol_type is None or req.protocol_name is None):
        # Kafka's areMandatoryProtocolTypeAndNamePresent, checked before authorization and the group.
        return SyncGroupResponse(error_code=ErrorCode.INCONSISTENT_GROUP_PROTOCOL, protocol_type=None,
                                 protocol_name=None, assignment=b"")
    if _group_denied(ctx, READ, req.group_id):
        return SyncGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, protocol_type=None,
                                 protocol_name=None, assignment=b"")
    assignments = {a.member_id: bytes(a.assignment) for a in req.assignments}
    err, assignment, ptype, pname = await gc.call(
        gc.sync_group, req.group_id, req.generation_id, req.member_id, req.group_instance_id,
        req.protocol_type, req.protocol_name, assignments,
    )
    return SyncGroupResponse(error_code=err, protocol_type=ptype, protocol_name=pname, assignment=assignment)


async def handle_heartbeat(ctx: RequestContext, req: HeartbeatRequest) -> HeartbeatResponse:
    gc = ctx.server.group_coordinator
    if _group_denied(ctx, READ, req.group_id):
        return HeartbeatResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    err = await gc.call(gc.heartbeat, req.group_id, req.generation_id, req.member_id, req.group_instance_id)
    return HeartbeatResponse(error_code=err)


async def handle_leave_group(ctx: RequestContext, req: LeaveGroupRequest) -> LeaveGroupResponse:
    gc = ctx.server.group_coordinator
    if _group_denied(ctx, READ, req.group_id):
        return LeaveGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, members=[])
    if ctx.api_version < 3:
        leaving = [(req.member_id, None)]
    else:
        leaving = [(m.member_id, m.group_instance_id) for m in req.members]
    err, results = await gc.call(gc.leave_group, req.group_id, leaving)
    if ctx.api_version < 3:
        return LeaveGroupResponse(error_code=err if err else (results[0] if results else ErrorCode.NONE))
    return LeaveGroupResponse(
        error_code=err,
        members=[LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=e)
                 for (m, i), e in zip(leaving, results, strict=False)],
    )


# ---------------------------------------------------------------- offsets


def partitions_to_commit(server: Any, topics: list[Any], denied: set[str]
                         ) -> tuple[dict[str, list[tuple[int, ErrorCode]]], list[tuple[str, Any]]]:
    """OffsetCommit's and TxnOffsetCommit's checks before the coordinator, in Kafka 3.9's order: each topic's Read
    (`denied`), its existence, then each partition's; refusals per partition as named, by topic in request order,
    and the (topic, partition data) left to commit."""
    refused: dict[str, list[tuple[int, ErrorCode]]] = {}
    left: list[tuple[str, Any]] = []
    for t in topics:
        code = (ErrorCode.TOPIC_AUTHORIZATION_FAILED if t.name in denied
                else None if t.name in server.metadata.topics else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if code is not None:
            refused.setdefault(t.name, []).extend((p.partition_index, code) for p in t.partitions)
            continue
        for p in t.partitions:
            if server.topic_partition_exists(t.name, p.partition_index):
                left.append((t.name, p))
            else:
                refused.setdefault(t.name, []).append((p.partition_index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
    return refused, left


async def handle_offset_commit(ctx: RequestContext, req: OffsetCommitRequest) -> OffsetCommitResponse:
    """Kafka 3.9's KafkaApis.handleOffsetCommitRequest: the group's Read first (every partition as named), then each
    topic's Read and existence (TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION per partition as named), and
    only the partitions left go to the coordinator, which answers each distinct partition once. Nothing left: the
    coordinator is not asked, so no group is created and the group id is not checked."""
    gc = ctx.server.group_coordinator
    R = OffsetCommitResponse
    if _group_denied(ctx, READ, req.group_id):
        return R(topics=[R.OffsetCommitResponseTopic(name=t.name, partitions=[
            R.OffsetCommitResponsePartition(partition_index=p.partition_index,
                                            error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
            for p in t.partitions]) for t in req.topics])
    denied = _topics_denied(ctx, READ, [t.name for t in req.topics])
    refused, left = partitions_to_commit(ctx.server, req.topics, denied)
    answered = {name: [R.OffsetCommitResponsePartition(partition_index=index, error_code=code) for index, code in parts]
                for name, parts in refused.items()}  # Kafka's response builder: one entry per topic
    now = int(time.time() * 1000)
    offsets: dict[tuple[str, int], OffsetAndMetadata] = {}
    for name, p in left:
        ts = p.commit_timestamp if ctx.api_version == 1 and p.commit_timestamp >= 0 else now
        offsets[(name, p.partition_index)] = OffsetAndMetadata(
            p.committed_offset, p.committed_leader_epoch, p.committed_metadata or "", ts)
    if offsets:
        # v0 is the ZooKeeper-era commit, which Kafka 3.9 writes to ZooKeeper without asking the group; kbroker keeps
        # it in __consumer_offsets like a v1 commit without generation (docs/differences-from-kafka.md).
        generation = req.generation_id_or_member_epoch if ctx.api_version >= 1 else -1
        results = await gc.call(gc.commit_offsets, req.group_id, generation, req.member_id, req.group_instance_id,
                                offsets, ctx.api_version)
        for (topic, partition), code in results.items():
            answered.setdefault(topic, []).append(
                R.OffsetCommitResponsePartition(partition_index=partition, error_code=code))
    return R(topics=[R.OffsetCommitResponseTopic(name=name, partitions=parts) for name, parts in answered.items()])


async def _fetch_group(ctx: RequestContext, group_id: str, topics: list[tuple[str, list[int]]] | None,
                       require_stable: bool, member_id: str | None = None, member_epoch: int = -1
                       ) -> tuple[ErrorCode, list[tuple[str, list[tuple[int, int, int, str, ErrorCode]]]]]:
    gc = ctx.server.group_coordinator
    if _group_denied(ctx, DESCRIBE, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, []
    denied = _topics_denied(ctx, DESCRIBE, [t for t, _ in topics]) if topics is not None else set()
    wanted = None if topics is None else [(t, p) for t, ps in topics if t not in denied for p in ps]
    err, found = await gc.call(gc.fetch_offsets, group_id, wanted, require_stable, member_id, member_epoch)
    if err:
        return err, []
    by_topic: dict[str, list[tuple[int, int, int, str, ErrorCode]]] = {}
    if topics is not None:
        # Kafka's coordinator answers from a map by partition: a partition named twice once, one entry per topic,
        # none for a topic naming no partition; refused topics follow, as the request named them.
        order = list(dict.fromkeys((t, p) for t, ps in topics if t not in denied for p in ps))
    else:
        order = sorted(found)
        if ctx.server.authorizer is not None:
            # All of the group's offsets: those of topics the principal may not describe are left out.
            allowed = ctx.authorized_names(DESCRIBE, TOPIC, {t for t, _ in order}, log_denied=False)
            order = [(t, p) for t, p in order if t in allowed]
    for t, p in order:
        o = found.get((t, p))
        if o is None:
            by_topic.setdefault(t, []).append((p, -1, -1, "", ErrorCode.NONE))
        elif isinstance(o, ErrorCode):
            # UNSTABLE_OFFSET_COMMIT (KIP-447): a transaction commits an offset here; the consumer retries.
            by_topic.setdefault(t, []).append((p, -1, -1, "", o))
        else:
            by_topic.setdefault(t, []).append((p, o.offset, o.leader_epoch, o.metadata, ErrorCode.NONE))
    refused = [(t, [(p, -1, -1, "", ErrorCode.TOPIC_AUTHORIZATION_FAILED) for p in ps])
               for t, ps in topics or [] if t in denied]
    return ErrorCode.NONE, list(by_topic.items()) + refused


async def handle_offset_fetch(ctx: RequestContext, req: OffsetFetchRequest) -> OffsetFetchResponse:
    R = OffsetFetchResponse
    if ctx.api_version < 8:
        topics = None if req.topics is None else [(t.name, list(t.partition_indexes)) for t in req.topics]
        # require_stable exists from v7; for older versions it reads as False.
        err, result = await _fetch_group(ctx, req.group_id, topics, req.require_stable)
        if err and ctx.api_version < 2:
            # v0-1 have no top-level error: report it on every requested partition.
            result = [(t, [(p, -1, -1, "", err) for p in ps]) for t, ps in (topics or [])]
        return R(error_code=err, topics=[
            R.OffsetFetchResponseTopic(name=t, partitions=[
                R.OffsetFetchResponsePartition(partition_index=p, committed_offset=o, committed_leader_epoch=e,
                                               metadata=m, error_code=pe) for p, o, e, m, pe in parts])
            for t, parts in result])
    groups = []
    for g in req.groups:
        topics = None if g.topics is None else [(t.name, list(t.partition_indexes)) for t in g.topics]
        err, result = await _fetch_group(ctx, g.group_id, topics, req.require_stable, g.member_id, g.member_epoch)
        groups.append(R.OffsetFetchResponseGroup(group_id=g.group_id, error_code=err, topics=[
            R.OffsetFetchResponseTopics(name=t, partitions=[
                R.OffsetFetchResponsePartitions(partition_index=p, committed_offset=o, committed_leader_epoch=e,
                                                metadata=m, error_code=pe) for p, o, e, m, pe in parts])
            for t, parts in result]))
    return R(groups=groups)


async def handle_offset_delete(ctx: RequestContext, req: OffsetDeleteRequest) -> OffsetDeleteResponse:
    gc = ctx.server.group_coordinator
    R = OffsetDeleteResponse
    if _group_denied(ctx, DELETE, req.group_id):
        return R(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    denied = _topics_denied(ctx, READ, [t.name for t in req.topics])
    # Kafka's handleOffsetDeleteRequest: partitions the metadata does not know are answered before the group.
    topics = ctx.server.metadata.topics
    unknown = {(t.name, p.partition_index) for t in req.topics if t.name not in denied for p in t.partitions
               if (rec := topics.get(t.name)) is None or not 0 <= p.partition_index < rec.num_partitions}
    tps = [(t.name, p.partition_index) for t in req.topics if t.name not in denied for p in t.partitions
           if (t.name, p.partition_index) not in unknown]
    err, results = await gc.call(gc.delete_offsets, req.group_id, tps)
    if err:
        return R(error_code=err)
    results.update(dict.fromkeys(unknown, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
    for t in req.topics:
        if t.name in denied:
            for p in t.partitions:
                results[(t.name, p.partition_index)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    # Kafka answers from a map by partition: one entry per topic and partition, none for a topic naming none.
    by_topic: dict[str, dict[int, ErrorCode]] = {}
    for (name, partition), code in results.items():
        by_topic.setdefault(name, {})[partition] = code
    return R(error_code=0, topics=[
        R.OffsetDeleteResponseTopic(name=name, partitions=[
            R.OffsetDeleteResponsePartition(partition_index=p, error_code=code) for p, code in parts.items()])
        for name, parts in by_topic.items()])


# ---------------------------------------------------------------- admin


async def handle_describe_groups(ctx: RequestContext, req: DescribeGroupsRequest) -> DescribeGroupsResponse:
    gc = ctx.server.group_coordinator
    R = DescribeGroupsResponse
    out = []
    authz = ctx.server.authorizer
    for gid in req.groups:
        if authz is not None and not ctx.authorized(DESCRIBE, GROUP, gid):
            out.append(R.DescribedGroup(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, group_id=gid, group_state="",
                                        protocol_type="", protocol_data="", members=[],
                                        authorized_operations=-(2**31)))
            continue
        err, g = await gc.call(gc.describe_group, gid)
        if not req.include_authorized_operations:
            ops = -(2**31)
        else:
            ops = GROUP_OPERATIONS if authz is None else ctx.authorized_operations(GROUP, gid)
        if err or g is None or g.consumer is not None or g.streams is not None:
            # A KIP-848 consumer group is not a classic group: Kafka 3.9 describes it as Dead here (clients use
            # ConsumerGroupDescribe for it).
            out.append(R.DescribedGroup(error_code=err, group_id=gid, group_state=GroupState.DEAD.value,
                                        protocol_type="", protocol_data="", members=[], authorized_operations=ops))
            continue
        stable = g.state is GroupState.STABLE
        members = [
            R.DescribedGroupMember(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata_for(g.protocol_name) if stable and g.protocol_name else b"",
                member_assignment=m.assignment if stable else b"",
            )
            for m in g.members.values()
        ]
        out.append(R.DescribedGroup(
            error_code=0, group_id=gid, group_state=g.state.value, protocol_type=g.protocol_type or "",
            protocol_data=(g.protocol_name or "") if stable or g.state is GroupState.COMPLETING_REBALANCE else "",
            members=members, authorized_operations=ops))
    return R(groups=out)


async def handle_list_groups(ctx: RequestContext, req: ListGroupsRequest) -> ListGroupsResponse:
    gc = ctx.server.group_coordinator
    err, groups = await gc.call(gc.list_groups)
    if ctx.server.authorizer is not None and not ctx.authorized(DESCRIBE, ResourceType.CLUSTER, log_denied=False):
        # Kafka: Describe on the cluster lists every group, otherwise only the groups one may describe.
        allowed = ctx.authorized_names(DESCRIBE, GROUP, (g.group_id for g in groups), log_denied=False)
        groups = [g for g in groups if g.group_id in allowed]
    states = {s.lower() for s in req.states_filter} if ctx.api_version >= 4 else set()
    types = {t.lower() for t in req.types_filter} if ctx.api_version >= 5 else set()
    R = ListGroupsResponse
    listed = []
    for g in groups:
        # A KIP-848 group lists with its own state names and type (Kafka's ListGroups v5).
        if g.streams is not None:
            state, group_type = g.streams.state.value, "streams"
        else:
            state = g.consumer.state.value if g.consumer is not None else g.state.value
            group_type = "consumer" if g.consumer is not None else "classic"
        if (states and state.lower() not in states) or (types and group_type not in types):
            continue
        listed.append(R.ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type or "", group_state=state,
                                    group_type=group_type))
    listed += await _share_groups_listed(ctx, states, types)
    return R(error_code=err, groups=listed)


async def _share_groups_listed(ctx: RequestContext, states: set[str], types: set[str]) -> list[Any]:
    """KIP-932 share groups in ListGroups: type `share`, protocol type `share`."""
    spm = SharePartitionManager.existing(ctx.server)
    if spm is None or (types and "share" not in types):
        return []
    shares = await spm.call(spm.list_groups)
    if ctx.server.authorizer is not None and not ctx.authorized(DESCRIBE, ResourceType.CLUSTER, log_denied=False):
        allowed = ctx.authorized_names(DESCRIBE, GROUP, (g for g, _ in shares), log_denied=False)
        shares = [(g, s) for g, s in shares if g in allowed]
    R = ListGroupsResponse
    return [R.ListedGroup(group_id=g, protocol_type="share", group_state=s, group_type="share")
            for g, s in shares if not states or s.lower() in states]


async def handle_delete_groups(ctx: RequestContext, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
    gc = ctx.server.group_coordinator
    denied = set()
    if ctx.server.authorizer is not None:
        denied = set(req.groups_names) - ctx.authorized_names(DELETE, GROUP, req.groups_names)
    wanted = [g for g in req.groups_names if g not in denied]
    spm = SharePartitionManager.existing(ctx.server)
    shares = await spm.call(spm.delete_groups, wanted) if spm is not None else {}
    results = await gc.call(gc.delete_groups, [g for g in wanted if g not in shares])
    results.update(shares)
    results.update({g: ErrorCode.GROUP_AUTHORIZATION_FAILED for g in denied})
    R = DeleteGroupsResponse
    # Kafka answers from a map by group id: a repeated id is answered once.
    return R(results=[R.DeletableGroupResult(group_id=g, error_code=results[g]) for g in dict.fromkeys(req.groups_names)])


HANDLERS = [
    ApiHandler(8, 0, 9, handle_offset_commit),
    ApiHandler(9, 0, 9, handle_offset_fetch),
    ApiHandler(10, 0, 6, handle_find_coordinator),
    ApiHandler(11, 0, 9, handle_join_group),
    ApiHandler(12, 0, 4, handle_heartbeat),
    ApiHandler(13, 0, 5, handle_leave_group),
    ApiHandler(14, 0, 5, handle_sync_group),
    ApiHandler(15, 0, 5, handle_describe_groups),
    ApiHandler(16, 0, 5, handle_list_groups),
    ApiHandler(42, 0, 2, handle_delete_groups),
    ApiHandler(47, 0, 0, handle_offset_delete),
]

"""Metadata (key 3) and DescribeCluster (key 60)."""

from __future__ import annotations

from kbroker.broker import metadata_answers
from kbroker.broker.admin_manager import INTERNAL_TOPICS, validate_topic_name
from kbroker.broker.apis import NOT_DIRECT, ApiHandler, KafkaApis, RequestContext
from kbroker.broker.network import Response
from kbroker.broker.security.acls import SUPPORTED_OPERATIONS, AclOperation, ResourceType, bit_field
from kbroker.coordinator.metadata_store import NO_LEADER, PartitionState, TopicRecord
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import (
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
    MetadataRequest,
    MetadataResponse,
)

# Without an authorizer every operation is allowed (Kafka's AuthHelper.authorizedOperations).
TOPIC_OPERATIONS = bit_field(SUPPORTED_OPERATIONS[ResourceType.TOPIC])
CLUSTER_OPERATIONS = bit_field(SUPPORTED_OPERATIONS[ResourceType.CLUSTER])
NOT_REQUESTED = -(2**31)


def _topic_operations(ctx: RequestContext, name: str) -> int:
    return TOPIC_OPERATIONS if ctx.server.authorizer is None else ctx.authorized_operations(ResourceType.TOPIC, name)


def cluster_operations(ctx: RequestContext) -> int:
    """Kafka: the cluster's authorized operations, or none at all without Describe on the cluster."""
    if ctx.server.authorizer is None:
        return CLUSTER_OPERATIONS
    if not ctx.authorized(AclOperation.DESCRIBE, ResourceType.CLUSTER, log_denied=False):
        return 0
    return ctx.authorized_operations(ResourceType.CLUSTER)


def partition_metadata(i: int, ps: PartitionState, live: frozenset[int] | set[int]
                       ) -> MetadataResponse.MetadataResponsePartition:
    """Kafka's ZkMetadataCache.getPartitionMetadata: no live leader is LEADER_NOT_AVAILABLE with leader -1;
    replicas on brokers that are not alive are offline."""
    leader = ps.leader
    error = ErrorCode.NONE
    if leader not in live:
        error, leader = ErrorCode.LEADER_NOT_AVAILABLE, NO_LEADER
    return MetadataResponse.MetadataResponsePartition(
        error_code=error,
        partition_index=i,
        leader_id=leader,
        leader_epoch=ps.leader_epoch,
        replica_nodes=list(ps.replicas),
        isr_nodes=list(ps.isr),
        offline_replicas=[b for b in ps.replicas if b not in live or b in ps.offline_replicas],
    )


def topic_metadata(rec: TopicRecord, ops: int, live: frozenset[int] | set[int]) -> MetadataResponse.MetadataResponseTopic:
    parts = [partition_metadata(i, ps, live) for i, ps in enumerate(rec.partitions)]
    return MetadataResponse.MetadataResponseTopic(
        error_code=0,
        name=rec.name,
        topic_id=rec.topic_id,
        is_internal=rec.name in INTERNAL_TOPICS,
        partitions=parts,
        topic_authorized_operations=ops,
    )


def _mark_offline(tm: MetadataResponse.MetadataResponseTopic, offline: set[tuple[str, int]], broker_id: int) -> None:
    """The embedded single node is its own controller: a partition whose log dir failed has no leader left, as
    Kafka's controller decides once the broker reports the failed dir (LEADER_NOT_AVAILABLE, replica offline)."""
    for pm in tm.partitions:
        if (tm.name, pm.partition_index) in offline:
            pm.error_code, pm.leader_id = ErrorCode.LEADER_NOT_AVAILABLE, NO_LEADER
            if broker_id not in pm.offline_replicas:
                pm.offline_replicas = [*pm.offline_replicas, broker_id]


def _error_topic(name: str | None, code: ErrorCode, topic_id: bytes = bytes(16)) -> MetadataResponse.MetadataResponseTopic:
    return MetadataResponse.MetadataResponseTopic(error_code=code, name=name, topic_id=topic_id, partitions=[])


def handle_metadata(ctx: RequestContext, req: MetadataRequest) -> MetadataResponse:
    server = ctx.server
    store = server.metadata
    v = ctx.api_version
    include_ops = bool(req.include_topic_authorized_operations)
    authz = server.authorizer
    live = set(store.live_brokers())

    offline = server.log_manager.offline_partitions if not hasattr(store, "apply_partition_states") else None

    def described(rec: TopicRecord) -> MetadataResponse.MetadataResponseTopic:
        tm = topic_metadata(rec, _topic_operations(ctx, rec.name) if include_ops else NOT_REQUESTED, live)
        if offline:
            _mark_offline(tm, offline, server.broker_id)
        return tm

    topics: list[MetadataResponse.MetadataResponseTopic] = []
    if v < 12 and req.topics and any(t.name is None or (v >= 10 and t.topic_id != bytes(16)) for t in req.topics):
        # Topic ids in Metadata requests need v12 (v10-11 carry the field, not the feature). Kafka refuses the
        # whole request (InvalidRequestException): every topic INVALID_REQUEST, no brokers, no cluster id.
        return MetadataResponse(throttle_time_ms=0, brokers=[], cluster_id=None, controller_id=-1, topics=[
            _error_topic(t.name or "", ErrorCode.INVALID_REQUEST, t.topic_id) for t in req.topics])
    if v >= 12 and req.topics and any(t.topic_id != bytes(16) for t in req.topics):
        # Kafka: once any topic id is named, the request is by topic id alone (names and zero ids are ignored).
        ids = dict.fromkeys(t.topic_id for t in req.topics if t.topic_id != bytes(16))
        req.topics = [MetadataRequest.MetadataRequestTopic(topic_id=i, name=None) for i in ids]
    elif req.topics:
        # Kafka reads the names as a set: a topic named twice is answered once.
        if all(t.name is not None for t in req.topics):
            req.topics = list({t.name: t for t in req.topics}.values())
    if req.topics is None or (v == 0 and not req.topics):
        records = list(store.topics.values())
        if authz is not None:
            # All topics: those the principal may not describe are left out, not reported.
            allowed = ctx.authorized_names(AclOperation.DESCRIBE, ResourceType.TOPIC, (r.name for r in records),
                                           log_denied=False)
            records = [r for r in records if r.name in allowed]
        topics = [described(rec) for rec in records]
    else:
        auto = req.allow_auto_topic_creation if v >= 4 else True
        names_by_id = server.topic_names_by_id() if v >= 12 else {}
        describable: set[str] = set()
        if authz is not None:
            wanted = [t.name if t.name is not None else names_by_id.get(t.topic_id) for t in req.topics]
            describable = ctx.authorized_names(AclOperation.DESCRIBE, ResourceType.TOPIC, wanted)
        for t in req.topics:
            if t.name is None:
                name = names_by_id.get(t.topic_id)
                rec = store.topics.get(name) if name is not None else None
                if rec is None:
                    topics.append(_error_topic(None, ErrorCode.UNKNOWN_TOPIC_ID, t.topic_id))
                elif authz is not None and rec.name not in describable:
                    # Topic ids are not secret, names are: Kafka answers without the name.
                    topics.append(_error_topic(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED, t.topic_id))
                else:
                    topics.append(described(rec))
                continue
            if authz is not None and t.name not in describable:
                # Whether the topic exists is not disclosed either.
                topics.append(_error_topic(t.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            rec = store.topics.get(t.name)
            if rec is None:
                if (authz is not None and auto and server.config["auto.create.topics.enable"]
                        and validate_topic_name(t.name) is None and t.name not in INTERNAL_TOPICS
                        and not ctx.authorized(AclOperation.CREATE, ResourceType.CLUSTER, log_denied=False)
                        and not ctx.authorized(AclOperation.CREATE, ResourceType.TOPIC, t.name)):
                    topics.append(_error_topic(t.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    continue
                rec, code = _maybe_create(ctx, t.name, auto)
                if rec is None:
                    topics.append(_error_topic(t.name, code))
                    continue
            topics.append(described(rec))
    brokers = [
        MetadataResponse.MetadataResponseBroker(node_id=b, host=h, port=p, rack=r) for b, h, p, r in server.brokers(ctx.conn.listener_name)
    ]
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=brokers,
        cluster_id=store.cluster_id,
        controller_id=server.controller_id(),
        topics=topics,
        cluster_authorized_operations=cluster_operations(ctx) if req.include_cluster_authorized_operations
        else NOT_REQUESTED,
    )


def metadata_direct(ctx: RequestContext, frame: bytes | bytearray, pos: int) -> Response:
    """Metadata's direct path: the remembered answer to the same request while the state it was built from is the
    same (broker/metadata_answers.py); else handle_metadata's, remembered when it may be. NOT_DIRECT (the general
    path) with the switch off, with an authorizer that keeps no generation, and for bytes that do not decode (the
    general path refuses them). With an authorizer the answer (which topics are visible, the authorized
    operations) is the principal's: remembered per principal, host and ACL generation (bumped by every ACL change,
    here or from another broker, before which it is read: see AclAuthorizer.generation)."""
    server = ctx.server
    if not metadata_answers.ENABLED:
        return NOT_DIRECT
    header = ctx.header
    conn = ctx.conn
    authz = server.authorizer
    who = None
    if authz is not None:
        generation = getattr(authz, "generation", None)
        if generation is None:
            return NOT_DIRECT
        who = (conn.principal, ctx.client_host, generation)
    key: metadata_answers.AnswerKey = (header.request_api_version, conn.listener_name, bytes(frame[pos:]), who)
    state = metadata_answers.answer_state(server)
    answers = server.metadata_answers
    if state is not None:
        frame_out = answers.get(key, state, header.correlation_id)
        if frame_out is not None:
            return Response(frame_out)
    try:
        req, _ = codec.decode(MetadataRequest, header.request_api_version, frame, pos)
    except codec.DecodeError:
        return NOT_DIRECT
    body = handle_metadata(ctx, req)
    response = KafkaApis.encode(header, body)
    if state is not None and response.ext is None and metadata_answers.error_free(body):
        after = metadata_answers.answer_state(server)
        if after is not None and metadata_answers.same_state(state, after):
            answers.put(key, state, response.frame)
    return response


def _maybe_create(ctx: RequestContext, name: str, allowed: bool) -> tuple[TopicRecord | None, ErrorCode]:
    if validate_topic_name(name) is not None:
        return None, ErrorCode.INVALID_TOPIC_EXCEPTION
    if not (allowed and ctx.server.config["auto.create.topics.enable"]) or name in INTERNAL_TOPICS:
        return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    try:
        return ctx.server.admin.auto_create(name), ErrorCode.NONE
    except KafkaError as e:
        return None, e.code


def handle_describe_cluster(ctx: RequestContext, req: DescribeClusterRequest) -> DescribeClusterResponse:
    server = ctx.server
    if ctx.api_version >= 1 and req.endpoint_type != 1:
        return DescribeClusterResponse(
            error_code=ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
            error_message="kbroker serves only broker endpoints (endpoint type 1)",
            endpoint_type=1,  # Kafka's answer names the endpoint it is (brokers), not the one asked for
            cluster_id=server.metadata.cluster_id,
        )
    brokers = [
        DescribeClusterResponse.DescribeClusterBroker(broker_id=b, host=h, port=p, rack=r)
        for b, h, p, r in server.brokers(ctx.conn.listener_name)
    ]
    return DescribeClusterResponse(
        error_code=0,
        error_message=None,
        endpoint_type=1,
        cluster_id=server.metadata.cluster_id,
        controller_id=server.controller_id(),
        brokers=brokers,
        cluster_authorized_operations=cluster_operations(ctx) if req.include_cluster_authorized_operations
        else NOT_REQUESTED,
    )


# Kafka's max.request.partition.size.limit: the most partitions one DescribeTopicPartitions answer holds.
MAX_PARTITIONS_PER_ANSWER = 2000


def handle_describe_topic_partitions(ctx: RequestContext, req: DescribeTopicPartitionsRequest
                                     ) -> DescribeTopicPartitionsResponse:
    """KIP-966's paginated DescribeTopicPartitions: topics sorted by name from the cursor on, at most
    response_partition_limit partitions, then a cursor to the next one."""
    R = DescribeTopicPartitionsResponse
    store = ctx.server.metadata
    topics = store.topics
    names = sorted({t.name for t in req.topics}) if req.topics else sorted(topics)
    denied: set[str] = set()
    if ctx.server.authorizer is not None:
        # As Metadata: listed topics one may not describe are left out, named ones answer the refusal.
        allowed = ctx.authorized_names(AclOperation.DESCRIBE, ResourceType.TOPIC, names, log_denied=bool(req.topics))
        if req.topics:
            denied = set(names) - allowed
        else:
            names = [n for n in names if n in allowed]
    cursor = req.cursor
    if cursor is not None:
        if req.topics and cursor.topic_name not in names:
            return R(topics=[R.DescribeTopicPartitionsResponseTopic(
                error_code=ErrorCode.INVALID_REQUEST, name=cursor.topic_name, partitions=[])])
        names = [n for n in names if n >= cursor.topic_name]
    limit = max(1, min(req.response_partition_limit, MAX_PARTITIONS_PER_ANSWER))
    live = set(store.live_brokers())
    out: list[R.DescribeTopicPartitionsResponseTopic] = []
    next_cursor: R.Cursor | None = None
    for name in names:
        rec = topics.get(name)
        if name in denied or rec is None:
            out.append(R.DescribeTopicPartitionsResponseTopic(
                error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED if name in denied
                else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name, partitions=[]))
            continue
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        parts = []
        for i in range(max(0, first), rec.num_partitions):
            if limit == 0:
                next_cursor = R.Cursor(topic_name=name, partition_index=i)
                break
            pm = partition_metadata(i, rec.partitions[i], live)
            parts.append(R.DescribeTopicPartitionsResponsePartition(
                error_code=pm.error_code, partition_index=i, leader_id=pm.leader_id, leader_epoch=pm.leader_epoch,
                replica_nodes=pm.replica_nodes, isr_nodes=pm.isr_nodes, eligible_leader_replicas=[],
                last_known_elr=[], offline_replicas=pm.offline_replicas))
            limit -= 1
        out.append(R.DescribeTopicPartitionsResponseTopic(
            error_code=0, name=name, topic_id=rec.topic_id, is_internal=name in INTERNAL_TOPICS, partitions=parts,
            topic_authorized_operations=_topic_operations(ctx, name)))
        if next_cursor is not None:
            break
        if limit == 0 and name != names[-1]:
            next_cursor = R.Cursor(topic_name=names[names.index(name) + 1], partition_index=0)
            break
    return R(throttle_time_ms=0, topics=out, next_cursor=next_cursor)


HANDLERS = [
    ApiHandler(3, 0, 12, handle_metadata, direct=metadata_direct),
    ApiHandler(75, 0, 0, handle_describe_topic_partitions),
    ApiHandler(60, 0, 1, handle_describe_cluster),
]

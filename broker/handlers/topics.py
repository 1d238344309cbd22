"""CreateTopics (19), DeleteTopics (20), CreatePartitions (37), DeleteRecords (21)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kbroker.broker.admin_manager import (
    EXCESSIVE_PARTITIONS,
    INTERNAL_TOPICS,
    MAX_PARTITIONS_PER_REQUEST,
    check_assignment,
    total_requested_partitions,
)
from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.replica_manager import error_of
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.broker.topic_config import describe_topic
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)

log = logging.getLogger("kbroker.admin")


def _not_controller(ctx: RequestContext) -> bool:
    return ctx.server.controller_id() != ctx.server.broker_id


def _leaders_elected(ctx: RequestContext, topic: str, partitions: range | None = None) -> bool:
    rec = ctx.server.metadata.topics.get(topic)
    if rec is None:
        return False
    leaders = rec.leaders
    return all(leaders[p] >= 0 for p in (partitions or range(len(leaders))) if p < len(leaders))


async def _await_leaders(ctx: RequestContext, response: Any, waiting: list[tuple[Any, range | None]],
                         timeout_ms: int) -> Any:
    """Kafka's DelayedCreatePartitions: answer once this broker's metadata names a leader for every new
    partition (the controller elects them after the assignment is written), or REQUEST_TIMED_OUT."""
    deadline = time.monotonic() + timeout_ms / 1000
    pending = list(waiting)
    while pending and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        pending = [(res, parts) for res, parts in pending if not _leaders_elected(ctx, res.name, parts)]
    for res, _ in pending:
        res.error_code = ErrorCode.REQUEST_TIMED_OUT
        res.error_message = "Leaders of the new partitions were not elected within the request timeout."
    return response


def _waits_for_leaders(ctx: RequestContext, validate_only: bool, timeout_ms: int) -> bool:
    return ctx.server.controller is not None and not validate_only and timeout_ms > 0


def _denied(ctx: RequestContext, op: AclOperation, names: list[str | None]) -> set[str]:
    """The topics of the request the principal may not do op on (none without an authorizer)."""
    if ctx.server.authorizer is None:
        return set()
    return {n for n in names if n is not None} - ctx.authorized_names(op, ResourceType.TOPIC, names)


def _topic_denied() -> KafkaError:
    return KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")


async def handle_create_topics(ctx: RequestContext, req: CreateTopicsRequest) -> CreateTopicsResponse:
    admin = ctx.server.admin
    R = CreateTopicsResponse
    results = []
    seen: dict[str, int] = {}
    for t in req.topics:
        seen[t.name] = seen.get(t.name, 0) + 1
    denied: set[str] = set()
    no_configs: set[str] = set()
    if ctx.server.authorizer is not None:
        names: list[str | None] = [t.name for t in req.topics]
        # Kafka: Create on the cluster covers every topic; otherwise Create on each topic.
        if not ctx.authorized(AclOperation.CREATE, ResourceType.CLUSTER, log_denied=False):
            denied = _denied(ctx, AclOperation.CREATE, names)
        no_configs = _denied(ctx, AclOperation.DESCRIBE_CONFIGS, names)
    total = total_requested_partitions(
        [(t.num_partitions, len(t.assignments)) for t in req.topics], ctx.server.config["num.partitions"])
    if total > MAX_PARTITIONS_PER_REQUEST and not _not_controller(ctx):
        # Kafka's controller refuses the whole request before looking at any topic.
        ctx.refused(ErrorCode.POLICY_VIOLATION, EXCESSIVE_PARTITIONS, f"{total} partitions")
        return R(throttle_time_ms=0, topics=[
            R.CreatableTopicResult(name=t.name, error_code=ErrorCode.POLICY_VIOLATION,
                                   error_message=EXCESSIVE_PARTITIONS, configs=None)
            for t in req.topics])
    loop = asyncio.get_running_loop()
    for t in req.topics:
        res = R.CreatableTopicResult(name=t.name, error_code=0, error_message=None)
        results.append(res)
        try:
            if t.name in denied:
                raise _topic_denied()
            if _not_controller(ctx):
                raise KafkaError(ErrorCode.NOT_CONTROLLER)
            if seen[t.name] > 1:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"Create topics request from client contains a duplicate topic: {t.name}")
            configs = {c.name: c.value for c in t.configs}
            assignment = None
            num_partitions, replication_factor = t.num_partitions, t.replication_factor
            if t.assignments:
                if num_partitions != -1 or replication_factor != -1:
                    raise KafkaError(
                        ErrorCode.INVALID_REQUEST,
                        "Both numPartitions or replicationFactor and replicasAssignments were set. "
                        "Both cannot be used at the same time.",
                    )
                assignment = _replicas_from_assignment(ctx, t.assignments)
                num_partitions, replication_factor = len(assignment), len(assignment[0])
            n, rf, _ = admin.check_new_topic(t.name, num_partitions, replication_factor, configs)
            if not req.validate_only:
                # Thousands of partitions take seconds of file system work: off the network thread.
                rec = await loop.run_in_executor(ctx.server.io_pool, admin.create_topic, t.name, n, rf, configs,
                                                 assignment)
                res.topic_id = rec.topic_id
            res.num_partitions = n
            res.replication_factor = rf
            if ctx.api_version >= 5 and t.name in no_configs:
                # Created, but the principal may not see its configs (Kafka's topic_config_error_code).
                res.topic_config_error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                res.configs = []
            elif ctx.api_version >= 5:
                res.configs = [
                    R.CreatableTopicConfigs(
                        name=d.name, value=d.value, read_only=False, config_source=d.source,
                        is_sensitive=False,
                    )
                    for d in describe_topic(ctx.server.config, {k: str(v) for k, v in configs.items()},
                                            ctx.server.metadata.default_broker_configs,
                                            ctx.server.metadata.own_broker_configs)
                ]
        except KafkaError as e:
            res.error_code = e.code
            res.error_message = e.message or None
            ctx.refused(e.code, e.message, f"topic {res.name!r}")
            res.configs = []  # Kafka's KafkaApis resets a failed topic's configs to an empty list, not null
        except Exception as e:  # noqa: BLE001
            log.exception("CreateTopics %s failed", t.name)
            res.error_code = error_of(e)
            res.error_message = str(e)
            res.configs = []
    response = R(throttle_time_ms=0, topics=results)
    if _waits_for_leaders(ctx, req.validate_only, req.timeout_ms):
        waiting = [(res, None) for res in results if res.error_code == 0]
        if waiting:
            return await _await_leaders(ctx, response, waiting, req.timeout_ms)
    return response


def _replicas_from_assignment(ctx: RequestContext,
                              assignments: list[CreateTopicsRequest.CreatableReplicaAssignment]) -> list[list[int]]:
    by_partition = {a.partition_index: list(a.broker_ids) for a in assignments}
    if sorted(by_partition) != list(range(len(by_partition))):
        raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Partitions should be a consecutive 0-based integer sequence")
    out = [by_partition[p] for p in range(len(by_partition))]
    check_assignment(out, set(ctx.server.metadata.live_brokers()))
    return out


def handle_delete_topics(ctx: RequestContext, req: DeleteTopicsRequest) -> DeleteTopicsResponse:
    R = DeleteTopicsResponse
    if ctx.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(n, bytes(16)) for n in req.topic_names]
    ids = ctx.server.topic_names_by_id()
    authz = ctx.server.authorizer
    results = []
    for name, topic_id in wanted:
        res = R.DeletableTopicResult(name=name, topic_id=topic_id, error_code=0)
        results.append(res)
        try:
            if _not_controller(ctx):
                raise KafkaError(ErrorCode.NOT_CONTROLLER)
            if name is None:
                name = ids.get(topic_id)
                if name is None:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID)
                if authz is not None and not ctx.authorized(AclOperation.DESCRIBE, ResourceType.TOPIC, name):
                    raise _topic_denied()  # the name stays undisclosed, the id is not secret
                res.name = name
            if authz is not None and not ctx.authorized(AclOperation.DELETE, ResourceType.TOPIC, name):
                raise _topic_denied()
            if name in INTERNAL_TOPICS:
                # Every group's offsets or every transactional id would go with it (Kafka's own topic tool refuses
                # this in the same words).
                raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                                 f"Topic {name} is a kafka internal topic and is not allowed to be marked for deletion.")
            if topic_id == bytes(16):
                rec = ctx.server.metadata.topics.get(name)
                if rec is not None:
                    res.topic_id = rec.topic_id
            ctx.server.admin.delete_topic(name)
        except KafkaError as e:
            res.error_code = e.code
            res.error_message = e.message or None
            ctx.refused(e.code, e.message, f"topic {res.name!r}")
    return R(throttle_time_ms=0, responses=results)


def handle_create_partitions(ctx: RequestContext, req: CreatePartitionsRequest) -> Any:
    R = CreatePartitionsResponse
    denied = _denied(ctx, AclOperation.ALTER, [t.name for t in req.topics])
    results = []
    waiting: list[tuple[Any, range | None]] = []
    for t in req.topics:
        res = R.CreatePartitionsTopicResult(name=t.name, error_code=0, error_message=None)
        results.append(res)
        try:
            if t.name in denied:
                raise _topic_denied()
            if _not_controller(ctx):
                raise KafkaError(ErrorCode.NOT_CONTROLLER)
            if t.name in INTERNAL_TOPICS:
                # Groups and transactional ids are hashed onto the partitions: more partitions would move them
                # away from their offsets and transaction states.
                raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                                 f"The number of partitions of internal topic {t.name} cannot be changed.")
            assignments = None if t.assignments is None else [a.broker_ids for a in t.assignments]
            ctx.server.admin.create_partitions(t.name, t.count, assignments, req.validate_only)
            waiting.append((res, range(0, t.count)))
        except KafkaError as e:
            res.error_code = e.code
            res.error_message = e.message or None
            ctx.refused(e.code, e.message, f"topic {res.name!r}")
    response = R(throttle_time_ms=0, results=results)
    if waiting and _waits_for_leaders(ctx, req.validate_only, req.timeout_ms):
        return _await_leaders(ctx, response, waiting, req.timeout_ms)
    return response


def handle_delete_records(ctx: RequestContext, req: DeleteRecordsRequest) -> DeleteRecordsResponse:
    R = DeleteRecordsResponse
    rm = ctx.server.replica_manager
    denied = _denied(ctx, AclOperation.DELETE, [t.name for t in req.topics])
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            res = R.DeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=-1, error_code=0)
            if t.name in denied:
                res.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                parts.append(res)
                continue
            try:
                if t.name in INTERNAL_TOPICS:
                    if not _exists(ctx, t.name, p.partition_index):
                        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    # Kafka's ReplicaManager.deleteRecordsOnLocalLog: the coordinators' state lives there.
                    raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                                     f"Cannot delete records of internal topic {t.name}")
                lg = rm.get_log(t.name, p.partition_index)
                offset = p.offset
                if offset == -1:
                    offset = lg.high_watermark
                if offset < 0 or offset > lg.high_watermark:
                    raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE)
                res.low_watermark = lg.delete_records_before(offset)
                log.info("DeleteRecords moved the log start of %s-%d to %d", t.name, p.partition_index, res.low_watermark)
            except Exception as e:  # noqa: BLE001
                res.error_code = error_of(e)
                if res.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION:
                    ctx.refused(res.error_code, str(e), f"partition {t.name}-{p.partition_index}")
            parts.append(res)
        topics.append(R.DeleteRecordsTopicResult(name=t.name, partitions=parts))
    # Kafka answers from a map by partition: one entry per topic and partition, none for a topic naming none.
    merged: dict[str, dict[int, R.DeleteRecordsPartitionResult]] = {}
    for t in topics:
        for p in t.partitions:
            merged.setdefault(t.name, {})[p.partition_index] = p
    return R(throttle_time_ms=0, topics=[R.DeleteRecordsTopicResult(name=n, partitions=list(ps.values()))
                                         for n, ps in merged.items()])


def _exists(ctx: RequestContext, topic: str, partition: int) -> bool:
    rec = ctx.server.metadata.topics.get(topic)
    return rec is not None and 0 <= partition < len(rec.partitions)


HANDLERS = [
    ApiHandler(19, 0, 7, handle_create_topics),
    ApiHandler(20, 0, 6, handle_delete_topics),
    ApiHandler(21, 0, 2, handle_delete_records),
    ApiHandler(37, 0, 3, handle_create_partitions),
]

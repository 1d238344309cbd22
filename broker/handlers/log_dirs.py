"""Log dir APIs (JBOD): DescribeLogDirs (35) and AlterReplicaLogDirs (34), which moves a replica to another log dir."""

from __future__ import annotations

import shutil
from pathlib import Path

from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kbroker.storage.errors import KafkaStorageError, LogDirNotFoundError
from kbroker.storage.manager import TopicPartition

DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
# Kafka refuses a move whose future directory name (<topic>-<p>.<32 hex>-future) would not fit a file name.
_MAX_DIR_NAME = 255


def _cluster_denied(ctx: RequestContext, op: AclOperation) -> bool:
    return ctx.server.authorizer is not None and not ctx.authorized(op, ResourceType.CLUSTER)


# ---------------------------------------------------------------- AlterReplicaLogDirs


def _alter_one(ctx: RequestContext, tp: TopicPartition, path: str) -> ErrorCode:
    """Kafka's ReplicaManager.alterReplicaLogDirs for one partition."""
    server = ctx.server
    lm = server.log_manager
    topic, p = tp
    if len(f"{topic}-{p}.{'0' * 32}-future") > _MAX_DIR_NAME:
        return ErrorCode.INVALID_TOPIC_EXCEPTION
    try:
        dest = lm.log_dir_named(path)
    except LogDirNotFoundError:
        return ErrorCode.LOG_DIR_NOT_FOUND
    except KafkaStorageError:
        return ErrorCode.KAFKA_STORAGE_ERROR
    if tp in lm.offline_partitions:
        return ErrorCode.KAFKA_STORAGE_ERROR
    # A replica created here later goes to dest (kafka-reassign-partitions sends this before the reassignment).
    lm.maybe_update_preferred_dir(tp, dest)
    rec = server.metadata.topics.get(topic)
    if rec is None or not 0 <= p < len(rec.partitions):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    try:
        if lm.get_log(topic, p) is None:
            if server.broker_id not in rec.partitions[p].replicas:
                return ErrorCode.REPLICA_NOT_AVAILABLE
            server.admin.ensure_log(topic, p)  # created in dest, the preferred dir
        if lm.create_future_log(tp, dest):
            mover = server.replica_manager.log_dir_mover
            if mover is not None:
                mover.start()
                mover.wake()
    except KafkaStorageError:
        return ErrorCode.KAFKA_STORAGE_ERROR
    return ErrorCode.NONE


def handle_alter_replica_log_dirs(
    ctx: RequestContext, req: AlterReplicaLogDirsRequest
) -> AlterReplicaLogDirsResponse:
    R = AlterReplicaLogDirsResponse
    wanted: dict[TopicPartition, str] = {}
    for d in req.dirs:
        for t in d.topics:
            for p in t.partitions:
                wanted[(t.name, p)] = d.path
    if _cluster_denied(ctx, AclOperation.ALTER):
        # Kafka's AlterReplicaLogDirsRequest.getErrorResponse: every topic entry of every dir as named, repeats
        # and empty ones included.
        return R(
            throttle_time_ms=0,
            results=[
                R.AlterReplicaLogDirTopicResult(
                    topic_name=t.name,
                    partitions=[R.AlterReplicaLogDirPartitionResult(partition_index=p, error_code=DENIED)
                                for p in t.partitions],
                )
                for d in req.dirs
                for t in d.topics
            ],
        )
    errors = {tp: _alter_one(ctx, tp, path) for tp, path in wanted.items()}
    by_topic: dict[str, list[R.AlterReplicaLogDirPartitionResult]] = {}
    for (topic, p), code in errors.items():
        by_topic.setdefault(topic, []).append(
            R.AlterReplicaLogDirPartitionResult(partition_index=p, error_code=code)
        )
    return R(
        throttle_time_ms=0,
        results=[R.AlterReplicaLogDirTopicResult(topic_name=t, partitions=ps) for t, ps in by_topic.items()],
    )


# ---------------------------------------------------------------- DescribeLogDirs


def handle_describe_log_dirs(ctx: RequestContext, req: DescribeLogDirsRequest) -> DescribeLogDirsResponse:
    R = DescribeLogDirsResponse
    if _cluster_denied(ctx, AclOperation.DESCRIBE):
        return R(throttle_time_ms=0, error_code=DENIED, results=[])
    lm = ctx.server.log_manager
    wanted: dict[str, set[int]] | None = None
    if req.topics is not None:
        wanted = {}
        for t in req.topics:
            wanted.setdefault(t.topic, set()).update(t.partitions)
    by_dir: dict[Path, dict[str, list[R.DescribeLogDirsPartition]]] = {d: {} for d in lm.log_dirs}
    for lg in lm.logs():
        d = lm.log_dir_of((lg.topic, lg.partition))
        if d is None or (wanted is not None and lg.partition not in wanted.get(lg.topic, ())):
            continue
        # offset_lag as Kafka for a current (not future) replica: how far the high watermark is past the log end.
        by_dir.setdefault(d, {}).setdefault(lg.topic, []).append(
            R.DescribeLogDirsPartition(
                partition_index=lg.partition, partition_size=lg.size, offset_lag=0, is_future_key=False
            )
        )
    for (topic, p), future in lm.future_logs().items():
        if wanted is not None and p not in wanted.get(topic, ()):
            continue
        current = lm.get_log(topic, p) if (topic, p) not in lm.offline_partitions else None
        # A future replica's lag: how far its log end is behind the current replica's (Kafka's getLogEndOffsetLag).
        lag = max(current.log_end_offset - future.log_end_offset, 0) if current is not None else 0
        by_dir.setdefault(future.dir.parent, {}).setdefault(topic, []).append(
            R.DescribeLogDirsPartition(
                partition_index=p, partition_size=future.size, offset_lag=lag, is_future_key=True
            )
        )
    results = []
    for d, topics in by_dir.items():
        path = str(d.resolve())
        if d in lm.offline_dirs:
            results.append(R.DescribeLogDirsResult(error_code=ErrorCode.KAFKA_STORAGE_ERROR, log_dir=path))
            continue
        try:
            usage = shutil.disk_usage(path)
            total, usable = usage.total, usage.free
        except OSError:
            results.append(R.DescribeLogDirsResult(error_code=ErrorCode.KAFKA_STORAGE_ERROR, log_dir=path))
            continue
        results.append(
            R.DescribeLogDirsResult(
                error_code=0,
                log_dir=path,
                total_bytes=total,
                usable_bytes=usable,
                topics=[
                    R.DescribeLogDirsTopic(name=t, partitions=sorted(ps, key=lambda x: x.partition_index))
                    for t, ps in sorted(topics.items())
                ],
            )
        )
    return R(throttle_time_ms=0, error_code=0, results=results)


HANDLERS = [
    ApiHandler(34, 0, 2, handle_alter_replica_log_dirs),
    ApiHandler(35, 0, 4, handle_describe_log_dirs),
]

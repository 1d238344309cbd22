"""Produce (key 0): append record batches as they arrive; offsets are assigned per batch."""

from __future__ import annotations

import logging
from typing import Any

from broker.admin_manager import INTERNAL_TOPICS
from broker.apis import ApiHandler, RequestContext
from broker.replica_manager import error_of
from protocol.errors import ErrorCode
from protocol.messages import ProduceRequest, ProduceResponse
from storage.errors import KafkaStorageError

log = logging.getLogger("kbroker.produce")

PartitionResponse = ProduceResponse.PartitionProduceResponse


def _error(index: int, code: ErrorCode, message: str | None = None) -> PartitionResponse:
    return PartitionResponse(index=index, error_code=code, base_offset=-1, log_append_time_ms=-1,
                             log_start_offset=-1, error_message=message)


def handle_produce(ctx: RequestContext, req: ProduceRequest) -> Any:
    rm = ctx.server.replica_manager
    acks = req.acks
    to_flush: list[tuple[Any, int]] = []
    topics: list[ProduceResponse.TopicProduceResponse] = []
    for t in req.topic_data:
        parts: list[PartitionResponse] = []
        for p in t.partition_data:
            if acks not in (0, 1, -1):
                parts.append(_error(p.index, ErrorCode.INVALID_REQUIRED_ACKS))
                continue
            if t.name in INTERNAL_TOPICS:
                # Only the broker's coordinators write there: a forged record would rewrite a group's offsets or
                # a transaction's state (Kafka's ReplicaManager refuses it the same way).
                parts.append(_error(p.index, ErrorCode.INVALID_TOPIC_EXCEPTION,
                                    f"Cannot append to internal topic {t.name}"))
                continue
            if req.transactional_id is not None:
                parts.append(_error(p.index, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                    "transactions are not supported by kbroker"))
                continue
            if p.records is None or len(p.records) == 0:
                parts.append(_error(p.index, ErrorCode.CORRUPT_MESSAGE, "empty record set"))
                continue
            try:
                lg, info = rm.append(t.name, p.index, p.records, acks)
            except Exception as e:  # noqa: BLE001 - every failure becomes this partition's error code
                code = error_of(e)
                if code == ErrorCode.UNKNOWN_SERVER_ERROR:
                    log.exception("Produce to %s-%d failed", t.name, p.index)
                parts.append(_error(p.index, code, str(e) or None))
                continue
            if rm.needs_flush(lg):
                to_flush.append((lg, info.last_offset))
            parts.append(
                PartitionResponse(
                    index=p.index,
                    error_code=0,
                    base_offset=info.first_offset,
                    log_append_time_ms=info.log_append_time,
                    log_start_offset=info.log_start_offset,
                )
            )
        topics.append(ProduceResponse.TopicProduceResponse(name=t.name, partition_responses=parts))
    throttle = 0
    quota = ctx.server.produce_quota
    if quota.quota_for(ctx.client_id) is not None:  # most clients have none: skip the byte count
        nbytes = sum(len(p.records) for t in req.topic_data for p in t.partition_data if p.records is not None)
        throttle = quota.record_and_get_throttle_ms(ctx.client_id, nbytes)
    if throttle:
        # producer_byte_rate: the data is appended; the client is told to back off and its connection waits.
        ctx.conn.mute_for(throttle)
    response = ProduceResponse(responses=topics, throttle_time_ms=throttle)
    if acks == 0:
        if to_flush:
            rm.flush_in_background(to_flush)
        return None
    if to_flush:
        return _after_flush(rm, to_flush, response)
    return response


async def _after_flush(rm: Any, to_flush: list[tuple[Any, int]], response: ProduceResponse) -> ProduceResponse:
    # With log.flush.interval.messages reached, the ack waits for fsync (group-committed).
    failed: set[tuple[str, int]] = set()
    try:
        await rm.flush(to_flush)
    except (OSError, KafkaStorageError):
        log.error("fsync failed for %s", [f"{lg.topic}-{lg.partition}" for lg, _ in to_flush], exc_info=True)
        failed = {(lg.topic, lg.partition) for lg, _ in to_flush}
    if failed:
        for t in response.responses:
            for i, p in enumerate(t.partition_responses):
                if (t.name, p.index) in failed:
                    t.partition_responses[i] = _error(p.index, ErrorCode.KAFKA_STORAGE_ERROR, "fsync failed")
    return response


HANDLERS = [ApiHandler(0, 3, 11, handle_produce)]

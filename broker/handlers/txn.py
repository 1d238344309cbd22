"""Transaction APIs: AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26), WriteTxnMarkers (27),
TxnOffsetCommit (28), DescribeProducers (61), DescribeTransactions (65), ListTransactions (66).

The handlers translate wire structures; the transaction state machine is
coordinator.TransactionCoordinator, the partition side of markers broker.TxnMarkerChannel.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from kbroker.broker.admin_manager import INTERNAL_TOPICS, validate_topic_name
from kbroker.broker.apis import ApiHandler, RequestContext
from kbroker.broker.handlers.groups import partitions_to_commit
from kbroker.broker.replica_manager import error_of
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.coordinator.group_coordinator import OFFSETS_TOPIC, partition_for
from kbroker.coordinator.group_metadata import OffsetAndMetadata
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    EndTxnRequest,
    EndTxnResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from kbroker.storage.manager import TopicPartition

APR = AddPartitionsToTxnResponse
WRITE, READ, DESCRIBE = AclOperation.WRITE, AclOperation.READ, AclOperation.DESCRIBE
TXN_ID, GROUP, TOPIC = ResourceType.TRANSACTIONAL_ID, ResourceType.GROUP, ResourceType.TOPIC


def _denied(ctx: RequestContext, op: AclOperation, rtype: ResourceType, name: str) -> bool:
    return ctx.server.authorizer is not None and not ctx.authorized(op, rtype, name)


def _unwritable_partitions(ctx: RequestContext, transactional_id: str, tps: list[TopicPartition],
                           from_client: bool = False) -> dict[TopicPartition, ErrorCode] | None:
    """Kafka's AddPartitionsToTxn checks: Write on the transactional id (else every partition fails), Write on
    each topic and the partition's existence (else those partitions fail and the others are not attempted, so the
    producer never starts a transaction whose markers would go to a partition that is not there). None when every
    partition passes. A client (v0-3) may not add an internal topic at all: Kafka leaves them out of the topics it
    authorizes, so they fail TOPIC_AUTHORIZATION_FAILED with or without an authorizer."""
    server = ctx.server
    denied: set[str] = {t for t, _ in tps if t in INTERNAL_TOPICS} if from_client else set()
    if server.authorizer is not None:
        if not ctx.authorized(WRITE, TXN_ID, transactional_id):
            return {tp: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for tp in tps}
        topics = [t for t, _ in tps if t not in denied]
        denied |= set(topics) - ctx.authorized_names(WRITE, TOPIC, topics)
    errors: dict[TopicPartition, ErrorCode] = {}
    for t, p in tps:
        if t in denied:
            errors[(t, p)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif not server.topic_partition_exists(t, p):
            errors[(t, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if not errors:
        return None
    return {tp: errors.get(tp, ErrorCode.OPERATION_NOT_ATTEMPTED) for tp in tps}


def fenced_error(code: ErrorCode, version: int, first_version_with_fenced: int) -> ErrorCode:
    """PRODUCER_FENCED is new in each transaction API at some version; older clients know it as
    INVALID_PRODUCER_EPOCH (Kafka's KafkaApis does the same translation)."""
    if code == ErrorCode.PRODUCER_FENCED and version < first_version_with_fenced:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


def abortable_error(code: ErrorCode, version: int, first_version_with_abortable: int) -> ErrorCode:
    """TRANSACTION_ABORTABLE (KIP-890) reaches older clients as INVALID_TXN_STATE."""
    if code == ErrorCode.TRANSACTION_ABORTABLE and version < first_version_with_abortable:
        return ErrorCode.INVALID_TXN_STATE
    return code


def _topic_results(results: dict[TopicPartition, ErrorCode]) -> list[APR.AddPartitionsToTxnTopicResult]:
    by_topic: dict[str, list[APR.AddPartitionsToTxnPartitionResult]] = defaultdict(list)
    for (topic, partition), code in results.items():
        by_topic[topic].append(APR.AddPartitionsToTxnPartitionResult(partition_index=partition,
                                                                      partition_error_code=code))
    return [APR.AddPartitionsToTxnTopicResult(name=t, results_by_partition=ps) for t, ps in by_topic.items()]


def _coordinator_results(topics: Any, results: dict[TopicPartition, ErrorCode]
                         ) -> list[APR.AddPartitionsToTxnTopicResult]:
    """The coordinator's one answer for the whole transaction, on the request's topics and partitions as named
    (Kafka's errorResponseForTransaction, used for success too)."""
    codes = set(results.values())
    if len(codes) != 1:
        return _topic_results(results)
    (code,) = codes
    return [APR.AddPartitionsToTxnTopicResult(name=t.name, results_by_partition=[
        APR.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=code) for p in t.partitions])
        for t in topics]


# ---------------------------------------------------------------- AddPartitionsToTxn


async def handle_add_partitions_to_txn(ctx: RequestContext, req: AddPartitionsToTxnRequest) -> APR:
    tc = ctx.server.txn_coordinator
    v = ctx.api_version
    if v <= 3:
        tps = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
        if ctx.server.authorizer is not None and not ctx.authorized(WRITE, TXN_ID, req.v3_and_below_transactional_id):
            # Kafka's errorResponseForTransaction: the request's topics and partitions as named, repeats included.
            return APR(throttle_time_ms=0, results_by_topic_v3_and_below=[
                APR.AddPartitionsToTxnTopicResult(name=t.name, results_by_partition=[
                    APR.AddPartitionsToTxnPartitionResult(
                        partition_index=p, partition_error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
                    for p in t.partitions])
                for t in req.v3_and_below_topics])
        refused = _unwritable_partitions(ctx, req.v3_and_below_transactional_id, tps, from_client=True)
        if refused is not None:
            return APR(throttle_time_ms=0, results_by_topic_v3_and_below=_topic_results(refused))
        results = await tc.call(tc.add_partitions, req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                                req.v3_and_below_producer_epoch, tps, False)
        results = {tp: fenced_error(code, v, 2) for tp, code in results.items()}
        return APR(throttle_time_ms=0,
                   results_by_topic_v3_and_below=_coordinator_results(req.v3_and_below_topics, results))
    # v4+: brokers verifying (KIP-890) or adding partitions for several transactions in one request.
    if ctx.server.authorizer is not None and not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER):
        return APR(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results_by_transaction=[])
    out = []
    for txn in req.transactions:
        tps = [(t.name, p) for t in txn.topics for p in t.partitions]
        refused = _unwritable_partitions(ctx, txn.transactional_id, tps)
        if refused is not None:
            out.append(APR.AddPartitionsToTxnResult(transactional_id=txn.transactional_id,
                                                    topic_results=_topic_results(refused)))
            continue
        results = await tc.call(tc.add_partitions, txn.transactional_id, txn.producer_id, txn.producer_epoch, tps,
                                txn.verify_only)
        results = {tp: abortable_error(code, v, 5) for tp, code in results.items()}
        out.append(APR.AddPartitionsToTxnResult(transactional_id=txn.transactional_id,
                                                topic_results=_topic_results(results) if txn.verify_only
                                                else _coordinator_results(txn.topics, results)))
    return APR(throttle_time_ms=0, error_code=0, results_by_transaction=out)


# ---------------------------------------------------------------- AddOffsetsToTxn


async def handle_add_offsets_to_txn(ctx: RequestContext, req: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse:
    server = ctx.server
    if _denied(ctx, WRITE, TXN_ID, req.transactional_id):
        return AddOffsetsToTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if _denied(ctx, READ, GROUP, req.group_id):
        return AddOffsetsToTxnResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    try:
        offsets = server.ensure_offsets_topic()
    except Exception as e:  # noqa: BLE001
        return AddOffsetsToTxnResponse(error_code=error_of(e))
    partition = partition_for(req.group_id, offsets.num_partitions)
    tc = server.txn_coordinator
    results = await tc.call(tc.add_partitions, req.transactional_id, req.producer_id, req.producer_epoch,
                            [(OFFSETS_TOPIC, partition)], False)
    code = results.get((OFFSETS_TOPIC, partition), ErrorCode.NONE)
    code = abortable_error(fenced_error(code, ctx.api_version, 2), ctx.api_version, 4)
    return AddOffsetsToTxnResponse(error_code=code)


# ---------------------------------------------------------------- EndTxn


async def handle_end_txn(ctx: RequestContext, req: EndTxnRequest) -> EndTxnResponse:
    tc = ctx.server.txn_coordinator
    if _denied(ctx, WRITE, TXN_ID, req.transactional_id):
        return EndTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    code = await tc.call(tc.end_transaction, req.transactional_id, req.producer_id, req.producer_epoch,
                         req.committed)
    code = abortable_error(fenced_error(code, ctx.api_version, 2), ctx.api_version, 4)
    return EndTxnResponse(error_code=code)


# ---------------------------------------------------------------- TxnOffsetCommit


async def handle_txn_offset_commit(ctx: RequestContext, req: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse:
    """Kafka 3.9's order: Write on the transactional id and Read on the group (the whole request refused), each
    topic's Read and existence (per partition as named), then the coordinator for the distinct partitions left:
    group id and ownership, the group created if missing, the transaction verified, the member checked, the write."""
    server = ctx.server
    gc = server.group_coordinator
    R = TxnOffsetCommitResponse
    refused: ErrorCode | None = None
    if _denied(ctx, WRITE, TXN_ID, req.transactional_id):
        refused = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif _denied(ctx, READ, GROUP, req.group_id):
        refused = ErrorCode.GROUP_AUTHORIZATION_FAILED
    if refused is not None:
        # Kafka's getErrorResponse: the request's topics and partitions as named, each with the error.
        return R(throttle_time_ms=0, topics=[R.TxnOffsetCommitResponseTopic(name=t.name, partitions=[
            R.TxnOffsetCommitResponsePartition(partition_index=p.partition_index, error_code=refused)
            for p in t.partitions]) for t in req.topics])
    denied: set[str] = set()
    if server.authorizer is not None:
        names = {t.name for t in req.topics}
        denied = names - ctx.authorized_names(READ, TOPIC, names)
    now = int(time.time() * 1000)
    refused_parts, left = partitions_to_commit(server, req.topics, denied)
    answered = {name: [R.TxnOffsetCommitResponsePartition(partition_index=index, error_code=code)
                       for index, code in parts]
                for name, parts in refused_parts.items()}  # one entry per topic, as Kafka's builder
    offsets: dict[TopicPartition, OffsetAndMetadata] = {
        (name, p.partition_index): OffsetAndMetadata(
            p.committed_offset, p.committed_leader_epoch, p.committed_metadata or "", now, None)
        for name, p in left}
    if offsets:
        code = await gc.call(gc.open_txn_commit, req.group_id) or await _verify_offsets_partition(ctx, req)
        if code:
            results = {tp: code for tp in offsets}
        else:
            results = await gc.call(gc.txn_commit_offsets, req.group_id, req.producer_id, req.producer_epoch,
                                    req.generation_id, req.member_id, req.group_instance_id, offsets)
        for (topic, partition), code in results.items():
            answered.setdefault(topic, []).append(
                R.TxnOffsetCommitResponsePartition(partition_index=partition, error_code=code))
    for parts in answered.values():
        for p in parts:
            p.error_code = _txn_commit_error(ErrorCode(p.error_code), ctx.api_version)
    return R(throttle_time_ms=0, topics=[R.TxnOffsetCommitResponseTopic(name=name, partitions=parts)
                                         for name, parts in answered.items()])


def _txn_commit_error(code: ErrorCode, version: int) -> ErrorCode:
    code = abortable_error(code, version, 4)
    if version < 3 and code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID,
                                ErrorCode.UNKNOWN_MEMBER_ID):
        # Version 3 added these; Kafka answers older clients with the generic commit failure.
        return ErrorCode.UNKNOWN_SERVER_ERROR
    if version < 2 and code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
        # KafkaApis: 0.11-2.0 producers did not expect the loading error (KAFKA-7296).
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    return code


async def _verify_offsets_partition(ctx: RequestContext, req: TxnOffsetCommitRequest) -> ErrorCode:
    """KIP-890: the group's __consumer_offsets partition must be part of the producer's transaction
    (AddOffsetsToTxn first), so a late commit from an aborted transaction cannot land after its marker."""
    server = ctx.server
    if not server.config.effective("transaction.partition.verification.enable", server.metadata.broker_configs):
        return ErrorCode.NONE
    offsets = server.metadata.topics.get(OFFSETS_TOPIC)
    if offsets is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    tp = (OFFSETS_TOPIC, partition_for(req.group_id, offsets.num_partitions))
    errors = await server.txn_verifier.verify(req.transactional_id, req.producer_id, req.producer_epoch, [tp])
    return errors.get(tp, ErrorCode.NONE)


# ---------------------------------------------------------------- WriteTxnMarkers


async def handle_write_txn_markers(ctx: RequestContext, req: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse:
    server = ctx.server
    R = WriteTxnMarkersResponse
    refused = server.authorizer is not None and not ctx.authorized(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
    out = []
    for m in req.markers:
        tps = [(t.name, p) for t in m.topics for p in t.partition_indexes]
        if refused:
            results = {tp: ErrorCode.CLUSTER_AUTHORIZATION_FAILED for tp in tps}
        else:
            results = await server.txn_markers.append_markers_replicated(
                m.producer_id, m.producer_epoch, m.coordinator_epoch, m.transaction_result, tps)
        by_topic: dict[str, list[R.WritableTxnMarkerPartitionResult]] = defaultdict(list)
        for (topic, partition), code in results.items():
            by_topic[topic].append(R.WritableTxnMarkerPartitionResult(partition_index=partition, error_code=code))
        out.append(R.WritableTxnMarkerResult(producer_id=m.producer_id, topics=[
            R.WritableTxnMarkerTopicResult(name=t, partitions=ps) for t, ps in by_topic.items()]))
    return R(markers=out)


# ---------------------------------------------------------------- DescribeProducers


def handle_describe_producers(ctx: RequestContext, req: DescribeProducersRequest) -> DescribeProducersResponse:
    rm = ctx.server.replica_manager
    R = DescribeProducersResponse
    denied: set[str] = set()
    if ctx.server.authorizer is not None:
        names = [t.name for t in req.topics]
        denied = set(names) - ctx.authorized_names(READ, TOPIC, names)
    topics = []
    for t in req.topics:
        parts = []
        # Kafka's checkValidTopic comes before authorization: an illegal name is INVALID_TOPIC_EXCEPTION.
        illegal = validate_topic_name(t.name) is not None
        for p in t.partition_indexes:
            if illegal:
                parts.append(R.PartitionResponse(partition_index=p, error_code=ErrorCode.INVALID_TOPIC_EXCEPTION,
                                                 active_producers=[]))
                continue
            if t.name in denied:
                parts.append(R.PartitionResponse(partition_index=p, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                 active_producers=[]))
                continue
            try:
                lg = rm.get_log(t.name, p)
            except Exception as e:  # noqa: BLE001
                parts.append(R.PartitionResponse(partition_index=p, error_code=error_of(e), active_producers=[]))
                continue
            producers = [
                R.ProducerState(
                    producer_id=e.producer_id, producer_epoch=e.producer_epoch, last_sequence=e.last_seq,
                    last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
                    current_txn_start_offset=-1 if e.current_txn_first_offset is None else e.current_txn_first_offset,
                )
                for e in lg.producer_states()
            ]
            parts.append(R.PartitionResponse(partition_index=p, error_code=0, active_producers=producers))
        topics.append(R.TopicResponse(name=t.name, partitions=parts))
    return R(throttle_time_ms=0, topics=topics)


# ---------------------------------------------------------------- DescribeTransactions / ListTransactions


async def handle_describe_transactions(ctx: RequestContext, req: DescribeTransactionsRequest
                                       ) -> DescribeTransactionsResponse:
    tc = ctx.server.txn_coordinator
    R = DescribeTransactionsResponse
    ids = list(req.transactional_ids)
    denied: set[str] = set()
    if ctx.server.authorizer is not None:
        denied = set(ids) - ctx.authorized_names(DESCRIBE, TXN_ID, ids)
    states = await tc.call(tc.describe_transactions, [i for i in ids if i not in denied]) if len(denied) < len(ids) else []
    if ctx.server.authorizer is not None:
        for state in states:
            # Kafka lists only the partitions of topics the principal may describe.
            allowed = ctx.authorized_names(DESCRIBE, TOPIC, (t.topic for t in state.topics), log_denied=False)
            state.topics = [t for t in state.topics if t.topic in allowed]
    states += [R.TransactionState(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, transactional_id=i,
                                  topics=[])  # the schema's defaults, as Kafka leaves them
               for i in ids if i in denied]
    return R(throttle_time_ms=0, transaction_states=states)


async def handle_list_transactions(ctx: RequestContext, req: ListTransactionsRequest) -> ListTransactionsResponse:
    tc = ctx.server.txn_coordinator
    duration = req.duration_filter if ctx.api_version >= 1 else -1
    # Kafka's filters are sets: a repeated unknown state is reported once.
    code, unknown, states = await tc.call(tc.list_transactions, list(dict.fromkeys(req.state_filters)),
                                          list(req.producer_id_filters), duration)
    if ctx.server.authorizer is not None:
        # Kafka lists only the transactional ids the principal may describe.
        allowed = ctx.authorized_names(DESCRIBE, TXN_ID, (s.transactional_id for s in states), log_denied=False)
        states = [s for s in states if s.transactional_id in allowed]
    return ListTransactionsResponse(throttle_time_ms=0, error_code=code, unknown_state_filters=unknown,
                                    transaction_states=states)


HANDLERS = [
    ApiHandler(24, 0, 5, handle_add_partitions_to_txn),
    ApiHandler(25, 0, 4, handle_add_offsets_to_txn),
    ApiHandler(26, 0, 4, handle_end_txn),
    ApiHandler(27, 0, 1, handle_write_txn_markers),
    ApiHandler(28, 0, 4, handle_txn_offset_commit),
    ApiHandler(61, 0, 0, handle_describe_producers),
    ApiHandler(65, 0, 0, handle_describe_transactions),
    ApiHandler(66, 0, 1, handle_list_transactions),
]

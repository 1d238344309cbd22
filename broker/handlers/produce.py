"""Produce (key 0): append record batches as they arrive; offsets are assigned per batch.

Produce v0-v2 (clients of Kafka 0.8-0.10) may carry message sets of magic 0 and 1: the log converts them to
record batch v2 on append (protocol/legacy_records.py). From v3 only magic 2 is accepted, as Kafka's
ProduceRequest.validateRecords says."""

from __future__ import annotations

import inspect
import logging
import struct
import time
from typing import TYPE_CHECKING, Any

from kbroker.broker import metrics, produce_codec
from kbroker.broker.admin_manager import INTERNAL_TOPICS
from kbroker.broker.apis import NOT_DIRECT, ApiHandler, EncodedLater, KafkaApis, RequestContext
from kbroker.broker.delayed_produce import DelayedProduce
from kbroker.broker.leader_hints import PRODUCE_VERSION as HINTS_VERSION
from kbroker.broker.leader_hints import LeaderHints
from kbroker.broker.network import DelayedResponse, KafkaConnection, Response
from kbroker.broker.produce_codec import PartitionAnswer, TopicAnswers
from kbroker.broker.produce_validation import (
    ONE_BATCH_VERSION,
    SHORTEST_PRODUCER_BATCH,
    Refusal,
    first_entry_corrupt,
    scan_entries,
    validate_records,
)
from kbroker.broker.replica_manager import error_of
from kbroker.broker.security.acls import AclOperation, ResourceType
from kbroker.broker.security.write_allowed import write_allowed
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.legacy_records import first_magic
from kbroker.protocol.messages import ProduceRequest, ProduceResponse, RequestHeader
from kbroker.protocol.records import (
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    RecordError,
    RecordValidationError,
    parse_batch_header,
)
from kbroker.storage import log as log_module
from kbroker.storage.errors import KafkaStorageError
from kbroker.storage.producer_state import VerificationGuard

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

log = logging.getLogger("kbroker.produce")
# Answers that tell an idempotent producer the broker's idea of its sequence differs from its own.
_PRODUCER_STATE_ERRORS = frozenset({ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID,
                                    ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})

PartitionResponse = ProduceResponse.PartitionProduceResponse
# The encoders' own default of the tagged current_leader (codec.tagged_default), recognised by identity: a fresh one
# per partition would be built and then compared with the dataclass's __eq__. Never edited in place (KIP-951 hints
# assign another object).
_NO_LEADER = codec.tagged_default(ProduceResponse.LeaderIdAndEpoch)
_ATTRIBUTES_LOW_BYTE = 22  # batch attributes are the int16 at offset 21
_PRODUCER_ID = 43  # first byte of a v2 batch's producer id: 0xFF only for -1 (ids are never negative otherwise)
_MAGIC = 16
_PRODUCER = struct.Struct(">qh")  # producer id and epoch
_BATCH_LENGTH = struct.Struct(">i")
_NO_GUARD = VerificationGuard()
_NOT_PLAIN: Any = object()  # _append_plain_one: the request is _append's


def _error(index: int, code: ErrorCode, message: str | None = None,
           record_errors: list[RecordError] | None = None) -> PartitionResponse:
    return PartitionResponse(
        index=index, error_code=code, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
        error_message=message,
        record_errors=[ProduceResponse.BatchIndexAndErrorMessage(batch_index=e.batch_index,
                                                                 batch_index_error_message=e.message)
                       for e in record_errors] if record_errors else [])


# Kafka's ReplicaManager answers these append failures without the partition's log start offset (-1); every other
# failure (sequence, epoch, record validation...) carries it.
_NO_LOG_START_ERRORS = frozenset({
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.MESSAGE_TOO_LARGE,
    ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.CORRUPT_MESSAGE, ErrorCode.KAFKA_STORAGE_ERROR,
})


def _log_start_offset(rm: Any, topic: str, partition: int) -> int:
    try:
        return int(rm.get_log(topic, partition).log_start_offset)
    except Exception:  # noqa: BLE001 - no local log to ask: Kafka's -1 as well
        return -1


def handle_produce(ctx: RequestContext, req: ProduceRequest) -> Any:
    """Kafka 3.9's order (KafkaApis.handleProduceRequest, ReplicaManager.handleProduceAppend and appendRecords): the
    first entry of each partition (corrupt: the whole request fails; transactional: the transactional id must be
    writable), then per partition the topic's Write, its existence and (v3+) validateRecords; with nothing left to
    append the answer goes out at once, whatever the acks. Then every entry to append is walked (corrupt: the whole
    request fails), one producer per transaction, the acks, and the appends. A partition named twice is answered
    once and its last record set appended, as Kafka's maps by partition do."""
    txn_id = req.transactional_id
    transactional = False
    for t in req.topic_data:
        for p in t.partition_data:
            if first_entry_corrupt(p.records) is not None:
                return _refuse_all(req, ErrorCode.CORRUPT_MESSAGE)
            if p.records is not None and _is_transactional(p.records):
                transactional = True
                break
        if transactional:
            break
    if transactional and (txn_id is None or not ctx.authorized(
            AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id)):
        # Transactional records (judged by each partition's first batch) need the request's transactional id and
        # Write on it, else the whole request fails.
        return _refuse_all(req, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    failed: dict[tuple[str, int], Refusal] = {}
    allowed = None
    if ctx.server.authorizer is not None:
        allowed = ctx.authorized_names(AclOperation.WRITE, ResourceType.TOPIC, (t.name for t in req.topic_data))
    to_append: dict[tuple[str, int], Any] = {}
    for t in req.topic_data:
        for p in t.partition_data:
            tp = (t.name, p.index)
            if allowed is not None and t.name not in allowed:
                failed[tp] = (ErrorCode.TOPIC_AUTHORIZATION_FAILED, None)
            elif not _exists(ctx, tp):
                failed[tp] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
            else:
                refusal = validate_records(ctx.api_version, p.records) if ctx.api_version >= ONE_BATCH_VERSION \
                    else None
                if refusal is not None:
                    failed[tp] = refusal
                else:
                    to_append[tp] = p.records
    if to_append:
        one_batch = ctx.api_version >= ONE_BATCH_VERSION  # validate_records has walked it: one whole entry
        for records in to_append.values():
            if not records:
                continue
            code = scan_entries(records) if not one_batch or len(records) < SHORTEST_PRODUCER_BATCH else None
            if code is not None:
                return _refuse_all(req, code)
        if len(_transactional_producers(to_append)) > 1:
            # Kafka's ReplicaManager.handleProduceAppend: one request, one transaction.
            return _refuse_all(req, ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if req.acks not in (0, 1, -1):
            # ReplicaManager.appendRecords refuses what would be appended; the other partitions keep their answers.
            failed = {**{tp: (ErrorCode.INVALID_REQUIRED_ACKS, None) for tp in to_append}, **failed}
            to_append = {}
    if not to_append or not ctx.server.config.effective("transaction.partition.verification.enable", ctx.server.metadata.broker_configs):
        return _append_all(ctx, req, to_append, failed, None)
    if txn_id is not None:
        to_verify = _first_transactional_batches(ctx, to_append)
        if to_verify is not None:
            unverified = ctx.server.txn_verifier.verify_now(txn_id, *to_verify)
            if unverified is None:
                return _verify_then_append(ctx, req, to_append, failed, *to_verify)
            return _append_all(ctx, req, to_append, {**failed, **_verification_failures(unverified, ctx.api_version)},
                               _guards(to_verify[0], to_verify[2], unverified))
    return _append_all(ctx, req, to_append, failed, {})


def handle_produce_frame(apis: KafkaApis, conn: KafkaConnection, frame: bytes | bytearray) -> Any:
    """KafkaApis.handle's first step for a Produce frame (Produce's direct path): the common request decoded into
    tuples from the frame itself, header and body in one call (produce_codec.decode_frame), and answered by the
    direct encoder; for the single-partition request _append_plain_one answers, without the RequestHeader, the
    RequestContext and the dispatch, the request accounted here as KafkaApis.handle accounts a direct answer.
    NOT_DIRECT for anything else (a request quota whose throttle the general path sets on the body, a Write the
    authorizer denies, a request that is not the common case), which handle_produce then serves, decoding it anew."""
    server = apis.server
    if server.request_quota.quotas():
        return NOT_DIRECT
    started = time.perf_counter()
    decoded = produce_codec.decode_frame(frame)
    if decoded is None:
        return NOT_DIRECT  # not the common request, or a header the general path refuses
    correlation_id, version, client_id, txn_id, acks, timeout_ms, topics, producer = decoded
    if acks not in (0, 1, -1):
        return NOT_DIRECT  # handle_produce answers these in Kafka's order
    authz = server.authorizer
    if authz is not None and not write_allowed(authz, conn, txn_id if producer is not None else None, topics):
        # handle_produce's checks, allowed from the connection's cache: Write on the transactional id when a
        # partition's first batch is transactional (producer), Write on each topic. A denial is the general
        # path's to log and answer (TRANSACTIONAL_ID_ or TOPIC_AUTHORIZATION_FAILED).
        return NOT_DIRECT
    if (len(topics) == 1 and len(topics[0][1]) == 1 and log_module.PLAIN_APPEND
            and (producer is None or txn_id is not None)):
        shard = metrics.shard()
        result = _append_plain_one(server, conn, correlation_id, version, client_id, topics, acks, timeout_ms,
                                   started, shard, txn_id, producer)
        if type(result) is Response:  # KafkaApis.handle's accounting of a direct path's Response
            elapsed = time.perf_counter() - started
            shard.busy_s += elapsed
            shard.request_done(0, elapsed)
            return result
        header = _header(correlation_id, version, client_id)
        if result is not _NOT_PLAIN:
            return apis.finish(conn, header, started, result)
    else:
        header = _header(correlation_id, version, client_id)
    result = _direct_decoded(RequestContext(server, conn, header), txn_id, acks, timeout_ms, topics, producer,
                             started)
    return result if result is NOT_DIRECT else apis.finish(conn, header, started, result)


def _direct_decoded(ctx: RequestContext, txn_id: str | None, acks: int, timeout_ms: int,
                    topics: list[tuple[str, list[tuple[int, Any]]]], producer: tuple[int, int] | None,
                    started: float) -> Any:
    """handle_produce_frame once the request is decoded (and _append_plain_one did not take it)."""
    if _named_twice(topics):
        return NOT_DIRECT
    # What handle_produce checks before appending finds nothing else in this request: every partition holds one
    # batch that validateRecords passes, and its transactional batches (each a partition's first) are of one
    # producer, so there is no second transaction; a transactional id is all they need once handle_produce_frame
    # found its Write allowed (or there is no authorizer).
    server = ctx.server
    failed: dict[tuple[str, int], Refusal] = {}
    guards: dict[tuple[str, int], VerificationGuard] | None = (
        {} if server.config.effective("transaction.partition.verification.enable", server.metadata.broker_configs)
        else None)
    if producer is not None:
        if txn_id is None:
            return NOT_DIRECT  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the whole request
        if guards is not None:
            # KIP-890, as handle_produce: the partitions this batch would open the transaction on are confirmed
            # by the coordinator first, when it can answer at once; else the general path waits for it.
            to_append = {(name, index): records for name, parts in topics for index, records in parts
                         if _exists(ctx, (name, index))}
            to_verify = _first_transactional_batches(ctx, to_append)
            if to_verify is not None:
                unverified = server.txn_verifier.verify_now(txn_id, *to_verify)
                if unverified is None:
                    return NOT_DIRECT
                failed = _verification_failures(unverified, ctx.api_version)
                guards = _guards(to_verify[0], to_verify[2], unverified)
    return _direct_answer(ctx, _append(ctx, topics, acks, timeout_ms, failed, guards, direct=True, started=started))


def _direct_answer(ctx: RequestContext, result: Any) -> Any:
    """What _append returned for the direct path: (answers, throttle) encoded by the direct encoder (the failed
    partitions counted), anything else as it is."""
    if type(result) is not tuple:
        return result
    answers, throttle = result
    metrics.shard().answered_produce(answers)
    header = ctx.header
    return Response(produce_codec.encode_response(header.correlation_id, header.request_api_version, throttle,
                                                  answers))


def _append_plain_one(server: KafkaServer, conn: KafkaConnection, correlation_id: int, version: int,
                      client_id: str | None, topics: list[tuple[str, list[tuple[int, Any]]]], acks: int,
                      timeout_ms: int, started: float, shard: metrics.Shard, txn_id: str | None = None,
                      producer: tuple[int, int] | None = None) -> Any:
    """handle_produce_frame for the most common request: one partition, led here, one batch that the log's plain
    append takes (Log._append_plain: an idempotent producer's next batch, a batch without a producer, or a
    transactional producer's next batch, producer: its (id, epoch), with txn_id its transactional id). The same
    answer as _append's, in one function from the decoded request to the encoded response (a RequestContext is
    built only for the answers _answer gives: acks 0 and -1, an fsync due, a quota, a failed append); _NOT_PLAIN,
    with nothing changed, for anything else (the partition unknown, led elsewhere or offline, an internal topic, a
    producer's first batch or a retry, a transactional batch the coordinator does not confirm at once...), which
    _append then serves as before."""
    name, parts = topics[0]
    index, records = parts[0]
    if name in INTERNAL_TOPICS or not records:
        return _NOT_PLAIN
    rm = server.replica_manager
    try:
        lg, epoch = rm.leader_log_for_append(name, index, acks)
    except Exception:  # noqa: BLE001 - _append answers the partition's error
        return _NOT_PLAIN
    guard = None
    if producer is not None:
        guard = _plain_guard(server, lg, txn_id, (name, index), producer)
        if guard is _NOT_PLAIN:
            return _NOT_PLAIN
    try:
        appended = lg._append_plain(records, int(time.time() * 1000), epoch, guard)
        if appended is not None:  # inside the try, as in ReplicaManager._append: a failing wake-up is answered
            rm.appended(name, index, lg, appended[1])
    except Exception as e:  # noqa: BLE001 - the partition's error code, as _append's
        if isinstance(e, KafkaStorageError):
            rm.append_failed(name, index, lg, e)
        failure = _append_failure(rm, name, index, e)
        ctx = _context(server, conn, correlation_id, version, client_id)
        return _direct_answer(ctx, _answer(ctx, topics, [(name, [failure])], acks, timeout_ms, [], [], False,
                                           failure[1] == ErrorCode.NOT_LEADER_OR_FOLLOWER, True, started))
    if appended is None:
        return _NOT_PLAIN
    last_offset = appended[1]
    shard.produced(name, appended[6], len(records))  # the network thread's metrics.shard()
    answered: TopicAnswers = [(name, [(index, 0, appended[0], -1, appended[5], None, None)])]
    if ((acks == 1 or (acks == -1 and last_offset < lg.high_watermark))
            and lg.unflushed_messages < lg.config.flush_messages
            and not server.produce_quota.quotas()):  # no byte-rate quota anywhere: _answer's quota_for is None
        # Nothing to wait for (acks=all: the ISR, this replica alone, has the batch already) and no throttle:
        # _answer's (answers, 0), encoded at once.
        return Response(produce_codec.encode_response(correlation_id, version, 0, answered))
    to_flush = [(lg, last_offset)] if rm.needs_flush(lg) else []
    delayed = [(name, index, last_offset + 1)] if acks == -1 and last_offset >= lg.high_watermark else []
    # The plain append's batch is magic 2: sequenced when it names a producer.
    sequenced = records[_PRODUCER_ID] != 0xFF
    ctx = _context(server, conn, correlation_id, version, client_id)
    return _direct_answer(ctx, _answer(ctx, topics, answered, acks, timeout_ms, to_flush, delayed, sequenced, False,
                                       True, started))


def _plain_guard(server: KafkaServer, lg: Any, txn_id: str | None, tp: tuple[str, int],
                 producer: tuple[int, int]) -> Any:
    """The verification guard _direct_decoded would hand _append for a transactional batch to one partition
    (KIP-890): None with verification off; _NO_GUARD when the producer's transaction is already open there (nothing
    to verify: the log refuses the batch if that changes before it is written); the producer's guard when the
    coordinator, this broker, confirms at once that the partition is in the transaction. _NOT_PLAIN when only
    the general path can answer: the coordinator elsewhere or busy, or a partition it refuses (the general path
    verifies again and answers the error)."""
    if txn_id is None:
        return _NOT_PLAIN  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED: the general path's answer
    if not server.config.effective("transaction.partition.verification.enable", server.metadata.broker_configs):
        return None
    producer_id, producer_epoch = producer
    if lg.has_ongoing_transaction(producer_id, producer_epoch):
        return _NO_GUARD
    if not server.txn_verifier.confirmed_now(txn_id, producer_id, producer_epoch, tp):
        return _NOT_PLAIN
    return VerificationGuard(producer_id)


def _context(server: KafkaServer, conn: KafkaConnection, correlation_id: int, version: int,
             client_id: str | None) -> RequestContext:
    """The RequestContext KafkaApis.handle would have built for this Produce request."""
    return RequestContext(server, conn, _header(correlation_id, version, client_id))


def _header(correlation_id: int, version: int, client_id: str | None) -> RequestHeader:
    """The RequestHeader KafkaApis.handle would have decoded from this Produce frame."""
    return RequestHeader(request_api_key=0, request_api_version=version, correlation_id=correlation_id,
                         client_id=client_id)


def _refuse_all(req: ProduceRequest, code: ErrorCode) -> ProduceResponse | None:
    """Kafka's ProduceRequest.getErrorResponse: every partition the request names, once."""
    if req.acks == 0:
        return None
    topics: dict[str, dict[int, PartitionResponse]] = {}
    for t in req.topic_data:
        for p in t.partition_data:
            topics.setdefault(t.name, {})[p.index] = _error(p.index, code)
    return ProduceResponse(throttle_time_ms=0, responses=[
        ProduceResponse.TopicProduceResponse(name=name, partition_responses=list(parts.values()))
        for name, parts in topics.items()])


def _by_topic(topics: list[ProduceResponse.TopicProduceResponse]) -> list[ProduceResponse.TopicProduceResponse]:
    """Kafka answers from a map by partition: one entry per topic, none for a topic that named no partition."""
    merged: dict[str, ProduceResponse.TopicProduceResponse] = {}
    for t in topics:
        if t.name in merged:
            merged[t.name].partition_responses.extend(t.partition_responses)
        elif t.partition_responses:
            merged[t.name] = t
    return list(merged.values())


def _exists(ctx: RequestContext, tp: tuple[str, int]) -> bool:
    if tp in ctx.server.replica_manager.partitions:
        return True
    rec = ctx.server.metadata.topics.get(tp[0])
    return rec is not None and 0 <= tp[1] < len(rec.partitions)


def _transactional_producers(to_append: dict[tuple[str, int], Any]) -> set[tuple[int, int]]:
    """(producer id, epoch) of every transactional batch of the partitions to append."""
    producers: set[tuple[int, int]] = set()
    for records in to_append.values():
        if records is None:
            continue
        pos, end = 0, len(records)
        while end - pos >= BATCH_HEADER_SIZE:
            if records[pos + _MAGIC] == 2 and records[pos + _ATTRIBUTES_LOW_BYTE] & ATTR_TRANSACTIONAL:
                producers.add(_PRODUCER.unpack_from(records, pos + _PRODUCER_ID))
            size = _BATCH_LENGTH.unpack_from(records, pos + 8)[0]
            if size <= 0:
                break
            pos += size + LOG_OVERHEAD
    return producers


def _first_transactional_batches(ctx: RequestContext, to_append: dict[tuple[str, int], Any]
                                 ) -> tuple[int, int, list[tuple[str, int]]] | None:
    """(producer id, epoch, partitions) whose transactional batches would open the producer's transaction
    there, so the coordinator must confirm them first (KIP-890); None when every partition already has it."""
    rm = ctx.server.replica_manager
    tps: list[tuple[str, int]] = []
    producer = (-1, -1)
    for tp, records in to_append.items():
        if not records or len(records) < BATCH_HEADER_SIZE:
            continue
        h = parse_batch_header(records)
        if not h.is_transactional:
            continue
        try:
            lg = rm.get_log(*tp)
        except Exception:  # noqa: BLE001 - the append answers this partition's error
            continue
        if not lg.has_ongoing_transaction(h.producer_id, h.producer_epoch):
            tps.append(tp)
            producer = (h.producer_id, h.producer_epoch)
    return (*producer, tps) if tps else None


def _guards(producer_id: int, tps: list[tuple[str, int]], unverified: dict[tuple[str, int], ErrorCode]
            ) -> dict[tuple[str, int], VerificationGuard]:
    guard = VerificationGuard(producer_id)
    return {tp: guard for tp in tps if tp not in unverified}


def _verification_failures(unverified: dict[tuple[str, int], ErrorCode], version: int
                           ) -> dict[tuple[str, int], Refusal]:
    return {tp: (_produce_error(code, version), "the partition is not part of the producer's ongoing transaction")
            for tp, code in unverified.items()}


async def _verify_then_append(ctx: RequestContext, req: ProduceRequest, to_append: dict[tuple[str, int], Any],
                              failed: dict[tuple[str, int], Refusal], producer_id: int, producer_epoch: int,
                              tps: list[tuple[str, int]]) -> Any:
    assert req.transactional_id is not None
    unverified = await ctx.server.txn_verifier.verify(req.transactional_id, producer_id, producer_epoch, tps)
    result = _append_all(ctx, req, to_append, {**failed, **_verification_failures(unverified, ctx.api_version)},
                         _guards(producer_id, tps, unverified))
    return (await result) if inspect.isawaitable(result) else result


def _produce_error(code: ErrorCode, version: int) -> ErrorCode:
    """A coordinator's retriable answer becomes a produce error the client retries (Kafka's ReplicaManager
    maps them to NOT_ENOUGH_REPLICAS); TRANSACTION_ABORTABLE is INVALID_TXN_STATE before Produce v11."""
    if code in (ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR, ErrorCode.NETWORK_EXCEPTION):
        return ErrorCode.NOT_ENOUGH_REPLICAS
    if code == ErrorCode.TRANSACTION_ABORTABLE and version < 11:
        return ErrorCode.INVALID_TXN_STATE
    return code


def _append_all(ctx: RequestContext, req: ProduceRequest, to_append: dict[tuple[str, int], Any],
                failed: dict[tuple[str, int], Refusal], guards: dict[tuple[str, int], VerificationGuard] | None
                ) -> Any:
    """Append what passed the checks and answer every partition the request names, once (a partition named twice:
    its last record set, as Kafka's map by partition). guards: the partitions whose transaction the coordinator
    confirmed for this request (None when verification is off: transactional batches are then not checked)."""
    topics: list[tuple[str, list[tuple[int, Any]]]] = []
    answered: set[tuple[str, int]] = set()
    for t in req.topic_data:
        parts = []
        for p in t.partition_data:
            tp = (t.name, p.index)
            if tp not in answered:
                answered.add(tp)
                parts.append((p.index, to_append.get(tp, p.records)))
        topics.append((t.name, parts))
    return _append(ctx, topics, req.acks, req.timeout_ms, failed, guards)


def _named_twice(topics: list[tuple[str, list[tuple[int, Any]]]]) -> bool:
    if len(topics) == 1 and len(topics[0][1]) == 1:
        return False
    seen = {(name, index) for name, parts in topics for index, _ in parts}
    return len(seen) != sum(len(parts) for _, parts in topics)


def _failure(index: int, code: ErrorCode, message: str | None = None,
             record_errors: list[RecordError] | None = None, log_start_offset: int = -1) -> PartitionAnswer:
    return (index, code, -1, -1, log_start_offset, message,
            [(e.batch_index, e.message) for e in record_errors] if record_errors else None)


def _append_failure(rm: Any, name: str, index: int, e: Exception) -> PartitionAnswer:
    """The answer of a partition whose append raised: Kafka's error code, message, record errors and log start."""
    code = error_of(e)
    if code == ErrorCode.UNKNOWN_SERVER_ERROR:
        log.error("Produce to %s-%d failed", name, index, exc_info=e)
    elif code in _PRODUCER_STATE_ERRORS:
        # Rare, and what makes an idempotent client bump its epoch: worth a line each.
        log.info("Produce to %s-%d refused with %s: %s", name, index, code.name, e)
    # Records refused one by one (v8+): the client fails just those and retries nothing else.
    record_errors = e.record_errors if isinstance(e, RecordValidationError) else None
    log_start = -1 if code in _NO_LOG_START_ERRORS else _log_start_offset(rm, name, index)
    # Kafka names no message for an unknown partition (hasCustomErrorMessage false), as handle_produce
    # answers it before the append.
    message = None if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION else str(e) or None
    return _failure(index, code, message, record_errors, log_start)


def _append(ctx: RequestContext, topics: list[tuple[str, list[tuple[int, Any]]]], acks: int, timeout_ms: int,
            failed: dict[tuple[str, int], Refusal], guards: dict[tuple[str, int], VerificationGuard] | None,
            direct: bool = False, started: float = 0.0) -> Any:
    """_append_all over (topic, [(partition, records)]), each partition once and acks valid (handle_produce and
    handle_produce_frame see to both). direct: answers that need nothing more (no leader hints, no fsync or
    replication to wait for) come back as (answers, throttle) for the direct encoder; an acks=all wait on them
    becomes a DelayedProduce (started: the request's perf_counter, for its time metric)."""
    rm = ctx.server.replica_manager
    counters = metrics.shard()
    to_flush: list[tuple[Any, int]] = []
    # acks=all partitions whose high watermark has not reached the batch yet: (topic, partition, required offset)
    delayed: list[tuple[str, int, int]] = []
    sequenced = False  # a batch with a producer id (idempotent or transactional) was appended
    not_leader = False  # a partition answered NOT_LEADER_OR_FOLLOWER: the response names its leader (KIP-951)
    # Kafka answers from a map by partition: one entry per topic, none for a topic that named no partition.
    answers: dict[str, list[PartitionAnswer]] = {}
    for name, partitions in topics:
        parts: list[PartitionAnswer] = []
        for index, records in partitions:
            if failed:
                refusal = failed.get((name, index))
                if refusal is not None:
                    parts.append(_failure(index, *refusal))
                    continue
            if name in INTERNAL_TOPICS:
                if direct and not _exists(ctx, (name, index)):
                    # handle_produce answers an unknown partition before this check, as Kafka does
                    parts.append(_failure(index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
                # Only the broker's coordinators write there: a forged record would rewrite a group's offsets or
                # a transaction's state (Kafka's ReplicaManager refuses it the same way).
                parts.append(_failure(index, ErrorCode.INVALID_TOPIC_EXCEPTION, f"Cannot append to internal topic {name}"))
                continue
            if records is None or len(records) == 0:  # Produce v0-v2 (v3+ refused it above)
                parts.append(_failure(index, ErrorCode.CORRUPT_MESSAGE, "empty record set"))
                continue
            magic = first_magic(records)
            guard = None if guards is None else guards.get((name, index), _NO_GUARD)
            try:
                lg, info = rm.append(name, index, records, acks, guard)
            except Exception as e:  # noqa: BLE001 - every failure becomes this partition's error code
                failure = _append_failure(rm, name, index, e)
                not_leader = not_leader or failure[1] == ErrorCode.NOT_LEADER_OR_FOLLOWER
                parts.append(failure)
                continue
            counters.produced(name, info.num_records, len(records))
            if magic == 2 and len(records) >= BATCH_HEADER_SIZE and records[_PRODUCER_ID] != 0xFF:
                sequenced = True
            if rm.needs_flush(lg):
                to_flush.append((lg, info.last_offset))
            if acks == -1 and info.last_offset >= lg.high_watermark:
                delayed.append((name, index, info.last_offset + 1))
            parts.append((index, 0, info.first_offset, info.log_append_time, info.log_start_offset, None, None))
        if name in answers:
            answers[name].extend(parts)
        elif parts:
            answers[name] = parts
    return _answer(ctx, topics, list(answers.items()), acks, timeout_ms, to_flush, delayed, sequenced, not_leader,
                   direct, started)


def _answer(ctx: RequestContext, topics: list[tuple[str, list[tuple[int, Any]]]], answered: TopicAnswers,
            acks: int, timeout_ms: int, to_flush: list[tuple[Any, int]], delayed: list[tuple[str, int, int]],
            sequenced: bool, not_leader: bool, direct: bool, started: float) -> Any:
    """_append's answer once the partitions are appended: the client's byte-rate quota, then what waits (fsync,
    replication) or nothing (acks=0); direct: (answers, throttle) when nothing does, for the direct encoder."""
    rm = ctx.server.replica_manager
    throttle = 0
    quota = ctx.server.produce_quota
    if quota.quota_for(ctx.client_id) is not None:  # most clients have none: skip the byte count
        nbytes = sum(len(records) for _, partitions in topics for _, records in partitions if records is not None)
        throttle = quota.record_and_get_throttle_ms(ctx.client_id, nbytes)
    if throttle:
        # producer_byte_rate: the data is appended; the client is told to back off and its connection waits.
        ctx.conn.mute_for(throttle)
    if acks == 0:
        if to_flush:
            rm.flush_in_background(to_flush)
        return None
    if direct and not (not_leader or to_flush):
        if not delayed:
            return answered, throttle
        return _delay_direct(ctx, answered, throttle, delayed, timeout_ms, sequenced, started)
    response = produce_codec.response_of(answered, throttle, _NO_LEADER)
    if not_leader:
        _name_leaders(ctx, response)
    if not delayed and not to_flush:
        return response
    pending = (_after_replication(ctx, to_flush, delayed, response, timeout_ms) if delayed
               else _after_flush(rm, to_flush, response))
    if sequenced:
        # Idempotent and transactional producers keep Kafka's one-request-at-a-time: their sequence bookkeeping
        # (the Java client's above all) is built for a broker that appends a request only after answering the
        # one before it; pipelining them hung a Java producer in the chaos test.
        return pending
    # Appended: only the answer waits, so the connection may go on with its next Produce meanwhile.
    return DelayedResponse(pending)


def _delay_direct(ctx: RequestContext, answered: TopicAnswers, throttle: int, delayed: list[tuple[str, int, int]],
                  timeout_ms: int, sequenced: bool, started: float) -> Response | EncodedLater:
    """The direct path's acks=all: _after_replication's answer, completed by the purgatory without a coroutine
    (broker/delayed_produce.py) and encoded by the direct encoder; the Response itself when the ISR already has
    every batch."""
    header = ctx.header
    waited = False

    def finish(codes: dict[Any, ErrorCode]) -> Response:
        not_leader = False
        if any(codes.values()):
            for name, parts in answered:
                for i, a in enumerate(parts):
                    code = codes.get((name, a[0]))
                    if code and a[1] == 0:
                        parts[i] = _failure(a[0], code)
            not_leader = ErrorCode.NOT_LEADER_OR_FOLLOWER in codes.values()
        shard = metrics.shard()
        shard.answered_produce(answered)
        if not_leader:  # the leadership moved while the batch waited: the answer names the leaders (KIP-951)
            response = produce_codec.response_of(answered, throttle, _NO_LEADER)
            _name_leaders(ctx, response)
            frame = codec.encode_response(header.correlation_id, header.request_api_key, header.request_api_version,
                                          response)
        else:
            frame = produce_codec.encode_response(header.correlation_id, header.request_api_version, throttle,
                                                  answered)
        if waited:
            shard.request_done(header.request_api_key, time.perf_counter() - started)
        return Response(frame)

    dp = DelayedProduce(ctx.server.replica_manager, delayed, finish)
    if dp.start(timeout_ms):
        return dp.future.result()
    waited = True
    return EncodedLater(dp.future, blocking=sequenced)


def _is_transactional(records: Any) -> bool:
    # The attributes' low byte of the first batch: one byte test instead of a header parse on the hot path.
    return (len(records) >= BATCH_HEADER_SIZE and records[_MAGIC] == 2
            and bool(records[_ATTRIBUTES_LOW_BYTE] & ATTR_TRANSACTIONAL))


async def _after_flush(rm: Any, to_flush: list[tuple[Any, int]], response: ProduceResponse) -> ProduceResponse:
    # With log.flush.interval.messages reached, the ack waits for fsync (group-committed).
    failed: set[tuple[str, int]] = set()
    try:
        await rm.flush(to_flush)
    except (OSError, KafkaStorageError) as e:
        log.error("fsync failed for %s", [f"{lg.topic}-{lg.partition}" for lg, _ in to_flush], exc_info=True)
        failed = {(lg.topic, lg.partition) for lg, _ in to_flush}
        for lg, _ in to_flush:  # an fsync that fails for another reason than a full disk fails the log dir
            rm.server.log_manager.maybe_fail_dir(lg, e)
    if failed:
        for t in response.responses:
            for i, p in enumerate(t.partition_responses):
                if (t.name, p.index) in failed:
                    t.partition_responses[i] = _error(p.index, ErrorCode.KAFKA_STORAGE_ERROR, "fsync failed")
    return response


async def _after_replication(ctx: RequestContext, to_flush: list[tuple[Any, int]],
                             delayed: list[tuple[str, int, int]], response: ProduceResponse,
                             timeout_ms: int) -> ProduceResponse:
    """acks=all on a replicated partition: answer once the ISR has the batch (Kafka's DelayedProduce)."""
    rm = ctx.server.replica_manager
    if to_flush:
        response = await _after_flush(rm, to_flush, response)
    codes = await rm.wait_for_replication(delayed, timeout_ms)
    for t in response.responses:
        for i, p in enumerate(t.partition_responses):
            code = codes.get((t.name, p.index))
            if code and p.error_code == 0:
                t.partition_responses[i] = _error(p.index, code)
    if ErrorCode.NOT_LEADER_OR_FOLLOWER in codes.values():  # the leadership moved while the batch waited
        _name_leaders(ctx, response)
    return response


def _name_leaders(ctx: RequestContext, response: ProduceResponse) -> None:
    """KIP-951 (v10+): partitions answered NOT_LEADER_OR_FOLLOWER carry their current leader and epoch, and the
    response those leaders' endpoints, as Kafka's KafkaApis.handleProduceRequest fills them."""
    if ctx.api_version < HINTS_VERSION:
        return
    hints = LeaderHints(ctx.server, ctx.conn.listener_name)
    for t in response.responses:
        for p in t.partition_responses:
            if p.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER:
                p.current_leader = hints.leader(t.name, p.index, ProduceResponse.LeaderIdAndEpoch)
    response.node_endpoints = hints.endpoints(ProduceResponse.NodeEndpoint)


HANDLERS = [ApiHandler(0, 0, 11, handle_produce,
                       frame=handle_produce_frame if produce_codec.COMPILED else None)]

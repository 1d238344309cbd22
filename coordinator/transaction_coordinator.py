"""TransactionCoordinator: transactional ids, producer epochs and transaction outcomes, as Kafka's
TransactionCoordinator + TransactionStateManager + the completion side of TransactionMarkerChannelManager.

Concurrency: all transaction state lives on one event loop thread (the coordinator loop: in the broker, the first
network processor's; standalone, a thread of its own). Handlers come in with `call()` (a task on that loop, from
another loop a thread hop), so the state machine needs no locks. Between the awaits of one request (the
__transaction_state write and its flush, a producer id block, marker writes) other requests run; a prepared
transition's pending state refuses them meanwhile (CONCURRENT_TRANSACTIONS), exactly as Kafka's per-transaction
lock plus pending state do. Every transition is written to the compacted __transaction_state topic (Kafka's record
schemas, transaction_records) and flushed per the log's flush policy before it is applied and answered.

Markers: after PrepareCommit/PrepareAbort is written the client is answered and a task on this loop asks the host
to write the markers (host.write_txn_markers), retrying partitions that failed, then writes CompleteCommit /
CompleteAbort. Loading a partition that holds a Prepare* state starts that task again. The coordinator epoch is
the __transaction_state partition's leader epoch: 0 on a single replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from kbroker.coordinator import transaction_records as records
from kbroker.coordinator.coordinator_loop import CoordinatorLoop
from kbroker.coordinator.group_coordinator import partition_for
from kbroker.coordinator.producer_ids import ProducerIdsExhausted
from kbroker.coordinator.transaction_metadata import (
    EXPIRATION_ALLOWED,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    IllegalTransactionTransition,
    TopicPartition,
    TransactionMetadata,
    TransactionState,
    TxnTransitMetadata,
    is_epoch_exhausted,
    unknown_state_filters,
)
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import DescribeTransactionsResponse, ListTransactionsResponse
from kbroker.protocol.records import build_batch, decode_records, iter_batch_headers
from kbroker.storage.errors import KafkaStorageError, NotLeaderOrFollowerError, RecordTooLargeError

log = logging.getLogger("kbroker.txn")

TRANSACTION_STATE_TOPIC = "__transaction_state"
# The key of add_partitions' answer to a request naming no partition: the transaction's one error code.
NO_PARTITION: TopicPartition = ("", -1)
S = TransactionState

# The marker's producer or coordinator epoch is stale: a newer coordinator owns the transaction (Kafka stops).
STALE_MARKER_ERRORS = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED})


# Kafka's TransactionStateManager.appendTransactionToLog: how a failed write of the state is answered.
_APPEND_ERRORS = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
}

class TxnCoordinatorHost(Protocol):
    """What the coordinator needs from the broker it runs in (implemented by broker/server.py)."""

    def txn_log(self, partition: int) -> Any: ...  # storage Log of __transaction_state-<p> (created on demand)

    def leads_txn_partition(self, partition: int) -> bool: ...

    def flush_log(self, lg: Any, offset: int) -> Awaitable[None]: ...

    def wait_replicated(self, lg: Any, offset: int) -> Awaitable[ErrorCode]: ...  # high watermark >= offset

    def generate_producer_id(self) -> Awaitable[int]: ...

    def partition_exists(self, topic: str, partition: int) -> bool: ...

    async def write_txn_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                                partitions: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]: ...


@dataclass
class TxnConfig:
    """Kafka's transaction.* broker settings."""

    num_partitions: int = 50  # transaction.state.log.num.partitions
    max_timeout_ms: int = 900000  # transaction.max.timeout.ms
    transactional_id_expiration_ms: int = 604800000  # transactional.id.expiration.ms
    abort_timed_out_interval_ms: int = 10000  # transaction.abort.timed.out.transaction.cleanup.interval.ms
    remove_expired_interval_ms: int = 3600000  # transaction.remove.expired.transaction.cleanup.interval.ms
    segment_bytes: int = 104857600  # transaction.state.log.segment.bytes
    replication_factor: int = 3  # transaction.state.log.replication.factor
    min_isr: int = 2  # transaction.state.log.min.isr
    load_buffer_size: int = 5242880  # transaction.state.log.load.buffer.size
    marker_retry_backoff_ms: int = 100  # pause before writing failed markers (or the Complete* record) again
    # AddPartitionsToTxn arriving while the previous transaction's markers are written waits this long for them
    # before answering CONCURRENT_TRANSACTIONS (0: answer at once, as Kafka).
    completion_wait_ms: int = 1000

    def topic_configs(self) -> dict[str, str]:
        """The configs __transaction_state is created with (Kafka's transactionTopicConfigs)."""
        return {"cleanup.policy": "compact", "compression.type": "uncompressed",
                "unclean.leader.election.enable": "false", "min.insync.replicas": str(self.min_isr),
                "segment.bytes": str(self.segment_bytes)}


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


def _now_ms() -> int:
    return int(time.time() * 1000)


def _error_result(error: ErrorCode) -> tuple[ErrorCode, int, int]:
    return error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH


class _NeedProducerId(Exception):
    """Raised by the init transit when a fresh producer id is needed (fetched outside, then retried)."""


class TransactionCoordinator(CoordinatorLoop):
    def __init__(self, host: TxnCoordinatorHost, config: TxnConfig,
                 time_ms: Callable[[], int] = _now_ms, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """loop: an event loop run by someone else (coordinator_loop); without one, a loop of its own."""
        self.host = host
        self.config = config
        self.time_ms = time_ms
        self.txns: dict[str, TransactionMetadata] = {}
        self.loading: set[int] = set()
        self.coordinator_epochs: dict[int, int] = {}
        self.active = False
        self._init_loop(loop, "txn-coordinator")
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: list[asyncio.TimerHandle] = []
        # transactional id -> resolved when its markers and Complete* record are written (or given up on).
        self._completions: dict[str, asyncio.Future[None]] = {}

    # ------------------------------------------------------------ lifecycle

    def start(self, partitions: list[int]) -> None:
        """Start the loop (when it is the coordinator's own) and load the given __transaction_state partitions in
        the background."""
        self._start_own_loop()

        def begin() -> None:
            self.loading = set(partitions)
            for p in partitions:
                self.coordinator_epochs[p] = 0
            self.active = True
            self._spawn(self._load_all(partitions))
            self._schedule(self.config.abort_timed_out_interval_ms, self._abort_timed_out_tick)
            self._schedule(self.config.remove_expired_interval_ms, self._expire_tick)

        self.loop.call_soon_threadsafe(begin)

    def load_partition(self, p: int, coordinator_epoch: int) -> None:
        """This broker became leader of __transaction_state-p at coordinator_epoch (the partition's leader
        epoch): load its transactional ids and finish the Prepare* ones (Kafka's onElection)."""
        def begin() -> None:
            if p in self.loading and self.coordinator_epochs.get(p) == coordinator_epoch:
                return
            self.loading.add(p)
            self.coordinator_epochs[p] = coordinator_epoch
            self._spawn(self._load_all([p]))
        self.loop.call_soon_threadsafe(begin)

    def unload_partition(self, p: int) -> None:
        """No longer leader of __transaction_state-p: forget its transactional ids (Kafka's onResignation)."""
        def drop() -> None:
            self.loading.discard(p)
            self.coordinator_epochs.pop(p, None)
            gone = [tid for tid in self.txns if self.partition_for(tid) == p]
            for tid in gone:
                del self.txns[tid]
            if gone:
                log.info("Unloaded %d transactional ids of %s-%d", len(gone), TRANSACTION_STATE_TOPIC, p)
        self.loop.call_soon_threadsafe(drop)

    def stop(self) -> None:
        """Cancel the marker tasks and timers and end the loop; state is in __transaction_state already, and
        a Prepare* whose markers were not all written is completed again when the partition is loaded."""
        if self.loop.is_running():
            done = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
            if not self._owns_loop:
                try:
                    done.result(timeout=5)
                except Exception:  # noqa: BLE001 - the loop stopped first: its tasks ended with it
                    pass
        self._join_own_loop()

    async def _shutdown(self) -> None:
        self.active = False
        for h in self._timers:
            h.cancel()
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._owns_loop:
            self.loop.stop()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("Transaction coordinator task failed", exc_info=task.exception())

    def _schedule(self, interval_ms: int, fn: Callable[[], None]) -> None:
        def tick() -> None:
            self._timers = [h for h in self._timers if not h.cancelled()]
            try:
                fn()
            finally:
                if self.active:
                    self._schedule(interval_ms, fn)
        self._timers.append(self.loop.call_later(interval_ms / 1000, tick))

    # ------------------------------------------------------------ loading

    async def _load_all(self, partitions: list[int]) -> None:
        for p in partitions:
            t0 = time.monotonic()
            try:
                recs = await self.loop.run_in_executor(None, self._read_partition, p)
            except Exception:
                log.exception("Loading %s-%d failed", TRANSACTION_STATE_TOPIC, p)
                recs = []
            loaded: dict[str, TransactionMetadata | None] = {}
            for r in recs:
                loaded[r.transactional_id] = r.metadata
            for tid, meta in loaded.items():
                if meta is None:
                    self.txns.pop(tid, None)
                else:
                    self.txns[tid] = meta
            # Out of loading first, so the Complete* writes of the transactions resumed below are not refused.
            self.loading.discard(p)
            if recs:
                log.info("Loaded %d transactional ids from %d records of %s-%d in %.3f s",
                         sum(m is not None for m in loaded.values()), len(recs), TRANSACTION_STATE_TOPIC, p,
                         time.monotonic() - t0)
            epoch = self.coordinator_epochs.get(p, 0)
            for tid, meta in loaded.items():
                if meta is not None and meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                    commit = meta.state is S.PREPARE_COMMIT
                    log.info("Completing %s of transactional id %s (producer %d epoch %d) loaded from %s-%d",
                             "commit" if commit else "abort", tid, meta.producer_id, meta.producer_epoch,
                             TRANSACTION_STATE_TOPIC, p)
                    self._spawn(self._complete_transaction(tid, meta, epoch, commit,
                                                           meta.prepare_complete(self.time_ms())))

    def _read_partition(self, p: int) -> list[records.TxnRecord]:
        lg = self.host.txn_log(p)
        out: list[records.TxnRecord] = []
        offset = lg.log_start_offset
        end = lg.log_end_offset
        while offset < end:
            info = lg.read(offset, max(self.config.load_buffer_size, 1), max_offset=end)
            if info.records is None or info.records.size == 0:
                break
            data = info.records.read_bytes()
            last = offset
            for pos, header in iter_batch_headers(data):
                if not header.is_control:
                    for rec in decode_records(data, pos):
                        if rec.offset < offset or rec.key is None:
                            continue
                        try:
                            out.append(records.parse_record(rec.key, rec.value))
                        except (records.UnknownTxnRecordVersion, ValueError) as e:
                            log.warning("Skipping record at offset %d of %s-%d: %s", rec.offset,
                                        TRANSACTION_STATE_TOPIC, p, e)
                last = header.next_offset
            if last <= offset:
                break
            offset = last
        return out

    # ------------------------------------------------------------ helpers

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.num_partitions)

    def coordinator_error(self, transactional_id: str) -> ErrorCode | None:
        """Kafka's getTransactionState errors: not ours, or still loading."""
        p = self.partition_for(transactional_id)
        if not self.active or not self.host.leads_txn_partition(p):
            return ErrorCode.NOT_COORDINATOR
        if p in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return None

    def _coordinator_epoch(self, transactional_id: str) -> int:
        return self.coordinator_epochs.get(self.partition_for(transactional_id), 0)

    def _still_owned(self, transactional_id: str, meta: TransactionMetadata, coordinator_epoch: int) -> bool:
        return (self.coordinator_error(transactional_id) is None and self.txns.get(transactional_id) is meta
                and self._coordinator_epoch(transactional_id) == coordinator_epoch)

    async def _generate_producer_id(self) -> int | ErrorCode:
        try:
            return await self.host.generate_producer_id()
        except ProducerIdsExhausted as e:
            log.error("No producer id for a transactional producer: %s", e)
            return ErrorCode.UNKNOWN_SERVER_ERROR
        except Exception:
            log.exception("Could not claim a producer id block for a transactional producer")
            return ErrorCode.COORDINATOR_NOT_AVAILABLE

    async def _append_record(self, transactional_id: str, value: bytes | None) -> ErrorCode:
        """Write one record to the transactional id's __transaction_state partition, durable per its flush policy
        (Kafka's appendTransactionToLog with its error mapping)."""
        p = self.partition_for(transactional_id)
        if not self.host.leads_txn_partition(p):
            return ErrorCode.NOT_COORDINATOR
        now = self.time_ms()
        try:
            lg = self.host.txn_log(p)
            batch = build_batch([(records.key_bytes(transactional_id), value, [], now)])
            info = lg.append_as_leader(batch, now, leader_epoch=lg.leader_epoch, from_client=False)
            if lg.unflushed_messages >= lg.config.flush_messages:
                await self.host.flush_log(lg, info.last_offset)
            if lg.high_watermark <= info.last_offset:
                # Replicated __transaction_state: the state counts once the ISR has it (Kafka's acks=all).
                code = await self.host.wait_replicated(lg, info.last_offset + 1)
                if code != ErrorCode.NONE:
                    log.warning("Writing transactional id %s to %s-%d: %s", transactional_id,
                                TRANSACTION_STATE_TOPIC, p, code.name)
                    return (ErrorCode.NOT_COORDINATOR if code == ErrorCode.NOT_LEADER_OR_FOLLOWER
                            else ErrorCode.COORDINATOR_NOT_AVAILABLE)
        except NotLeaderOrFollowerError as e:  # the partition moved while this write was on its way
            log.info("Writing transactional id %s to %s-%d: %s", transactional_id, TRANSACTION_STATE_TOPIC, p, e)
            return ErrorCode.NOT_COORDINATOR
        except KafkaError as e:
            # The topic is being created (here or by another broker) or its leaders are not elected yet: retriable,
            # as Kafka's appendTransactionToLog maps its append errors.
            code = _APPEND_ERRORS.get(e.code, ErrorCode.COORDINATOR_NOT_AVAILABLE)
            log.info("Writing transactional id %s to %s-%d: %s (answered %s)", transactional_id,
                     TRANSACTION_STATE_TOPIC, p, e, code.name)
            return code
        except KafkaStorageError as e:
            log.error("Writing transactional id %s to %s-%d failed: %s", transactional_id, TRANSACTION_STATE_TOPIC,
                      p, e)
            return ErrorCode.NOT_COORDINATOR
        except RecordTooLargeError as e:
            log.error("Transaction state of %s is too large for %s-%d: %s", transactional_id,
                      TRANSACTION_STATE_TOPIC, p, e)
            return ErrorCode.UNKNOWN_SERVER_ERROR
        except OSError as e:
            log.error("Writing transactional id %s to %s-%d failed: %s", transactional_id, TRANSACTION_STATE_TOPIC,
                      p, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        except Exception:
            log.exception("Writing transactional id %s to %s-%d failed", transactional_id, TRANSACTION_STATE_TOPIC, p)
            return ErrorCode.UNKNOWN_SERVER_ERROR
        return ErrorCode.NONE

    async def _append_transit(self, transactional_id: str, meta: TransactionMetadata, transit: TxnTransitMetadata,
                              coordinator_epoch: int, *, keep_pending_on_error: bool = False) -> ErrorCode:
        """Persist a prepared transition, then apply it (Kafka: only after the record is written)."""
        err = await self._append_record(transactional_id, records.value_bytes(transit))
        if err is ErrorCode.NONE:
            if not self._still_owned(transactional_id, meta, coordinator_epoch):
                log.info("Transactional id %s moved while writing %s: not coordinator any more", transactional_id,
                         transit.txn_state.kafka_name)
                return ErrorCode.NOT_COORDINATOR
            meta.complete_transition_to(transit)
            return ErrorCode.NONE
        if not keep_pending_on_error and self.txns.get(transactional_id) is meta:
            meta.pending_state = None
        return err

    # ------------------------------------------------------------ InitProducerId

    async def init_producer_id(self, transactional_id: str | None, transaction_timeout_ms: int,
                               expected_producer_id: int = NO_PRODUCER_ID,
                               expected_producer_epoch: int = NO_PRODUCER_EPOCH) -> tuple[ErrorCode, int, int]:
        """Kafka's handleInitProducerId: (error, producer id, producer epoch)."""
        try:
            return await self._init_producer_id(transactional_id, transaction_timeout_ms, expected_producer_id,
                                                expected_producer_epoch)
        except Exception:  # a bug: answered as Kafka answers an unexpected exception
            log.exception("InitProducerId of transactional id %s failed", transactional_id)
            return _error_result(ErrorCode.UNKNOWN_SERVER_ERROR)

    async def _init_producer_id(self, transactional_id: str | None, timeout_ms: int, expected_pid: int,
                                expected_epoch: int) -> tuple[ErrorCode, int, int]:
        if transactional_id is None:
            # An idempotent producer: a fresh producer id, no state kept.
            pid = await self._generate_producer_id()
            return _error_result(pid) if isinstance(pid, ErrorCode) else (ErrorCode.NONE, pid, 0)
        if not transactional_id:
            return _error_result(ErrorCode.INVALID_REQUEST)
        if (expected_pid == NO_PRODUCER_ID) != (expected_epoch == NO_PRODUCER_EPOCH):
            return _error_result(ErrorCode.INVALID_REQUEST)
        expected = None if expected_pid == NO_PRODUCER_ID else (expected_pid, expected_epoch)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return _error_result(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        new_pid: int | None = None
        while True:
            err = self.coordinator_error(transactional_id)
            if err is not None:
                return _error_result(err)
            meta = self.txns.get(transactional_id)
            if meta is None and new_pid is not None:
                meta = self.txns[transactional_id] = TransactionMetadata(
                    transactional_id, new_pid, NO_PRODUCER_EPOCH, timeout_ms, S.EMPTY,
                    txn_last_update_timestamp=self.time_ms())
                new_pid = None
            try:
                if meta is None:
                    raise _NeedProducerId
                result = self._prepare_init_transit(meta, timeout_ms, expected, new_pid)
                break
            except _NeedProducerId:
                got = await self._generate_producer_id()
                if isinstance(got, ErrorCode):
                    return _error_result(got)
                new_pid = got
        if isinstance(result, ErrorCode):
            return _error_result(result)
        assert meta is not None
        coordinator_epoch = self._coordinator_epoch(transactional_id)
        if result.txn_state is S.PREPARE_EPOCH_FENCE:
            # Abort the open transaction under the bumped epoch first; the client retries and gets a fresh epoch.
            err = await self._abort_fenced(transactional_id, meta, result)
            return _error_result(ErrorCode.CONCURRENT_TRANSACTIONS if err is ErrorCode.NONE else err)
        err = await self._append_transit(transactional_id, meta, result, coordinator_epoch)
        if err is not ErrorCode.NONE:
            log.info("InitProducerId of transactional id %s answers %s", transactional_id, err.name)
            return _error_result(err)
        log.info("Initialized transactional id %s with producer id %d and epoch %d on %s-%d", transactional_id,
                 result.producer_id, result.producer_epoch, TRANSACTION_STATE_TOPIC,
                 self.partition_for(transactional_id))
        return ErrorCode.NONE, result.producer_id, result.producer_epoch

    def _prepare_init_transit(self, meta: TransactionMetadata, timeout_ms: int, expected: tuple[int, int] | None,
                              new_pid: int | None) -> TxnTransitMetadata | ErrorCode:
        """Kafka's prepareInitProducerIdTransit (raises _NeedProducerId when the producer id must rotate)."""
        if meta.pending_transition_in_progress:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if expected is not None:
            pid, epoch = expected
            # Fenced unless the metadata was just created, the id is the current one (epoch checked below), or it
            # is the previous one with an exhausted epoch (a retry of a rotation whose answer was lost).
            if not (meta.producer_epoch == NO_PRODUCER_EPOCH or pid == meta.producer_id
                    or (pid == meta.last_producer_id and is_epoch_exhausted(epoch))):
                return ErrorCode.PRODUCER_FENCED
        state = meta.state
        if state in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if state in (S.COMPLETE_ABORT, S.COMPLETE_COMMIT, S.EMPTY):
            if meta.is_producer_epoch_exhausted and (expected is None or expected[1] == meta.producer_epoch):
                if new_pid is None:
                    raise _NeedProducerId
                log.info("Producer epochs of transactional id %s are exhausted: producer id %d replaces %d",
                         meta.transactional_id, new_pid, meta.producer_id)
                return meta.prepare_producer_id_rotation(new_pid, timeout_ms, self.time_ms(), expected is not None)
            return meta.prepare_increment_producer_epoch(timeout_ms, None if expected is None else expected[1],
                                                         self.time_ms())
        if state is S.ONGOING:
            return meta.prepare_fence_producer_epoch()
        raise IllegalTransactionTransition(f"transactional id {meta.transactional_id} found in state {state}")

    # ------------------------------------------------------------ AddPartitionsToTxn

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: list[TopicPartition], verify_only: bool = False
                             ) -> dict[TopicPartition, ErrorCode]:
        """Kafka's handleAddPartitionsToTransaction, or with verify_only (KIP-890) handleVerifyPartitionsInTransaction:
        a partition that is not in the transaction answers TRANSACTION_ABORTABLE (the broker maps it to
        INVALID_TXN_STATE for clients that predate it, as Kafka's AddPartitionsToTxnManager). Whether the topics
        exist is the handler's check (KafkaApis), so AddOffsetsToTxn can add __consumer_offsets partitions."""
        try:
            return await self._add_partitions(transactional_id, producer_id, producer_epoch, partitions, verify_only)
        except Exception:  # a bug: answered as Kafka answers an unexpected exception
            log.exception("AddPartitionsToTxn of transactional id %s failed", transactional_id)
            return dict.fromkeys(partitions or [NO_PARTITION], ErrorCode.UNKNOWN_SERVER_ERROR)

    async def _add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                              partitions: list[TopicPartition], verify_only: bool, waited: bool = False
                              ) -> dict[TopicPartition, ErrorCode]:
        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            # A request naming no partition still gets the transaction's one answer (Kafka lists its topics).
            return dict.fromkeys(partitions or [NO_PARTITION], code)

        if not transactional_id:
            return all_(ErrorCode.INVALID_REQUEST)
        err = self.coordinator_error(transactional_id)
        if err is not None:
            return all_(err)
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return all_(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if meta.producer_epoch != producer_epoch:
            return all_(ErrorCode.PRODUCER_FENCED)
        if verify_only:
            # No pending-state check: the partition's append validates again (Kafka).
            if meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                return all_(ErrorCode.CONCURRENT_TRANSACTIONS)
            return {tp: ErrorCode.NONE if tp in meta.topic_partitions else ErrorCode.TRANSACTION_ABORTABLE
                    for tp in partitions}
        if meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT) and not waited and self.config.completion_wait_ms > 0:
            # The previous transaction's markers are being written. Kafka answers CONCURRENT_TRANSACTIONS at once
            # and the client retries after its backoff (tens of milliseconds, once or twice per transaction for
            # librdkafka), while the markers usually land within milliseconds: wait for them, briefly, instead.
            await self._await_completion(transactional_id, self.config.completion_wait_ms / 1000)
            return await self._add_partitions(transactional_id, producer_id, producer_epoch, partitions, verify_only,
                                              waited=True)
        if meta.pending_transition_in_progress or meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return all_(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.state is S.ONGOING and meta.topic_partitions.issuperset(partitions):
            return all_(ErrorCode.NONE)
        transit = meta.prepare_add_partitions(set(partitions), self.time_ms())
        err = await self._append_transit(transactional_id, meta, transit, self._coordinator_epoch(transactional_id))
        return all_(err)

    def verify_partitions_now(self, transactional_id: str, producer_id: int, producer_epoch: int,
                              partitions: list[TopicPartition]) -> dict[TopicPartition, ErrorCode] | None:
        """add_partitions(verify_only=True) for the common case, answered on the caller's thread.

        The produce path verifies each partition a transaction writes to first (KIP-890); hopping onto the
        coordinator loop for it cost more than the append itself. This reads one TransactionMetadata's fields,
        each a single attribute or set-membership read (atomic under the GIL), and answers only a settled
        Ongoing transaction of this producer; anything else (loading, another coordinator, a pending transition,
        another producer or epoch) returns None and the caller asks on the loop, where every answer is exact.
        """
        meta = self._settled_ongoing(transactional_id, producer_id, producer_epoch)
        if meta is None:
            return None
        added = meta.topic_partitions
        return {tp: ErrorCode.NONE if tp in added else ErrorCode.TRANSACTION_ABORTABLE for tp in partitions}

    def in_transaction_now(self, transactional_id: str, producer_id: int, producer_epoch: int,
                           tp: TopicPartition) -> bool:
        """verify_partitions_now of one partition answered NONE (the single-partition Produce path's question)."""
        meta = self._settled_ongoing(transactional_id, producer_id, producer_epoch)
        return meta is not None and tp in meta.topic_partitions

    def _settled_ongoing(self, transactional_id: str, producer_id: int, producer_epoch: int
                         ) -> TransactionMetadata | None:
        """The settled Ongoing transaction of this producer at this epoch, coordinated and loaded here."""
        if self.coordinator_error(transactional_id) is not None:
            return None
        meta = self.txns.get(transactional_id)
        if (meta is None or meta.pending_state is not None or meta.state is not S.ONGOING
                or meta.producer_id != producer_id or meta.producer_epoch != producer_epoch):
            return None
        return meta

    # ------------------------------------------------------------ EndTxn

    async def end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                              commit: bool) -> ErrorCode:
        """Kafka's handleEndTransaction: answers once Prepare* is written; markers and Complete* follow."""
        try:
            return await self._end_transaction(transactional_id, producer_id, producer_epoch, commit,
                                               from_client=True)
        except Exception:  # a bug: answered as Kafka answers an unexpected exception
            log.exception("EndTxn of transactional id %s failed", transactional_id)
            return ErrorCode.UNKNOWN_SERVER_ERROR

    async def _end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                               from_client: bool) -> ErrorCode:
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        err = self.coordinator_error(transactional_id)
        if err is not None:
            return err
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        # Clients must use the current epoch; the coordinator's own aborts come with the bumped (fencing) one.
        if (from_client and producer_epoch != meta.producer_epoch) or producer_epoch < meta.producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if meta.pending_transition_in_progress and meta.pending_state is not S.PREPARE_EPOCH_FENCE:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        state = meta.state
        is_epoch_fence = False
        if state is S.ONGOING:
            next_state = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
            if next_state is S.PREPARE_ABORT and meta.pending_state is S.PREPARE_EPOCH_FENCE:
                # The fence turns into the abort: its bumped epoch becomes the transaction's epoch.
                is_epoch_fence = True
                meta.pending_state = None
                meta.producer_epoch = producer_epoch
                meta.last_producer_epoch = NO_PRODUCER_EPOCH
            transit = meta.prepare_abort_or_commit(next_state, self.time_ms())
        elif state is S.COMPLETE_COMMIT:
            return ErrorCode.NONE if commit else self._invalid_state(transactional_id, state, commit)
        elif state is S.COMPLETE_ABORT:
            return ErrorCode.NONE if not commit else self._invalid_state(transactional_id, state, commit)
        elif state is S.PREPARE_COMMIT:
            return ErrorCode.CONCURRENT_TRANSACTIONS if commit else self._invalid_state(transactional_id, state, commit)
        elif state is S.PREPARE_ABORT:
            return (ErrorCode.CONCURRENT_TRANSACTIONS if not commit
                    else self._invalid_state(transactional_id, state, commit))
        elif state is S.EMPTY:
            return self._invalid_state(transactional_id, state, commit)
        else:
            raise IllegalTransactionTransition(f"transactional id {transactional_id} found in state {state}")

        coordinator_epoch = self._coordinator_epoch(transactional_id)
        err = await self._append_transit(transactional_id, meta, transit, coordinator_epoch)
        if err is not ErrorCode.NONE:
            if is_epoch_fence and self.txns.get(transactional_id) is meta:
                meta.has_failed_epoch_fence = True
                log.warning("Fencing transactional id %s at epoch %d was not written (%s)", transactional_id,
                            transit.producer_epoch, err.name)
            return err
        # Check again after the write (Kafka's sendTxnMarkersCallback), then hand over to the marker task.
        if meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if meta.pending_transition_in_progress:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if meta.state is not (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT):
            return self._invalid_state(transactional_id, meta.state, commit)
        complete = meta.prepare_complete(self.time_ms())
        self._spawn(self._complete_transaction(transactional_id, meta, coordinator_epoch, commit, complete))
        return ErrorCode.NONE

    @staticmethod
    def _invalid_state(transactional_id: str, state: TransactionState, commit: bool) -> ErrorCode:
        log.warning("Transactional id %s is %s but the producer asks to %s", transactional_id, state.kafka_name,
                    "commit" if commit else "abort")
        return ErrorCode.INVALID_TXN_STATE

    # ------------------------------------------------------------ markers and completion

    async def _await_completion(self, transactional_id: str, timeout_s: float) -> None:
        fut = self._completions.get(transactional_id)
        if fut is None:
            fut = self._completions[transactional_id] = self.loop.create_future()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            pass

    async def _complete_transaction(self, transactional_id: str, meta: TransactionMetadata, coordinator_epoch: int,
                                    commit: bool, complete: TxnTransitMetadata) -> None:
        try:
            # Spawned by the EndTxn that wrote Prepare*: its answer goes out first, as Kafka sends it before the
            # markers. This task's first step is queued ahead of the answer's wake-up (created before the EndTxn
            # task completes) and writes every local marker and the Complete* record without a pause (~0.5 ms for
            # 32 partitions), so without this yield the producer waited for them on every commit.
            await asyncio.sleep(0)
            await self._write_markers_and_complete(transactional_id, meta, coordinator_epoch, commit, complete)
        finally:
            fut = self._completions.pop(transactional_id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def _write_markers_and_complete(self, transactional_id: str, meta: TransactionMetadata,
                                          coordinator_epoch: int, commit: bool, complete: TxnTransitMetadata) -> None:
        """Write the markers until every partition has one, then the Complete* record (Kafka's
        TransactionMarkerChannelManager). The pending Complete* state refuses other requests meanwhile."""
        backoff = self.config.marker_retry_backoff_ms / 1000
        result = "commit" if commit else "abort"
        while meta.topic_partitions:
            if not self._still_owned(transactional_id, meta, coordinator_epoch):
                log.info("Stopped writing %s markers of transactional id %s: not coordinator any more", result,
                         transactional_id)
                return
            pending = sorted(meta.topic_partitions)
            try:
                errors = await self.host.write_txn_markers(meta.producer_id, meta.producer_epoch, coordinator_epoch,
                                                           commit, pending)
            except Exception:
                log.exception("Writing %s markers of transactional id %s failed", result, transactional_id)
                errors = dict.fromkeys(pending, ErrorCode.UNKNOWN_SERVER_ERROR)
            if self.txns.get(transactional_id) is not meta:
                return
            retry: list[tuple[TopicPartition, ErrorCode]] = []
            for tp in pending:
                err = ErrorCode(errors.get(tp, ErrorCode.UNKNOWN_SERVER_ERROR))
                if err is ErrorCode.NONE:
                    meta.remove_partition(tp)
                elif err in STALE_MARKER_ERRORS:
                    log.warning("%s marker of transactional id %s for %s-%d refused with %s: the transaction "
                                "belongs to a newer producer or coordinator epoch", result, transactional_id,
                                tp[0], tp[1], err.name)
                    return
                elif not self.host.partition_exists(*tp):
                    log.info("%s-%d was deleted: no %s marker of transactional id %s needed", tp[0], tp[1], result,
                             transactional_id)
                    meta.remove_partition(tp)
                elif err is ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT:
                    meta.remove_partition(tp)
                else:
                    # Leadership moves, timeouts, storage errors: written again after a pause, whatever the error,
                    # since the transaction cannot complete without the marker.
                    retry.append((tp, err))
            if retry:
                log.info("Retrying %d %s markers of transactional id %s (%s)", len(retry), result, transactional_id,
                         ", ".join(f"{t}-{p}: {e.name}" for (t, p), e in retry[:5]))
                await asyncio.sleep(backoff)
        while True:
            if not self._still_owned(transactional_id, meta, coordinator_epoch):
                log.info("Not completing %s of transactional id %s: not coordinator any more", result,
                         transactional_id)
                return
            err = await self._append_transit(transactional_id, meta, complete, coordinator_epoch,
                                             keep_pending_on_error=True)
            if err is ErrorCode.NONE:
                # A commit is routine, one per transaction (hundreds a second from one producer): debug, as in
                # Kafka. An abort is worth a line.
                log.log(logging.INFO if not commit else logging.DEBUG, "Completed %s of transactional id %s "
                        "(producer %d epoch %d)", result, transactional_id, meta.producer_id, meta.producer_epoch)
                return
            if err is ErrorCode.NOT_COORDINATOR:
                return
            log.warning("Writing the completed %s of transactional id %s failed with %s, retrying", result,
                        transactional_id, err.name)
            await asyncio.sleep(backoff)

    # ------------------------------------------------------------ timeouts and expiration

    def _abort_timed_out_tick(self) -> None:
        self._spawn(self.abort_timed_out_transactions())

    async def abort_timed_out_transactions(self) -> None:
        """Kafka's abortTimedOutTransactions: bump the epoch (fencing the producer) and abort."""
        now = self.time_ms()
        for tid, meta in list(self.txns.items()):
            if self.partition_for(tid) in self.loading or meta.pending_transition_in_progress:
                continue
            if meta.state is not S.ONGOING or meta.txn_start_timestamp + meta.txn_timeout_ms >= now:
                continue
            try:
                fence = meta.prepare_fence_producer_epoch()
            except IllegalTransactionTransition:
                log.exception("Cannot abort timed out transaction of %s", tid)
                continue
            log.info("Aborting transaction of transactional id %s (producer %d epoch %d): timed out after %d ms",
                     tid, meta.producer_id, meta.producer_epoch, meta.txn_timeout_ms)
            self._spawn(self._abort_timed_out(tid, meta, fence))

    async def _abort_fenced(self, transactional_id: str, meta: TransactionMetadata,
                            fence: TxnTransitMetadata) -> ErrorCode:
        """Abort the open transaction under the fencing epoch (Kafka's endTransaction with isFromClient=false)."""
        try:
            return await self._end_transaction(transactional_id, fence.producer_id, fence.producer_epoch, False,
                                               from_client=False)
        finally:
            # The abort turns the fence into PrepareAbort; if it stopped before, the fence must not stay pending.
            if meta.pending_state is S.PREPARE_EPOCH_FENCE:
                meta.pending_state = None

    async def _abort_timed_out(self, transactional_id: str, meta: TransactionMetadata,
                               fence: TxnTransitMetadata) -> None:
        try:
            err = await self._abort_fenced(transactional_id, meta, fence)
        except Exception:
            log.exception("Aborting the timed out transaction of %s failed", transactional_id)
            return
        if err not in (ErrorCode.NONE, ErrorCode.INVALID_PRODUCER_ID_MAPPING, ErrorCode.PRODUCER_FENCED,
                       ErrorCode.CONCURRENT_TRANSACTIONS):
            log.warning("Aborting the timed out transaction of %s failed with %s", transactional_id, err.name)

    def _expire_tick(self) -> None:
        self._spawn(self.expire_transactional_ids())

    async def expire_transactional_ids(self) -> None:
        """Kafka's removeExpiredTransactionalIds: idle ids older than transactional.id.expiration.ms get a
        tombstone and leave the cache."""
        cutoff = self.time_ms() - self.config.transactional_id_expiration_ms
        for tid, meta in list(self.txns.items()):
            if self.partition_for(tid) in self.loading or meta.pending_transition_in_progress:
                continue
            if meta.state not in EXPIRATION_ALLOWED or meta.txn_last_update_timestamp > cutoff:
                continue
            dead = meta.prepare_dead()
            err = await self._append_record(tid, None)
            if self.txns.get(tid) is not meta:
                continue
            if err is ErrorCode.NONE and meta.pending_state is S.DEAD and meta.producer_epoch == dead.producer_epoch:
                del self.txns[tid]
                log.info("Expired transactional id %s (producer %d), idle since %d", tid, meta.producer_id,
                         meta.txn_last_update_timestamp)
            else:
                meta.pending_state = None

    # ------------------------------------------------------------ Describe / List

    async def describe_transactions(self, transactional_ids: list[str]
                                    ) -> list[DescribeTransactionsResponse.TransactionState]:
        return [self._describe(tid) for tid in transactional_ids]

    def _describe(self, tid: str) -> DescribeTransactionsResponse.TransactionState:
        # An answer in error keeps the schema's defaults (0), as Kafka's handleDescribeTransactions leaves them.
        out = DescribeTransactionsResponse.TransactionState(transactional_id=tid)
        if not self.active:
            out.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            return out
        if not tid:
            out.error_code = ErrorCode.INVALID_REQUEST
            return out
        err = self.coordinator_error(tid)
        if err is not None:
            out.error_code = err
            return out
        meta = self.txns.get(tid)
        if meta is None or meta.state is S.DEAD:
            out.error_code = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            return out
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(meta.topic_partitions):
            by_topic.setdefault(topic, []).append(partition)
        out.error_code = ErrorCode.NONE
        out.producer_id = meta.producer_id
        out.producer_epoch = meta.producer_epoch
        out.transaction_state = meta.state.kafka_name
        out.transaction_timeout_ms = meta.txn_timeout_ms
        out.transaction_start_time_ms = meta.txn_start_timestamp
        out.topics = [DescribeTransactionsResponse.TopicData(topic=t, partitions=ps) for t, ps in by_topic.items()]
        return out

    async def list_transactions(self, state_filters: list[str], producer_id_filters: list[int],
                                duration_filter_ms: int = -1
                                ) -> tuple[ErrorCode, list[str], list[ListTransactionsResponse.TransactionState]]:
        """Kafka's listTransactionStates: (error, the state filters that name no state, the transactions)."""
        unknown = unknown_state_filters(state_filters)
        if not self.active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, [], []
        if self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, [], []
        states = {s for s in map(TransactionState.from_name, state_filters) if s is not None}
        pids = set(producer_id_filters)
        now = self.time_ms()
        out = []
        for tid, meta in self.txns.items():
            if meta.state is S.DEAD or not self.host.leads_txn_partition(self.partition_for(tid)):
                continue
            if pids and meta.producer_id not in pids:
                continue
            if state_filters and meta.state not in states:
                continue
            if duration_filter_ms >= 0 and now - meta.txn_start_timestamp <= duration_filter_ms:
                continue
            out.append(ListTransactionsResponse.TransactionState(
                transactional_id=tid, producer_id=meta.producer_id, transaction_state=meta.state.kafka_name))
        return ErrorCode.NONE, unknown, out

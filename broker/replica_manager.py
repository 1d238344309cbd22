"""ReplicaManager: the partitions this broker hosts, appends, reads, replication state and the flush policy.

Two kinds of partitions live here:
- Partitions the controller told about (LeaderAndIsr -> become_leader_or_follower): a broker/partition.py
  Partition each, leader or follower, with its leader epoch, ISR and high watermark.
- Every other local partition (the embedded single-node default, and brokers whose controller has not
  spoken yet) is led by this broker when the metadata says so, at leader epoch 0 with ISR [self]: no
  Partition object, no per-request work beyond one dict lookup.

Role changes are serialized by `_state_lock` (Kafka's replicaStateChangeLock); a Partition guards its own
state. acks=all produce waits in a purgatory of its own until the high watermark passes the batch
(Kafka's DelayedProduce); both purgatories are notified when a high watermark moves.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from kbroker.broker.partition import Partition, check_leader_epoch
from kbroker.broker.purgatory import ANY, HIGH_WATERMARK, LOG_END, FetchPurgatory, expire
from kbroker.broker.replica_fetcher import ReplicaFetcherManager
from kbroker.coordinator.group_coordinator import OFFSETS_TOPIC
from kbroker.coordinator.metadata_store import PartitionState
from kbroker.coordinator.transaction_coordinator import TRANSACTION_STATE_TOPIC
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import AlterPartitionRequest, AlterPartitionResponse
from kbroker.storage.errors import KafkaStorageError, LogReplacedError
from kbroker.storage.log_dir_mover import ReplicaAlterLogDirsManager
from kbroker.storage.manager import LogManager, TopicPartition
from kbroker.storage.producer_state import VerificationGuard

if TYPE_CHECKING:
    from pathlib import Path

    from kbroker.broker.server import KafkaServer
    from kbroker.storage.log import Log

log = logging.getLogger("kbroker.replica")

# Leader epoch of partitions without a Partition (the single-node default): one replica, never re-elected.
LEADER_EPOCH = 0
ALTER_PARTITION_VERSION = 1  # topic names (ZooKeeper mode before topic ids in AlterPartition)



def error_of(exc: Exception) -> ErrorCode:
    code = getattr(exc, "error_code", None)
    if isinstance(exc, KafkaError):
        return exc.code
    if code is not None:
        return ErrorCode(code)
    return ErrorCode.UNKNOWN_SERVER_ERROR


def _now_ms() -> int:
    return int(time.time() * 1000)


class ReplicaManager:
    def __init__(self, server: KafkaServer, io_pool: Executor) -> None:
        self.server = server
        self.io_pool = io_pool
        self.purgatory = FetchPurgatory()
        self.produce_purgatory = FetchPurgatory()
        self.partitions: dict[TopicPartition, Partition] = {}
        self.controller_epoch = -1
        self._state_lock = threading.RLock()
        self._fetchers: ReplicaFetcherManager | None = None
        self._isr_task_started = False
        # Partitions whose last AlterPartition could not reach the controller: the repeats (one a second while it is
        # away) are logged at debug.
        self._unreached: set[tuple[str, int]] = set()
        self.log_dir_mover: ReplicaAlterLogDirsManager | None = None

    def attach_log_manager(self, lm: LogManager) -> None:
        """Follow the log manager's JBOD events: moved logs and failed log dirs."""
        lm.on_log_replaced = self._log_replaced
        lm.on_dir_offline = self._dir_offline
        rate = int(self.server.config["replica.alter.log.dirs.io.max.bytes.per.second"])
        self.log_dir_mover = ReplicaAlterLogDirsManager(lm, self._state_lock,
                                                        max_bytes_per_second=None if rate >= 2**63 - 1 else rate)
        if lm.future_logs():
            self.log_dir_mover.start()

    def _log_replaced(self, tp: TopicPartition, old: Log, new: Log) -> None:
        # Called with _state_lock held (the mover takes it for the swap).
        p = self.partitions.get(tp)
        if p is not None and p.log is old:
            p.log = new
        self._high_watermark_moved(tp)

    def _dir_offline(self, log_dir: Path, partitions: list[TopicPartition]) -> None:
        """Kafka's handleLogDirFailure: the dir's replicas stop fetching and leading (their requests answer
        KAFKA_STORAGE_ERROR), and in a ZooKeeper cluster the controller hears of it (propagateLogDirEvent) so that
        it moves their leaderships and takes them out of the ISRs."""
        with self._state_lock:
            if self._fetchers is not None and partitions:
                self._fetchers.remove_partitions(partitions)
            # Kafka's markPartitionOffline: no Partition is left to shrink ISRs or serve as leader.
            remaining = dict(self.partitions)
            for tp in partitions:
                p = remaining.pop(tp, None)
                if p is not None and p.is_leader:
                    self._on_leadership(p, False)
            self.partitions = remaining
        for tp in partitions:
            self._high_watermark_moved(tp)
        lm = self.server.log_manager
        if len(lm.offline_dirs) == len(lm.log_dirs):
            log.error("Every log dir has failed (%s): all partitions are offline",
                      ", ".join(str(d) for d in lm.log_dirs))
        propagate = getattr(self.server.metadata, "propagate_log_dir_event", None)
        if propagate is not None:
            propagate()

    def _check_online(self, topic: str, partition: int) -> None:
        offline = self.server.log_manager.offline_partitions
        if offline and (topic, partition) in offline:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{topic}-{partition} is in an offline log dir")

    # ------------------------------------------------------------ lookup

    def get_partition(self, topic: str, partition: int) -> Partition | None:
        return self.partitions.get((topic, partition))

    def get_log(self, topic: str, partition: int, current_leader_epoch: int = -1, leader_only: bool = True) -> Log:
        """The local log of a partition this broker leads, or KafkaError with Kafka's code. A client that names a
        leader epoch (>= 0) other than this replica's gets FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH before
        leadership (Kafka's Partition checks it first), after the partition's existence; one lookup answers both.
        leader_only False: a follower's log too (Kafka's localLogWithEpochOrThrow(requireLeader = false))."""
        self._check_online(topic, partition)
        p = self.partitions.get((topic, partition))
        if p is not None:
            if current_leader_epoch >= 0:
                p.check_leader_epoch(current_leader_epoch)
            return p.leader_log() if leader_only else p.log
        rec = self.server.metadata.topics.get(topic)
        if rec is None or not 0 <= partition < len(rec.partitions):
            # Kafka's getPartitionOrException: a partition nobody has is unknown, whatever epoch the client names.
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if current_leader_epoch >= 0:
            check_leader_epoch(current_leader_epoch, rec.partitions[partition].leader_epoch)
        if rec.leaders[partition] != self.server.broker_id:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        lg = self.server.log_manager.get_log(topic, partition)
        if lg is None:
            lg = self.server.admin.ensure_log(topic, partition)
        return lg

    def leads(self, topic: str, partition: int) -> bool | None:
        """Whether this broker leads a partition the controller told about; None for the others."""
        p = self.partitions.get((topic, partition))
        return None if p is None else p.is_leader

    def leader_epoch(self, topic: str, partition: int) -> int:
        """This replica's leader epoch, else the controller's last word in the metadata (0 on the single node)."""
        p = self.partitions.get((topic, partition))
        if p is not None:
            return p.leader_epoch
        rec = self.server.metadata.topics.get(topic)
        if rec is None or not 0 <= partition < rec.num_partitions:
            return LEADER_EPOCH
        return rec.partitions[partition].leader_epoch

    def under_replicated_count(self) -> int:
        return sum(1 for p in list(self.partitions.values()) if p.is_leader and len(p.isr) < len(p.replicas))

    def min_insync_replicas(self, topic: str) -> int:
        rec = self.server.metadata.topics.get(topic)
        value = rec.configs.get("min.insync.replicas") if rec is not None else None
        if value is not None:
            return int(value)
        return int(self.server.config.effective("min.insync.replicas", self.server.metadata.broker_configs))

    # ------------------------------------------------------------ produce

    def append(self, topic: str, partition: int, records: Any, required_acks: int,
               verification_guard: VerificationGuard | None = None) -> Any:
        try:
            return self._append(topic, partition, records, required_acks, verification_guard)
        except LogReplacedError:
            # The log moved to another log dir between the lookup and the append (nothing was written): once more.
            return self._append(topic, partition, records, required_acks, verification_guard)

    def _append(self, topic: str, partition: int, records: Any, required_acks: int,
                verification_guard: VerificationGuard | None) -> Any:
        lg, epoch = self.leader_log_for_append(topic, partition, required_acks)
        try:
            info = lg.append_as_leader(records, int(time.time() * 1000), leader_epoch=epoch,
                                       verification_guard=verification_guard)
        except LogReplacedError:
            raise
        except KafkaStorageError as e:
            self.append_failed(topic, partition, lg, e)
            raise
        self.appended(topic, partition, lg, info.last_offset)
        return lg, info

    def leader_log_for_append(self, topic: str, partition: int, required_acks: int) -> tuple[Log, int]:
        """The log a client's append goes to and the leader epoch its batches get, or KafkaError with Kafka's code
        (the partition offline, unknown, led elsewhere; acks=all with too few in sync). Nothing is changed, so
        the direct Produce path may ask and then leave the request to the general one."""
        p = self.partitions.get((topic, partition))
        if p is None:
            lg = self.get_log(topic, partition)  # its first check: the log dir online
            if required_acks == -1:
                min_isr = self.min_insync_replicas(topic)
                if min_isr > 1:
                    # One replica is the whole ISR, so acks=all cannot meet a larger minimum.
                    raise KafkaError(
                        ErrorCode.NOT_ENOUGH_REPLICAS,
                        f"The size of the current ISR 1 is insufficient to satisfy the min.isr requirement of {min_isr}",
                    )
            return lg, LEADER_EPOCH
        self._check_online(topic, partition)
        lg = p.leader_log()
        if required_acks == -1:
            p.check_enough_replicas(self.min_insync_replicas(topic))
        return lg, p.leader_epoch

    def append_failed(self, topic: str, partition: int, lg: Log, e: KafkaStorageError) -> None:
        """A client append that failed in the log's storage: logged, and the log dir failed unless the disk is full."""
        log.error("Append to %s-%d at offset %d failed (KAFKA_STORAGE_ERROR): %s",
                  topic, partition, lg.log_end_offset, e)
        self.server.log_manager.maybe_fail_dir(lg, e)

    def appended(self, topic: str, partition: int, lg: Log, last_offset: int) -> None:
        """After a client append: the fetches waiting on the partition are told (without followers to wait for,
        the high watermark moved with the log end)."""
        self.purgatory.notify((topic, partition), ANY if lg.high_watermark > last_offset else LOG_END)

    async def wait_for_replication(self, pending: list[tuple[str, int, int]],
                                   timeout_ms: int) -> dict[TopicPartition, ErrorCode]:
        """acks=all (Kafka's DelayedProduce): wait until each partition's high watermark reaches its required
        offset, the partition has an answer (not leader any more, ISR below min.insync.replicas) or timeout."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        result: dict[TopicPartition, ErrorCode] = {}
        waiting = list(pending)
        while True:
            waiter = self.produce_purgatory.watch([(t, p) for t, p, _ in waiting])
            try:
                still = []
                for t, p, required in waiting:
                    part = self.partitions.get((t, p))
                    if part is None:
                        status: ErrorCode | None = ErrorCode.NONE
                    else:
                        status = part.replication_status(required, self.min_insync_replicas(t))
                    if status is None:
                        still.append((t, p, required))
                    else:
                        result[(t, p)] = status
                waiting = still
                left = deadline - time.monotonic()
                if not waiting:
                    return result
                if left <= 0:
                    for t, p, _ in waiting:
                        result[(t, p)] = ErrorCode.REQUEST_TIMED_OUT
                    return result
                timer = asyncio.get_running_loop().call_later(left, expire, waiter.future)
                try:
                    if await waiter.future:
                        deadline = 0.0  # the timer's: what still waits has timed out
                finally:
                    timer.cancel()
            finally:
                self.produce_purgatory.unwatch(waiter)

    async def wait_for_high_watermark(self, lg: Log, required_offset: int, timeout_ms: int) -> ErrorCode:
        """The coordinators' acks=all: their internal-topic writes count once replicated."""
        if lg.high_watermark >= required_offset:
            return ErrorCode.NONE
        tp = (lg.topic, lg.partition)
        return (await self.wait_for_replication([(tp[0], tp[1], required_offset)], timeout_ms)).get(
            tp, ErrorCode.NONE)

    def _high_watermark_moved(self, tp: TopicPartition) -> None:
        self.purgatory.notify(tp, HIGH_WATERMARK)
        self.produce_purgatory.notify(tp)

    # ------------------------------------------------------------ leader side of replication

    def record_follower_fetch(self, p: Partition, replica_id: int, fetch_offset: int, leader_leo: int) -> None:
        moved, expand = p.update_follower_fetch_state(replica_id, fetch_offset, leader_leo, _now_ms())
        if moved:
            self._high_watermark_moved((p.topic, p.partition))
        if expand is not None:
            log.info("%s: follower %d caught up at offset %d, proposing ISR %s", p.name, replica_id, fetch_offset,
                     list(expand))
            self._submit_alter_partition(p, expand)

    def _submit_alter_partition(self, p: Partition, new_isr: tuple[int, ...]) -> None:
        loop = self.server.inter_broker.loop
        asyncio.run_coroutine_threadsafe(self._alter_partition(p, new_isr), loop)

    async def _alter_partition(self, p: Partition, new_isr: tuple[int, ...]) -> None:
        """Propose an ISR to the controller (AlterPartition, Kafka's AlterPartitionManager); the Partition
        takes it once committed. Errors leave the ISR as it was: the next check proposes again."""
        req = AlterPartitionRequest(
            broker_id=self.server.broker_id,
            broker_epoch=int(getattr(self.server.metadata, "broker_epoch", -1)),
            topics=[AlterPartitionRequest.TopicData(topic_name=p.topic, partitions=[
                AlterPartitionRequest.PartitionData(partition_index=p.partition, leader_epoch=p.leader_epoch,
                                                    new_isr=list(new_isr), partition_epoch=p.partition_epoch)])])
        try:
            resp: AlterPartitionResponse = await self.server.inter_broker.send_to_controller(
                56, ALTER_PARTITION_VERSION, req)
        except (ConnectionError, KafkaError) as e:
            tp = (p.topic, p.partition)
            (log.debug if tp in self._unreached else log.warning)(
                "%s: AlterPartition to the controller failed: %s", p.name, e)
            self._unreached.add(tp)
            await asyncio.sleep(0.1)
            self._proposal_failed(p)
            return
        self._unreached.discard((p.topic, p.partition))
        code = ErrorCode(resp.error_code)
        answer = next((pd for t in resp.topics for pd in t.partitions
                       if t.topic_name == p.topic and pd.partition_index == p.partition), None)
        if code == ErrorCode.NONE and answer is not None:
            code = ErrorCode(answer.error_code)
        if code != ErrorCode.NONE or answer is None:
            # INELIGIBLE_REPLICA is the expected answer while the follower's broker is in its controlled shutdown
            # (it still fetches until it closes): Kafka logs that one at info too.
            (log.info if code == ErrorCode.INELIGIBLE_REPLICA else log.warning)(
                "%s: AlterPartition to ISR %s answered %s", p.name, list(new_isr), code.name)
            self._proposal_failed(p)
            return
        if p.apply_isr(answer.leader_epoch, list(answer.isr), answer.partition_epoch):
            self._high_watermark_moved((p.topic, p.partition))
        else:
            self.produce_purgatory.notify((p.topic, p.partition))

    def _proposal_failed(self, p: Partition) -> None:
        if p.clear_pending_isr():
            self._high_watermark_moved((p.topic, p.partition))

    def _start_isr_checks(self) -> None:
        if self._isr_task_started:
            return
        self._isr_task_started = True
        loop = self.server.inter_broker.loop
        interval = max(self.server.config["replica.lag.time.max.ms"] / 2000, 0.05)

        def tick() -> None:
            try:
                self._shrink_isrs()
            finally:
                loop.call_later(interval, tick)

        loop.call_soon_threadsafe(lambda: loop.call_later(interval, tick))

    def _shrink_isrs(self) -> None:
        """Kafka's maybeShrinkIsr: followers not caught up within replica.lag.time.max.ms leave the ISR."""
        now = _now_ms()
        lag = self.server.config["replica.lag.time.max.ms"]
        for p in list(self.partitions.values()):
            new_isr = p.isr_to_shrink(now, lag)
            if new_isr is not None:
                (log.debug if (p.topic, p.partition) in self._unreached else log.info)(
                    "%s: shrinking ISR %s -> %s (followers behind for more than %d ms)", p.name, list(p.isr),
                    list(new_isr), lag)
                self._submit_alter_partition(p, new_isr)

    # ------------------------------------------------------------ LeaderAndIsr / StopReplica

    def become_leader_or_follower(self, controller_id: int, controller_epoch: int,
                                  states: list[tuple[str, int, PartitionState]],
                                  new_partitions: set[TopicPartition] | None = None) -> dict[TopicPartition, ErrorCode]:
        """Apply the controller's LeaderAndIsr (Kafka's becomeLeaderOrFollower). new_partitions: those the request
        marks isNew; a log is created for any other only while no log dir is offline (its log may be in that dir)."""
        result: dict[TopicPartition, ErrorCode] = {}
        with self._state_lock:
            if controller_epoch < self.controller_epoch:
                log.warning("Ignoring LeaderAndIsr from controller %d with epoch %d: the latest is %d",
                            controller_id, controller_epoch, self.controller_epoch)
                return {(t, p): ErrorCode.STALE_CONTROLLER_EPOCH for t, p, _ in states}
            self.controller_epoch = controller_epoch
            leaders: list[tuple[Partition, PartitionState]] = []
            followers: list[tuple[Partition, PartitionState]] = []
            for topic, index, state in states:
                tp = (topic, index)
                if self.server.broker_id not in state.replicas:
                    result[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if tp in self.server.log_manager.offline_partitions:
                    # Kafka's answer for a replica in a failed log dir: its controller marks the replica offline.
                    result[tp] = ErrorCode.KAFKA_STORAGE_ERROR
                    continue
                p = self.partitions.get(tp)
                if p is not None and state.leader_epoch < p.leader_epoch:
                    log.warning("Ignoring LeaderAndIsr for %s-%d at leader epoch %d: ours is %d", topic, index,
                                state.leader_epoch, p.leader_epoch)
                    result[tp] = ErrorCode.STALE_CONTROLLER_EPOCH
                    continue
                try:
                    if p is None:
                        lg = self._local_log(topic, index, new_partitions is None or tp in new_partitions)
                        p = Partition(topic, index, self.server.broker_id, lg)
                        self.partitions = {**self.partitions, tp: p}
                except Exception as e:  # noqa: BLE001 - a partition without a log answers its own error
                    log.error("Cannot open the log of %s-%d: %s", topic, index, e)
                    result[tp] = ErrorCode.KAFKA_STORAGE_ERROR
                    continue
                (leaders if state.leader == self.server.broker_id else followers).append((p, state))
                result[tp] = ErrorCode.NONE
            if leaders:
                self._make_leaders(leaders)
            if followers:
                self._make_followers(followers)
            self._start_isr_checks()
        return result

    def _local_log(self, topic: str, partition: int, is_new: bool = True) -> Log:
        lg = self.server.log_manager.get_log(topic, partition)
        if lg is not None:
            return lg
        rec = self.server.metadata.topics.get(topic)
        config = self.server.admin.log_config_for(rec) if rec is not None else None
        return self.server.log_manager.get_or_create_log(topic, partition, config, is_new=is_new)

    def _make_leaders(self, leaders: list[tuple[Partition, PartitionState]]) -> None:
        if self._fetchers is not None:
            self._fetchers.remove_partitions([(p.topic, p.partition) for p, _ in leaders])
            self._fetchers.shutdown_idle_fetchers()
        now = _now_ms()
        for p, state in leaders:
            was_leader = p.is_leader
            p.make_leader(state, now)
            # Only a new leadership loads the coordinators (Kafka's isNewLeader): a leader epoch bump while
            # leading (an ISR change by the controller) must not reload a partition whose groups are live, or
            # members waiting in JoinGroup lose their pending answer.
            if not was_leader:
                self._on_leadership(p, True)
            self._high_watermark_moved((p.topic, p.partition))

    def _make_followers(self, followers: list[tuple[Partition, PartitionState]]) -> None:
        fetchers = self._fetcher_manager()
        changed = []
        for p, state in followers:
            was_leader = p.is_leader
            if p.make_follower(state) or was_leader:
                changed.append(p)
            # Also when it was not leader here: coordinators may have loaded it at startup from older metadata.
            self._on_leadership(p, False)
            # Waiting acks=all produce and fetches learn they lost the leadership.
            self._high_watermark_moved((p.topic, p.partition))
        fetchers.remove_partitions([(p.topic, p.partition) for p in changed])
        fetchers.add_partitions([p for p in changed if p.leader_id >= 0])
        fetchers.shutdown_idle_fetchers()

    def _on_leadership(self, p: Partition, leader: bool) -> None:
        """The coordinators follow the leadership of their internal topic's partitions."""
        if p.topic == OFFSETS_TOPIC:
            gc = self.server.group_coordinator
            gc.load_partition(p.partition) if leader else gc.unload_partition(p.partition)
        elif p.topic == TRANSACTION_STATE_TOPIC:
            tc = self.server.txn_coordinator
            tc.load_partition(p.partition, p.leader_epoch) if leader else tc.unload_partition(p.partition)

    def stop_replicas(self, partitions: list[TopicPartition], delete: bool) -> dict[TopicPartition, ErrorCode]:
        """The controller's StopReplica: stop fetching and leading; delete the logs when asked."""
        result: dict[TopicPartition, ErrorCode] = {}
        with self._state_lock:
            if self._fetchers is not None:
                self._fetchers.remove_partitions(partitions)
                self._fetchers.shutdown_idle_fetchers()
            remaining = dict(self.partitions)
            for tp in partitions:
                # Without delete the replica stays hosted, neither leading nor fetching (Kafka keeps it in
                # allPartitions), so the metadata's older word cannot make it a leader again.
                p = remaining.pop(tp, None) if delete else remaining.get(tp)
                if p is not None:
                    if p.is_leader:
                        self._on_leadership(p, False)
                    p.stop()
                result[tp] = ErrorCode.NONE
            self.partitions = remaining
            for tp in partitions:
                self._high_watermark_moved(tp)
                if delete:
                    try:
                        self.server.log_manager.delete_log(*tp)
                    except OSError as e:
                        log.error("Deleting the log of %s-%d failed: %s", tp[0], tp[1], e)
                        result[tp] = ErrorCode.KAFKA_STORAGE_ERROR
        return result

    def _fetcher_manager(self) -> ReplicaFetcherManager:
        if self._fetchers is None:
            self._fetchers = ReplicaFetcherManager(self.server, self)
        return self._fetchers

    def shutdown(self) -> None:
        if self._fetchers is not None:
            self._fetchers.shutdown()
        if self.log_dir_mover is not None:
            self.log_dir_mover.shutdown()

    # ------------------------------------------------------------ flush

    def needs_flush(self, lg: Log) -> bool:
        return bool(lg.unflushed_messages >= lg.config.flush_messages)

    async def flush(self, logs: Iterable[tuple[Log, int]]) -> None:
        """fsync logs up to the given offsets off the event loop; the log shares one fsync among waiters."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self.io_pool, lg.flush, offset + 1) for lg, offset in logs))

    def flush_in_background(self, logs: Iterable[tuple[Log, int]]) -> None:
        for lg, offset in logs:
            self.io_pool.submit(lg.flush, offset + 1)

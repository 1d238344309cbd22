"""Partition: one replicated topic-partition on this broker (Kafka's Partition).

The leader tracks its followers' log end offsets from their fetches, keeps the high watermark at the
minimum log end over the ISR, and proposes ISR changes (shrink after replica.lag.time.max.ms without
catching up, expand once a follower reached the high watermark) that the controller commits through
AlterPartition; only a committed ISR counts. A follower only knows its leader and epoch: its fetcher
moves its log.

Concurrency: fetches (network processor threads), produce, the fetchers and LeaderAndIsr handling all
touch a partition from different threads, so its replication state is guarded by `lock` (Kafka's
leaderIsrUpdateLock). Reads of the role and epoch on the hot path take no lock: they are single
attribute reads, and a request racing a leadership change is fenced by the log's own checks or the
epoch check of the next request, as in Kafka.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from kbroker.broker.metrics import IsrChanges
from kbroker.coordinator.metadata_store import PartitionState
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.storage.log import Log

log = logging.getLogger("kbroker.partition")


@dataclass(slots=True)
class ReplicaState:
    """What the leader knows of one follower (Kafka's Replica)."""

    broker_id: int
    log_end_offset: int = -1  # unknown until its first fetch
    last_caught_up_ms: int = 0
    last_fetch_leader_leo: int = -1
    last_fetch_ms: int = 0


def _reset_replica_state(prev: ReplicaState | None, broker_id: int, in_sync: bool, now_ms: int,
                         leader_leo: int) -> ReplicaState:
    caught_up_ms = now_ms if in_sync else 0
    if prev is None:
        return ReplicaState(broker_id, last_caught_up_ms=caught_up_ms)
    return ReplicaState(broker_id, log_end_offset=prev.log_end_offset, last_caught_up_ms=caught_up_ms,
                        last_fetch_leader_leo=leader_leo, last_fetch_ms=caught_up_ms)


def check_leader_epoch(current_leader_epoch: int, epoch: int) -> None:
    """UNKNOWN_LEADER_EPOCH for a request from a newer epoch than the replica's, FENCED_LEADER_EPOCH from an older."""
    if current_leader_epoch > epoch:
        raise KafkaError(ErrorCode.UNKNOWN_LEADER_EPOCH)
    if current_leader_epoch < epoch:
        raise KafkaError(ErrorCode.FENCED_LEADER_EPOCH)


class Partition:
    def __init__(self, topic: str, partition: int, local_id: int, lg: Log) -> None:
        self.topic = topic
        self.partition = partition
        self.local_id = local_id
        self.log = lg
        self.lock = threading.Lock()
        self.leader_id = -1
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.isr: tuple[int, ...] = ()
        self.replicas: tuple[int, ...] = ()
        self.remotes: dict[int, ReplicaState] = {}
        # The ISR proposed to the controller and not answered yet (Kafka's PendingPartitionChange).
        self.pending_isr: tuple[int, ...] | None = None
        self.leader_epoch_start_offset = 0

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_id

    @property
    def high_watermark_lagging(self) -> bool:
        """Leader here, with a high watermark not yet at the start of its leader epoch (Kafka's maybeOffsetsError):
        it learns the high watermark from its followers' next fetches, so for a moment it is below what the previous
        leader had acknowledged."""
        return self.is_leader and self.leader_epoch_start_offset > self.log.high_watermark

    def leader_log(self) -> Log:
        if self.leader_id != self.local_id:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                             f"broker {self.local_id} is not the leader of {self.name} (leader {self.leader_id})")
        return self.log

    def check_leader_epoch(self, current_leader_epoch: int) -> None:
        """Kafka's fencing of a request that names the leader epoch it knows (-1: it knows none)."""
        if current_leader_epoch >= 0:
            check_leader_epoch(current_leader_epoch, self.leader_epoch)

    # -- role changes (LeaderAndIsr) -----------------------------------------------------------

    def make_leader(self, state: PartitionState, now_ms: int) -> bool:
        """Become (or stay) leader with state; True when this is a new leader epoch."""
        with self.lock:
            was_leader = self.is_leader
            new_epoch = not was_leader or state.leader_epoch != self.leader_epoch
            lg = self.log
            leo = lg.become_leader(state.leader_epoch)
            self.leader_id = self.local_id
            self.leader_epoch = state.leader_epoch
            self.partition_epoch = state.partition_epoch
            self.replicas = tuple(state.replicas)
            self.isr = tuple(state.isr)
            self.pending_isr = None
            if new_epoch:
                # Kafka's resetReplicaState: those in the ISR count as caught up now. A new leader knows nothing of
                # its followers' logs; one re-elected at a new epoch (the controller changed the ISR, as in another
                # broker's controlled shutdown) keeps their log ends, which it served itself, so the high watermark
                # does not wait for their first fetches at the new epoch (a Produce pause of up to a second).
                old = self.remotes if was_leader else {}
                self.remotes = {b: _reset_replica_state(old.get(b), b, b in self.isr, now_ms, leo)
                                for b in self.replicas if b != self.local_id}
                self.leader_epoch_start_offset = leo
            else:
                self.remotes = {b: self.remotes.get(b) or ReplicaState(b) for b in self.replicas
                                if b != self.local_id}
            lg.set_hw_tracks_leo(self.isr == (self.local_id,))
            self._maybe_increment_hw()
        if new_epoch:
            log.info("%s: leader at epoch %d from offset %d, ISR %s, high watermark %d", self.name,
                     state.leader_epoch, leo, list(self.isr), lg.high_watermark)
        return new_epoch

    def make_follower(self, state: PartitionState) -> bool:
        """Follow state.leader; True when the leader or its epoch changed (the fetcher starts over)."""
        with self.lock:
            changed = self.leader_id != state.leader or self.leader_epoch != state.leader_epoch
            self.leader_id = state.leader
            self.leader_epoch = state.leader_epoch
            self.partition_epoch = state.partition_epoch
            self.replicas = tuple(state.replicas)
            self.isr = tuple(state.isr)
            self.remotes = {}
            self.pending_isr = None
            self.log.become_follower(state.leader_epoch)
            self.log.set_hw_tracks_leo(False)
        if changed:
            log.info("%s: follower of broker %d at epoch %d, log end %d, high watermark %d", self.name,
                     state.leader, state.leader_epoch, self.log.log_end_offset, self.log.high_watermark)
        return changed

    # -- leader: followers' fetches, high watermark, ISR ---------------------------------------

    def update_follower_fetch_state(self, replica_id: int, fetch_offset: int, leader_leo: int,
                                    now_ms: int) -> tuple[bool, tuple[int, ...] | None]:
        """A follower fetched from fetch_offset while the leader's log ended at leader_leo.

        Returns (whether the high watermark moved, an expanded ISR to propose or None).
        """
        with self.lock:
            r = self.remotes.get(replica_id)
            if r is None or not self.is_leader:
                return False, None
            if fetch_offset >= leader_leo:
                r.last_caught_up_ms = now_ms
            elif fetch_offset >= r.last_fetch_leader_leo:
                r.last_caught_up_ms = max(r.last_caught_up_ms, r.last_fetch_ms)
            moved = r.log_end_offset != fetch_offset
            r.log_end_offset = fetch_offset
            r.last_fetch_leader_leo = leader_leo
            r.last_fetch_ms = now_ms
            expand = None
            if (replica_id not in self.isr and self.pending_isr is None and replica_id in self.replicas
                    and fetch_offset >= self.log.high_watermark and fetch_offset >= self.leader_epoch_start_offset):
                expand = self.pending_isr = (*self.isr, replica_id)
                # Counted from now on: a leader that was the whole ISR no longer commits each append at once.
                self.log.set_hw_tracks_leo(False)
            # As Kafka's updateFollowerFetchState: the high watermark is looked at only when the follower's log end
            # moved (a fetch woken by an append reads again at the offset it arrived with, and no other input of
            # the minimum changes with it: the leader's log end only rises above it, an ISR change checks itself).
            return moved and self._maybe_increment_hw(), expand

    def touch_caught_up_follower(self, replica_id: int, fetch_offset: int, now_ms: int) -> bool:
        """A follower in the ISR fetched again at this log's end, where it already was: it stays caught up. The
        short form of update_follower_fetch_state for the idle partitions of a follower's fetch session, where
        nothing else can change (its log end is the same, so the high watermark is too). False when the full
        form must run: not leading, the follower behind, outside the ISR, or an ISR change pending."""
        with self.lock:
            r = self.remotes.get(replica_id)
            if (r is None or not self.is_leader or self.pending_isr is not None or r.log_end_offset != fetch_offset
                    or fetch_offset < self.log.log_end_offset or replica_id not in self.isr):
                return False
            r.last_caught_up_ms = now_ms
            r.last_fetch_leader_leo = fetch_offset
            r.last_fetch_ms = now_ms
            return True

    def maybe_increment_hw(self) -> bool:
        with self.lock:
            return self._maybe_increment_hw()

    def _maximal_isr(self) -> tuple[int, ...]:
        """The ISR and a proposed addition not yet committed (Kafka's maximalIsr): once the controller commits it,
        the new member may be elected, so the high watermark must not pass its log end meanwhile. A proposed
        shrink removes nobody before it is committed."""
        pending = self.pending_isr
        if pending is None:
            return self.isr
        return self.isr + tuple(b for b in pending if b not in self.isr)

    def _maybe_increment_hw(self) -> bool:
        if not self.is_leader:
            return False
        hw = self.log.log_end_offset
        for b in self._maximal_isr():
            if b != self.local_id:
                r = self.remotes.get(b)
                hw = min(hw, r.log_end_offset if r is not None else -1)
        return self.log.maybe_increment_high_watermark(hw)

    def isr_to_shrink(self, now_ms: int, lag_ms: int) -> tuple[int, ...] | None:
        """The ISR without followers that have not caught up for lag_ms, when it differs (and none is pending)."""
        with self.lock:
            if not self.is_leader or self.pending_isr is not None:
                return None
            out = [b for b in self.isr if b != self.local_id
                   and now_ms - (self.remotes[b].last_caught_up_ms if b in self.remotes else 0) > lag_ms]
            if not out:
                return None
            self.pending_isr = tuple(b for b in self.isr if b not in out)
            return self.pending_isr

    def apply_isr(self, leader_epoch: int, isr: list[int], partition_epoch: int) -> bool:
        """The controller committed an ISR (AlterPartition answer); True when the high watermark moved."""
        with self.lock:
            self.pending_isr = None
            if not self.is_leader or leader_epoch != self.leader_epoch or partition_epoch < self.partition_epoch:
                return False
            old = self.isr
            self.isr = tuple(isr)
            IsrChanges.record(old, self.isr)
            self.partition_epoch = partition_epoch
            before = self.log.high_watermark
            # An ISR of one moves the high watermark to the log end inside set_hw_tracks_leo.
            self.log.set_hw_tracks_leo(self.isr == (self.local_id,))
            self._maybe_increment_hw()
            moved = self.log.high_watermark != before
        log.info("%s: ISR %s -> %s (partition epoch %d), high watermark %d", self.name, list(old), isr,
                 partition_epoch, self.log.high_watermark)
        return moved

    def stop(self) -> None:
        """StopReplica: neither leader nor follower until the next LeaderAndIsr."""
        with self.lock:
            self.leader_id = -1
            self.remotes = {}
            self.pending_isr = None
            self.log.become_follower(self.leader_epoch)
            self.log.set_hw_tracks_leo(False)

    def clear_pending_isr(self) -> bool:
        """The proposal failed: the committed ISR alone counts again. True when the high watermark moved."""
        with self.lock:
            self.pending_isr = None
            if not self.is_leader:
                return False
            before = self.log.high_watermark
            self.log.set_hw_tracks_leo(self.isr == (self.local_id,))
            self._maybe_increment_hw()
            return self.log.high_watermark != before

    # -- min.insync.replicas -------------------------------------------------------------------

    def check_enough_replicas(self, min_isr: int) -> None:
        """acks=all before the append: the committed ISR must hold min.insync.replicas members."""
        isr = self.isr
        if len(isr) < min_isr:
            raise KafkaError(ErrorCode.NOT_ENOUGH_REPLICAS,
                             f"The size of the current ISR {list(isr)} is insufficient to satisfy the min.isr "
                             f"requirement of {min_isr} for partition {self.name}")

    def replication_status(self, required_offset: int, min_isr: int) -> ErrorCode | None:
        """DelayedProduce's check: None while waiting, else the partition's answer once the high watermark
        passed required_offset (NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below the minimum)."""
        if not self.is_leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if self.log.high_watermark < required_offset:
            return None
        # The members the high watermark waited for, as Kafka's checkEnoughReplicasReachOffset counts them.
        if len(self._maximal_isr()) < min_isr:
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return ErrorCode.NONE

"""TransactionMetadata: the state of one transactional id, as Kafka's TransactionMetadata.

A change is made in two steps, as in Kafka: a prepare_* method checks the transition is legal, marks it pending
and returns the target as an immutable TxnTransitMetadata; the coordinator writes that to __transaction_state and
only then applies it with complete_transition_to. While a transition is pending every other one is refused
(the coordinator answers CONCURRENT_TRANSACTIONS). Objects are owned by the coordinator loop: no locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import NoReturn

from kbroker.protocol.errors import ErrorCode
from kbroker.storage.manager import TopicPartition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 2**15 - 1



class TransactionState(IntEnum):
    """Kafka's TransactionState, with the ids it writes as transaction_status."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use."""
        return _NAMES[self]

    @classmethod
    def from_name(cls, name: str) -> TransactionState | None:
        return _BY_NAME.get(name)


_NAMES = {
    TransactionState.EMPTY: "Empty",
    TransactionState.ONGOING: "Ongoing",
    TransactionState.PREPARE_COMMIT: "PrepareCommit",
    TransactionState.PREPARE_ABORT: "PrepareAbort",
    TransactionState.COMPLETE_COMMIT: "CompleteCommit",
    TransactionState.COMPLETE_ABORT: "CompleteAbort",
    TransactionState.DEAD: "Dead",
    TransactionState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_NAME = {name: state for state, name in _NAMES.items()}

S = TransactionState
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
EXPIRATION_ALLOWED = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
PENDING_TRANSACTION = frozenset({S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT})


class IllegalTransactionTransition(RuntimeError):
    """A transition Kafka treats as a bug (IllegalStateException): never expected in a correct coordinator."""


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """Clients never get Short.MaxValue, so the coordinator can always bump once more to fence them."""
    return producer_epoch >= MAX_EPOCH - 1


def unknown_state_filters(state_filters: list[str]) -> list[str]:
    """The ListTransactions state filters that name no transaction state (answered back to the client)."""
    return [s for s in state_filters if TransactionState.from_name(s) is None]


@dataclass(frozen=True, slots=True)
class TxnTransitMetadata:
    """The target of a prepared transition: what is written to __transaction_state."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    txn_state: TransactionState
    topic_partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int


class TransactionMetadata:
    def __init__(self, transactional_id: str, producer_id: int, producer_epoch: int, txn_timeout_ms: int,
                 state: TransactionState, *, last_producer_id: int = NO_PRODUCER_ID,
                 last_producer_epoch: int = NO_PRODUCER_EPOCH, txn_start_timestamp: int = -1,
                 txn_last_update_timestamp: int = -1) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.last_producer_id = last_producer_id
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = last_producer_epoch
        self.txn_timeout_ms = txn_timeout_ms
        self.state = state
        self.topic_partitions: set[TopicPartition] = set()
        self.txn_start_timestamp = txn_start_timestamp
        self.txn_last_update_timestamp = txn_last_update_timestamp
        # The state a prepared transition goes to, until it is written (or fails): blocks every other transition.
        self.pending_state: TransactionState | None = None
        # A fencing epoch bump whose write failed: the next fence reuses the bumped epoch instead of bumping again
        # (the bumped epoch was never handed to a client).
        self.has_failed_epoch_fence = False

    def __repr__(self) -> str:
        return (f"TransactionMetadata(transactional_id={self.transactional_id!r}, producer_id={self.producer_id}, "
                f"producer_epoch={self.producer_epoch}, last_producer_id={self.last_producer_id}, "
                f"last_producer_epoch={self.last_producer_epoch}, txn_timeout_ms={self.txn_timeout_ms}, "
                f"state={self.state.kafka_name}, pending_state={self.pending_state}, "
                f"topic_partitions={sorted(self.topic_partitions)}, txn_start_timestamp={self.txn_start_timestamp}, "
                f"txn_last_update_timestamp={self.txn_last_update_timestamp})")

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    @property
    def has_pending_transaction(self) -> bool:
        return self.state in PENDING_TRANSACTION

    def remove_partition(self, tp: TopicPartition) -> None:
        """A partition's marker is written: it no longer needs one."""
        if self.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            raise IllegalTransactionTransition(
                f"{self.transactional_id}: removing partition {tp} whose marker was written in state {self.state}")
        self.topic_partitions.discard(tp)

    # ------------------------------------------------------------ prepare

    def prepare_no_transit(self) -> TxnTransitMetadata:
        return TxnTransitMetadata(self.producer_id, self.last_producer_id, self.producer_epoch,
                                  self.last_producer_epoch, self.txn_timeout_ms, self.state,
                                  frozenset(self.topic_partitions), self.txn_start_timestamp,
                                  self.txn_last_update_timestamp)

    def prepare_fence_producer_epoch(self) -> TxnTransitMetadata:
        """Bump the epoch to fence the current producer before aborting its transaction (never handed out)."""
        if self.producer_epoch == MAX_EPOCH:
            raise IllegalTransactionTransition(
                f"{self.transactional_id}: cannot fence producer {self.producer_id} at epoch {MAX_EPOCH}")
        bumped = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare_transition_to(S.PREPARE_EPOCH_FENCE, self.producer_id, bumped, NO_PRODUCER_EPOCH,
                                           self.txn_timeout_ms, frozenset(self.topic_partitions),
                                           self.txn_start_timestamp, self.txn_last_update_timestamp)

    def prepare_increment_producer_epoch(self, new_txn_timeout_ms: int, expected_producer_epoch: int | None,
                                         now_ms: int) -> TxnTransitMetadata | ErrorCode:
        """InitProducerId on an idle transactional id (KIP-360 rules for the expected epoch)."""
        if self.is_producer_epoch_exhausted:
            raise IllegalTransactionTransition(
                f"{self.transactional_id}: no epochs left for producer {self.producer_id}")
        bumped = self.producer_epoch + 1
        if expected_producer_epoch is None:
            # A new producer instance: bump and forget the previous epoch, so a retry of the old one is fenced.
            next_epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_producer_epoch == self.producer_epoch:
            # The current producer recovers from an abortable error: bump and remember the epoch it had.
            next_epoch, last_epoch = bumped, self.producer_epoch
        elif expected_producer_epoch == self.last_producer_epoch:
            # A retry of a bump that succeeded: answer the same epoch again.
            next_epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            return ErrorCode.PRODUCER_FENCED
        return self._prepare_transition_to(S.EMPTY, self.producer_id, next_epoch, last_epoch, new_txn_timeout_ms,
                                           frozenset(), -1, now_ms)

    def prepare_producer_id_rotation(self, new_producer_id: int, new_txn_timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TxnTransitMetadata:
        """The epochs of the current producer id are exhausted: continue with a fresh producer id at epoch 0."""
        if self.has_pending_transaction:
            raise IllegalTransactionTransition(
                f"{self.transactional_id}: cannot rotate the producer id while a transaction is pending")
        return self._prepare_transition_to(S.EMPTY, new_producer_id, 0,
                                           self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
                                           new_txn_timeout_ms, frozenset(), -1, now_ms)

    def prepare_add_partitions(self, added: frozenset[TopicPartition] | set[TopicPartition],
                               now_ms: int) -> TxnTransitMetadata:
        start = now_ms if self.state in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT) else self.txn_start_timestamp
        return self._prepare_transition_to(S.ONGOING, self.producer_id, self.producer_epoch,
                                           self.last_producer_epoch, self.txn_timeout_ms,
                                           frozenset(self.topic_partitions | set(added)), start, now_ms)

    def prepare_abort_or_commit(self, new_state: TransactionState, now_ms: int) -> TxnTransitMetadata:
        return self._prepare_transition_to(new_state, self.producer_id, self.producer_epoch,
                                           self.last_producer_epoch, self.txn_timeout_ms,
                                           frozenset(self.topic_partitions), self.txn_start_timestamp, now_ms)

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        new_state = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        # The Prepare* record is written, so a failed fence is over.
        self.has_failed_epoch_fence = False
        return self._prepare_transition_to(new_state, self.producer_id, self.producer_epoch,
                                           self.last_producer_epoch, self.txn_timeout_ms, frozenset(),
                                           self.txn_start_timestamp, now_ms)

    def prepare_dead(self) -> TxnTransitMetadata:
        return self._prepare_transition_to(S.DEAD, self.producer_id, self.producer_epoch, self.last_producer_epoch,
                                           self.txn_timeout_ms, frozenset(), self.txn_start_timestamp,
                                           self.txn_last_update_timestamp)

    def _prepare_transition_to(self, new_state: TransactionState, new_producer_id: int, new_epoch: int,
                               new_last_epoch: int, new_txn_timeout_ms: int,
                               new_partitions: frozenset[TopicPartition], new_start: int,
                               now_ms: int) -> TxnTransitMetadata:
        if self.pending_state is not None:
            raise IllegalTransactionTransition(
                f"{self.transactional_id}: preparing {new_state.kafka_name} while {self.pending_state.kafka_name} "
                "is pending")
        if new_producer_id < 0:
            raise IllegalTransactionTransition(f"{self.transactional_id}: illegal producer id {new_producer_id}")
        if new_state is not S.DEAD and new_epoch < 0:
            raise IllegalTransactionTransition(f"{self.transactional_id}: illegal producer epoch {new_epoch}")
        if self.state not in VALID_PREVIOUS_STATES[new_state]:
            raise IllegalTransactionTransition(
                f"{self.transactional_id}: {self.state.kafka_name} -> {new_state.kafka_name} is not a transition")
        self.pending_state = new_state
        return TxnTransitMetadata(new_producer_id, self.producer_id, new_epoch, new_last_epoch, new_txn_timeout_ms,
                                  new_state, new_partitions, new_start, now_ms)

    # ------------------------------------------------------------ complete

    def complete_transition_to(self, t: TxnTransitMetadata) -> None:
        """Apply a transition after its record is written (Kafka's completeTransitionTo checks)."""
        to = self.pending_state
        if to is None or to is not t.txn_state:
            self._fail(t)
        if to is S.EMPTY:
            if ((self.producer_epoch != t.producer_epoch and not self._valid_epoch_bump(t))
                    or t.topic_partitions or t.txn_start_timestamp != -1):
                self._fail(t)
            self.txn_timeout_ms = t.txn_timeout_ms
            self.producer_epoch = t.producer_epoch
            self.last_producer_epoch = t.last_producer_epoch
            self.producer_id = t.producer_id
            self.last_producer_id = t.last_producer_id
        elif to is S.ONGOING:
            if (not self._valid_epoch(t) or not self.topic_partitions <= t.topic_partitions
                    or self.txn_timeout_ms != t.txn_timeout_ms):
                self._fail(t)
            self.txn_start_timestamp = t.txn_start_timestamp
            self.topic_partitions |= t.topic_partitions
        elif to in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            if (not self._valid_epoch(t) or self.topic_partitions != t.topic_partitions
                    or self.txn_timeout_ms != t.txn_timeout_ms or self.txn_start_timestamp != t.txn_start_timestamp):
                self._fail(t)
        elif to in (S.COMPLETE_ABORT, S.COMPLETE_COMMIT):
            if not self._valid_epoch(t) or self.txn_timeout_ms != t.txn_timeout_ms or t.txn_start_timestamp == -1:
                self._fail(t)
            self.txn_start_timestamp = t.txn_start_timestamp
            self.topic_partitions.clear()
        else:
            # PrepareEpochFence is never written (it turns into PrepareAbort) and Dead ends in removal.
            self._fail(t)
        self.txn_last_update_timestamp = t.txn_last_update_timestamp
        self.pending_state = None
        self.state = to

    def _valid_epoch(self, t: TxnTransitMetadata) -> bool:
        return t.producer_epoch == self.producer_epoch and t.producer_id == self.producer_id

    def _valid_epoch_bump(self, t: TxnTransitMetadata) -> bool:
        return t.producer_epoch == self.producer_epoch + 1 or (t.producer_epoch == 0 and t.producer_id != self.producer_id)

    def _fail(self, t: TxnTransitMetadata) -> NoReturn:
        raise IllegalTransactionTransition(f"{self!r}: transition to {t} does not apply")

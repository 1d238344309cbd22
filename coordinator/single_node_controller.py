"""The embedded single node's answers as its own controller: ElectLeaders, AlterPartitionReassignments and
ListPartitionReassignments, as a one-broker Kafka cluster gives them (every leader is already its only replica).

It has KafkaController's methods for these three, answered at once in completed futures, so the handlers treat
both alike. Nothing changes anywhere: a reassignment can only name this broker, which holds every replica already.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

from kbroker.coordinator.controller_context import Reassignment
from kbroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

TopicPartition = tuple[str, int]
Result = tuple[ErrorCode, str | None]
T = TypeVar("T")

_UNKNOWN: Result = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")


def _done(value: T) -> Future[T]:
    f: Future[T] = Future()
    f.set_result(value)
    return f


class SingleNodeController:
    def __init__(self, server: KafkaServer) -> None:
        self.server = server

    def _partitions(self) -> list[TopicPartition]:
        return [
            (rec.name, p)
            for rec in list(self.server.metadata.topics.values())
            for p in range(len(rec.partitions))
        ]

    def _exists(self, tp: TopicPartition) -> bool:
        rec = self.server.metadata.topics.get(tp[0])
        return rec is not None and 0 <= tp[1] < len(rec.partitions)

    def elect_leaders(
        self, election_type: int, partitions: list[TopicPartition] | None
    ) -> Future[dict[TopicPartition, Result]]:
        """Preferred or unclean: the one replica leads already (Kafka's ELECTION_NOT_NEEDED)."""
        return _done(
            {
                tp: (ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.")
                if self._exists(tp)
                else _UNKNOWN
                for tp in (partitions if partitions is not None else self._partitions())
            }
        )

    def alter_reassignments(
        self, targets: dict[TopicPartition, list[int] | None]
    ) -> Future[dict[TopicPartition, Result]]:
        """A target of this broker alone is the assignment already (done at once, as Kafka answers it); any other
        broker is not live; nothing is ever in progress to cancel."""
        me = self.server.broker_id
        out: dict[TopicPartition, Result] = {}
        for tp, target in targets.items():
            if not self._exists(tp):
                out[tp] = _UNKNOWN
            elif target is None:
                out[tp] = (
                    ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                    f"Unable to find an ongoing reassignment for partition {tp[0]}-{tp[1]}",
                )
            elif not target:
                out[tp] = (ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The replica list cannot be empty.")
            elif len(set(target)) != len(target):
                out[tp] = (
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    "The proposed assignment contains duplicate replicas.",
                )
            elif any(b != me for b in target):
                out[tp] = (
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"The proposed assignment contains non-live brokers: {[b for b in target if b != me]}",
                )
            else:
                out[tp] = (ErrorCode.NONE, None)
        return _done(out)

    def list_reassignments(
        self, partitions: list[TopicPartition] | None
    ) -> Future[dict[TopicPartition, Reassignment]]:
        return _done({})

"""Record formats of KIP-848 consumer groups in __consumer_offsets (Kafka 3.9's ConsumerGroup* records).

The key's version names the record type, as in Kafka's CoordinatorRecordSerde: 3 ConsumerGroupMetadata (group
epoch), 4 ConsumerGroupPartitionMetadata (subscribed topics' metadata), 5 ConsumerGroupMemberMetadata (a member's
subscription), 6 ConsumerGroupTargetAssignmentMetadata (assignment epoch), 7 ConsumerGroupTargetAssignmentMember,
8 ConsumerGroupCurrentMemberAssignment. Every value is written at version 0 (flexible). A value of None is a
tombstone. The coordinator changes a group's state only by replaying these records (coordinator.consumer_group),
live and at load, so what is in memory is what a restart reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from kbroker.coordinator.group_record_codec import decode_entry, encode_entry
from kbroker.protocol.messages import (
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupPartitionMetadataValue,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupTargetAssignmentMetadataKey,
    ConsumerGroupTargetAssignmentMetadataValue,
)

VALUE_VERSION = 0

# topic id -> partitions
Assignment = dict[bytes, set[int]]


class RecordType(IntEnum):
    METADATA = 3
    PARTITION_METADATA = 4
    MEMBER_METADATA = 5
    TARGET_ASSIGNMENT_METADATA = 6
    TARGET_ASSIGNMENT_MEMBER = 7
    CURRENT_MEMBER_ASSIGNMENT = 8


KEY_CLASSES: dict[RecordType, Any] = {
    RecordType.METADATA: ConsumerGroupMetadataKey,
    RecordType.PARTITION_METADATA: ConsumerGroupPartitionMetadataKey,
    RecordType.MEMBER_METADATA: ConsumerGroupMemberMetadataKey,
    RecordType.TARGET_ASSIGNMENT_METADATA: ConsumerGroupTargetAssignmentMetadataKey,
    RecordType.TARGET_ASSIGNMENT_MEMBER: ConsumerGroupTargetAssignmentMemberKey,
    RecordType.CURRENT_MEMBER_ASSIGNMENT: ConsumerGroupCurrentMemberAssignmentKey,
}
VALUE_CLASSES: dict[RecordType, Any] = {
    RecordType.METADATA: ConsumerGroupMetadataValue,
    RecordType.PARTITION_METADATA: ConsumerGroupPartitionMetadataValue,
    RecordType.MEMBER_METADATA: ConsumerGroupMemberMetadataValue,
    RecordType.TARGET_ASSIGNMENT_METADATA: ConsumerGroupTargetAssignmentMetadataValue,
    RecordType.TARGET_ASSIGNMENT_MEMBER: ConsumerGroupTargetAssignmentMemberValue,
    RecordType.CURRENT_MEMBER_ASSIGNMENT: ConsumerGroupCurrentMemberAssignmentValue,
}
MEMBER_RECORDS = {RecordType.MEMBER_METADATA, RecordType.TARGET_ASSIGNMENT_MEMBER,
                  RecordType.CURRENT_MEMBER_ASSIGNMENT}


@dataclass
class ConsumerGroupRecord:
    type: RecordType
    group_id: str
    member_id: str | None
    value: Any | None  # the generated *Value object; None: tombstone

    def entry(self) -> tuple[bytes, bytes | None]:
        return encode_entry(self.type, self.group_id, self.member_id, self.value, KEY_CLASSES, MEMBER_RECORDS,
                            key_version=int(self.type), value_version=VALUE_VERSION)


def is_consumer_group_key(key_version: int) -> bool:
    return RecordType.METADATA <= key_version <= RecordType.CURRENT_MEMBER_ASSIGNMENT


def parse(key: bytes, value: bytes | None) -> ConsumerGroupRecord:
    return ConsumerGroupRecord(*decode_entry(key, value, RecordType, KEY_CLASSES, VALUE_CLASSES, MEMBER_RECORDS,
                                             key_version_is_type=True, value_version=VALUE_VERSION))


# ---------------------------------------------------------------- builders (Kafka's GroupCoordinatorRecordHelpers)


def _topic_partitions(cls: Any, a: Assignment) -> list[Any]:
    return [cls(topic_id=t, partitions=sorted(ps)) for t, ps in sorted(a.items()) if ps]


def to_assignment(tps: list[Any]) -> Assignment:
    return {tp.topic_id: set(tp.partitions) for tp in tps if tp.partitions}


def group_epoch_record(group_id: str, epoch: int, metadata_hash: int = 0) -> ConsumerGroupRecord:
    """The group epoch with the group metadata hash of the subscribed topics it was computed for (KIP-1101)."""
    return ConsumerGroupRecord(RecordType.METADATA, group_id, None,
                               ConsumerGroupMetadataValue(epoch=epoch, metadata_hash=metadata_hash))


def partition_metadata_record(group_id: str, topics: dict[str, tuple[bytes, int]]) -> ConsumerGroupRecord:
    """topics: name -> (topic id, number of partitions). Kafka 4.0's record: 4.1+ (and kbroker) writes none, only
    its tombstone where a group still has one; kept to make such a group in tests."""
    V = ConsumerGroupPartitionMetadataValue
    return ConsumerGroupRecord(RecordType.PARTITION_METADATA, group_id, None, V(topics=[
        V.TopicMetadata(topic_id=tid, topic_name=name, num_partitions=n, partition_metadata=[])
        for name, (tid, n) in sorted(topics.items())]))


def member_metadata_record(group_id: str, member_id: str, *, instance_id: str | None, rack_id: str | None,
                           client_id: str, client_host: str, subscribed_topic_names: list[str],
                           subscribed_topic_regex: str | None, rebalance_timeout_ms: int,
                           server_assignor: str | None, classic: Any = None) -> ConsumerGroupRecord:
    """classic: the member's ClassicMemberMetadata when it uses the classic protocol (a tagged field)."""
    V = ConsumerGroupMemberMetadataValue
    classic_value = None if classic is None else V.ClassicMemberMetadata(
        session_timeout_ms=classic.session_timeout_ms,
        supported_protocols=[V.ClassicProtocol(name=n, metadata=m) for n, m in classic.protocols])
    return ConsumerGroupRecord(RecordType.MEMBER_METADATA, group_id, member_id, V(
        instance_id=instance_id, rack_id=rack_id, client_id=client_id, client_host=client_host,
        subscribed_topic_names=sorted(subscribed_topic_names), subscribed_topic_regex=subscribed_topic_regex,
        rebalance_timeout_ms=rebalance_timeout_ms, server_assignor=server_assignor,
        classic_member_metadata=classic_value))


def target_assignment_record(group_id: str, member_id: str, a: Assignment) -> ConsumerGroupRecord:
    V = ConsumerGroupTargetAssignmentMemberValue
    return ConsumerGroupRecord(RecordType.TARGET_ASSIGNMENT_MEMBER, group_id, member_id,
                               V(topic_partitions=_topic_partitions(V.TopicPartition, a)))


def target_epoch_record(group_id: str, epoch: int) -> ConsumerGroupRecord:
    return ConsumerGroupRecord(RecordType.TARGET_ASSIGNMENT_METADATA, group_id, None,
                               ConsumerGroupTargetAssignmentMetadataValue(assignment_epoch=epoch))


def current_assignment_record(group_id: str, member_id: str, *, member_epoch: int, previous_member_epoch: int,
                              state: int, assigned: Assignment, pending_revocation: Assignment
                              ) -> ConsumerGroupRecord:
    V = ConsumerGroupCurrentMemberAssignmentValue
    return ConsumerGroupRecord(RecordType.CURRENT_MEMBER_ASSIGNMENT, group_id, member_id, V(
        member_epoch=member_epoch, previous_member_epoch=previous_member_epoch, state=state,
        assigned_partitions=_topic_partitions(V.TopicPartitions, assigned),
        partitions_pending_revocation=_topic_partitions(V.TopicPartitions, pending_revocation)))


def tombstone(rtype: RecordType, group_id: str, member_id: str | None = None) -> ConsumerGroupRecord:
    return ConsumerGroupRecord(rtype, group_id, member_id, None)


def member_tombstones(group_id: str, member_id: str) -> list[ConsumerGroupRecord]:
    """In Kafka's order: the current assignment, the target assignment, then the subscription."""
    return [tombstone(RecordType.CURRENT_MEMBER_ASSIGNMENT, group_id, member_id),
            tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, group_id, member_id),
            tombstone(RecordType.MEMBER_METADATA, group_id, member_id)]


def group_tombstones(group_id: str, member_ids: list[str]) -> list[ConsumerGroupRecord]:
    """Everything of a group (Kafka's ConsumerGroup.createGroupTombstoneRecords)."""
    out = [r for m in member_ids for r in member_tombstones(group_id, m)]
    out += [tombstone(RecordType.TARGET_ASSIGNMENT_METADATA, group_id),
            tombstone(RecordType.PARTITION_METADATA, group_id),
            tombstone(RecordType.METADATA, group_id)]
    return out

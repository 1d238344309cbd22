"""Record formats of KIP-932 share groups in __consumer_offsets (Kafka 4.x's ShareGroup* records).

The key starts with the record type (Kafka's CoordinatorRecordType): 10 ShareGroupMemberMetadata (a member's
subscription), 11 ShareGroupMetadata (group epoch), 12 ShareGroupTargetAssignmentMetadata (assignment epoch), 13
ShareGroupTargetAssignmentMember, 14 ShareGroupCurrentMemberAssignment (member epochs), 15
ShareGroupStatePartitionMetadata (the share-partitions whose state is initialized, initializing or being deleted).
Keys and values are written at version 0; a value of None is a tombstone. coordinator.share_coordinator writes
them as it changes a group and replays them at load, so a coordinator restart or move keeps the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from kbroker.coordinator.group_record_codec import decode_entry, encode_entry
from kbroker.protocol.messages import (
    ShareGroupCurrentMemberAssignmentKey,
    ShareGroupCurrentMemberAssignmentValue,
    ShareGroupMemberMetadataKey,
    ShareGroupMemberMetadataValue,
    ShareGroupMetadataKey,
    ShareGroupMetadataValue,
    ShareGroupStatePartitionMetadataKey,
    ShareGroupStatePartitionMetadataValue,
    ShareGroupTargetAssignmentMemberKey,
    ShareGroupTargetAssignmentMemberValue,
    ShareGroupTargetAssignmentMetadataKey,
    ShareGroupTargetAssignmentMetadataValue,
)

# topic id -> partition indexes
Assignment = dict[bytes, list[int]]
# topic id -> (topic name, partitions)
TopicPartitions = dict[bytes, tuple[str, list[int]]]

STABLE = 0  # Kafka's MemberState.STABLE: a share member never waits on a revocation


class RecordType(IntEnum):
    MEMBER_METADATA = 10
    METADATA = 11
    TARGET_ASSIGNMENT_METADATA = 12
    TARGET_ASSIGNMENT_MEMBER = 13
    CURRENT_MEMBER_ASSIGNMENT = 14
    STATE_PARTITION_METADATA = 15


KEY_CLASSES: dict[RecordType, Any] = {
    RecordType.MEMBER_METADATA: ShareGroupMemberMetadataKey,
    RecordType.METADATA: ShareGroupMetadataKey,
    RecordType.TARGET_ASSIGNMENT_METADATA: ShareGroupTargetAssignmentMetadataKey,
    RecordType.TARGET_ASSIGNMENT_MEMBER: ShareGroupTargetAssignmentMemberKey,
    RecordType.CURRENT_MEMBER_ASSIGNMENT: ShareGroupCurrentMemberAssignmentKey,
    RecordType.STATE_PARTITION_METADATA: ShareGroupStatePartitionMetadataKey,
}
VALUE_CLASSES: dict[RecordType, Any] = {
    RecordType.MEMBER_METADATA: ShareGroupMemberMetadataValue,
    RecordType.METADATA: ShareGroupMetadataValue,
    RecordType.TARGET_ASSIGNMENT_METADATA: ShareGroupTargetAssignmentMetadataValue,
    RecordType.TARGET_ASSIGNMENT_MEMBER: ShareGroupTargetAssignmentMemberValue,
    RecordType.CURRENT_MEMBER_ASSIGNMENT: ShareGroupCurrentMemberAssignmentValue,
    RecordType.STATE_PARTITION_METADATA: ShareGroupStatePartitionMetadataValue,
}
MEMBER_RECORDS = {
    RecordType.MEMBER_METADATA,
    RecordType.TARGET_ASSIGNMENT_MEMBER,
    RecordType.CURRENT_MEMBER_ASSIGNMENT,
}


@dataclass
class ShareGroupRecord:
    type: RecordType
    group_id: str
    member_id: str | None
    value: Any | None  # the generated *Value object; None: tombstone

    def entry(self) -> tuple[bytes, bytes | None]:
        return encode_entry(self.type, self.group_id, self.member_id, self.value, KEY_CLASSES, MEMBER_RECORDS)


def is_share_group_key(key_version: int) -> bool:
    return key_version in RecordType._value2member_map_


def parse(key: bytes, value: bytes | None) -> ShareGroupRecord:
    return ShareGroupRecord(*decode_entry(key, value, RecordType, KEY_CLASSES, VALUE_CLASSES, MEMBER_RECORDS))


# ---------------------------------------------------------------- builders (Kafka's GroupCoordinatorRecordHelpers)


def member_record(
    group_id: str,
    member_id: str,
    rack_id: str | None,
    client_id: str,
    client_host: str,
    subscribed: list[str],
) -> ShareGroupRecord:
    return ShareGroupRecord(
        RecordType.MEMBER_METADATA,
        group_id,
        member_id,
        ShareGroupMemberMetadataValue(
            rack_id=rack_id,
            client_id=client_id,
            client_host=client_host,
            subscribed_topic_names=sorted(subscribed),
        ),
    )


def group_epoch_record(group_id: str, epoch: int, metadata_hash: int = 0) -> ShareGroupRecord:
    """The group epoch with the group metadata hash of the subscribed topics it was computed for (KIP-1101)."""
    return ShareGroupRecord(
        RecordType.METADATA,
        group_id,
        None,
        ShareGroupMetadataValue(epoch=epoch, metadata_hash=metadata_hash),
    )


def target_member_record(group_id: str, member_id: str, a: Assignment) -> ShareGroupRecord:
    V = ShareGroupTargetAssignmentMemberValue
    return ShareGroupRecord(
        RecordType.TARGET_ASSIGNMENT_MEMBER,
        group_id,
        member_id,
        V(
            topic_partitions=[
                V.TopicPartition(topic_id=t, partitions=sorted(ps)) for t, ps in sorted(a.items())
            ]
        ),
    )


def target_epoch_record(group_id: str, epoch: int, timestamp_ms: int) -> ShareGroupRecord:
    return ShareGroupRecord(
        RecordType.TARGET_ASSIGNMENT_METADATA,
        group_id,
        None,
        ShareGroupTargetAssignmentMetadataValue(assignment_epoch=epoch, assignment_timestamp=timestamp_ms),
    )


def current_assignment_record(
    group_id: str, member_id: str, epoch: int, previous_epoch: int, a: Assignment
) -> ShareGroupRecord:
    V = ShareGroupCurrentMemberAssignmentValue
    return ShareGroupRecord(
        RecordType.CURRENT_MEMBER_ASSIGNMENT,
        group_id,
        member_id,
        V(
            member_epoch=epoch,
            previous_member_epoch=previous_epoch,
            state=STABLE,
            assigned_partitions=[
                V.TopicPartitions(topic_id=t, partitions=sorted(ps)) for t, ps in sorted(a.items())
            ],
        ),
    )


def state_partitions_record(
    group_id: str, initializing: TopicPartitions, initialized: TopicPartitions, deleting: dict[bytes, str]
) -> ShareGroupRecord:
    V = ShareGroupStatePartitionMetadataValue

    def infos(tps: TopicPartitions) -> list[Any]:
        return [
            V.TopicPartitionsInfo(topic_id=t, topic_name=name, partitions=sorted(ps))
            for t, (name, ps) in sorted(tps.items())
        ]

    return ShareGroupRecord(
        RecordType.STATE_PARTITION_METADATA,
        group_id,
        None,
        V(
            initializing_topics=infos(initializing),
            initialized_topics=infos(initialized),
            deleting_topics=[V.TopicInfo(topic_id=t, topic_name=n) for t, n in sorted(deleting.items())],
        ),
    )


def tombstone(rtype: RecordType, group_id: str, member_id: str | None = None) -> ShareGroupRecord:
    return ShareGroupRecord(rtype, group_id, member_id, None)


def to_topic_partitions(infos: list[Any] | None) -> TopicPartitions:
    return {i.topic_id: (i.topic_name, list(i.partitions)) for i in infos or []}


def to_assignment(tps: list[Any] | None) -> Assignment:
    return {tp.topic_id: sorted(tp.partitions) for tp in tps or [] if tp.partitions}

"""Record formats of KIP-1071 streams groups in __consumer_offsets (Kafka 4.x's StreamsGroup* records).

The key starts with the record type (Kafka's CoordinatorRecordType): 17 StreamsGroupMetadata (group epoch and
metadata hash), 19 StreamsGroupMemberMetadata, 20 StreamsGroupTargetAssignmentMetadata, 21
StreamsGroupTargetAssignmentMember, 22 StreamsGroupCurrentMemberAssignment, 23 StreamsGroupTopology. Keys and
values are written at version 0; a value of None is a tombstone. The coordinator changes a streams group only by
replaying these records (coordinator.streams_group), live and at load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from kbroker.coordinator.group_record_codec import decode_entry, encode_entry
from kbroker.protocol.messages import (
    StreamsGroupCurrentMemberAssignmentKey,
    StreamsGroupCurrentMemberAssignmentValue,
    StreamsGroupMemberMetadataKey,
    StreamsGroupMemberMetadataValue,
    StreamsGroupMetadataKey,
    StreamsGroupMetadataValue,
    StreamsGroupTargetAssignmentMemberKey,
    StreamsGroupTargetAssignmentMemberValue,
    StreamsGroupTargetAssignmentMetadataKey,
    StreamsGroupTargetAssignmentMetadataValue,
    StreamsGroupTopologyKey,
    StreamsGroupTopologyValue,
)

# subtopology id -> partitions (task ids)
Tasks = dict[str, set[int]]


@dataclass
class TasksTuple:
    """A member's active, standby and warm-up tasks (Kafka's TasksTuple)."""

    active: Tasks = field(default_factory=dict)
    standby: Tasks = field(default_factory=dict)
    warmup: Tasks = field(default_factory=dict)

    def parts(self) -> tuple[Tasks, Tasks, Tasks]:
        return self.active, self.standby, self.warmup

    def is_empty(self) -> bool:
        return not any(ps for t in self.parts() for ps in t.values())

    def clean(self) -> tuple[Tasks, Tasks, Tasks]:
        return tuple({s: set(ps) for s, ps in t.items() if ps} for t in self.parts())  # type: ignore[return-value]

    def copy(self) -> TasksTuple:
        return TasksTuple(*self.clean())


class RecordType(IntEnum):
    METADATA = 17
    MEMBER_METADATA = 19
    TARGET_ASSIGNMENT_METADATA = 20
    TARGET_ASSIGNMENT_MEMBER = 21
    CURRENT_MEMBER_ASSIGNMENT = 22
    TOPOLOGY = 23


KEY_CLASSES: dict[RecordType, Any] = {
    RecordType.METADATA: StreamsGroupMetadataKey,
    RecordType.MEMBER_METADATA: StreamsGroupMemberMetadataKey,
    RecordType.TARGET_ASSIGNMENT_METADATA: StreamsGroupTargetAssignmentMetadataKey,
    RecordType.TARGET_ASSIGNMENT_MEMBER: StreamsGroupTargetAssignmentMemberKey,
    RecordType.CURRENT_MEMBER_ASSIGNMENT: StreamsGroupCurrentMemberAssignmentKey,
    RecordType.TOPOLOGY: StreamsGroupTopologyKey,
}
VALUE_CLASSES: dict[RecordType, Any] = {
    RecordType.METADATA: StreamsGroupMetadataValue,
    RecordType.MEMBER_METADATA: StreamsGroupMemberMetadataValue,
    RecordType.TARGET_ASSIGNMENT_METADATA: StreamsGroupTargetAssignmentMetadataValue,
    RecordType.TARGET_ASSIGNMENT_MEMBER: StreamsGroupTargetAssignmentMemberValue,
    RecordType.CURRENT_MEMBER_ASSIGNMENT: StreamsGroupCurrentMemberAssignmentValue,
    RecordType.TOPOLOGY: StreamsGroupTopologyValue,
}
MEMBER_RECORDS = {
    RecordType.MEMBER_METADATA,
    RecordType.TARGET_ASSIGNMENT_MEMBER,
    RecordType.CURRENT_MEMBER_ASSIGNMENT,
}


@dataclass
class StreamsGroupRecord:
    type: RecordType
    group_id: str
    member_id: str | None
    value: Any | None  # the generated *Value object; None: tombstone

    def entry(self) -> tuple[bytes, bytes | None]:
        return encode_entry(self.type, self.group_id, self.member_id, self.value, KEY_CLASSES, MEMBER_RECORDS)


def is_streams_group_key(key_version: int) -> bool:
    return key_version in RecordType._value2member_map_


def parse(key: bytes, value: bytes | None) -> StreamsGroupRecord:
    return StreamsGroupRecord(*decode_entry(key, value, RecordType, KEY_CLASSES, VALUE_CLASSES, MEMBER_RECORDS))


# ---------------------------------------------------------------- builders (Kafka's StreamsCoordinatorRecordHelpers)


def task_ids(cls: Any, tasks: Tasks) -> list[Any]:
    return [cls(subtopology_id=s, partitions=sorted(ps)) for s, ps in sorted(tasks.items()) if ps]


def to_tasks(lst: list[Any] | None) -> Tasks:
    return {t.subtopology_id: set(t.partitions) for t in lst or [] if t.partitions}


def to_epochs(lst: list[Any] | None, default: int) -> dict[tuple[str, int], int]:
    """The tasks' assignment epochs; `default` (the member epoch) where a record has none."""
    out: dict[tuple[str, int], int] = {}
    for t in lst or []:
        epochs = (
            t.assignment_epochs
            if t.assignment_epochs and len(t.assignment_epochs) == len(t.partitions)
            else None
        )
        for i, p in enumerate(t.partitions):
            out[(t.subtopology_id, p)] = epochs[i] if epochs is not None else default
    return out


def group_epoch_record(
    group_id: str, epoch: int, metadata_hash: int, validated_topology_epoch: int
) -> StreamsGroupRecord:
    return StreamsGroupRecord(
        RecordType.METADATA,
        group_id,
        None,
        StreamsGroupMetadataValue(
            epoch=epoch,
            metadata_hash=metadata_hash,
            validated_topology_epoch=validated_topology_epoch,
            last_assignment_configs=None,
        ),
    )


def topology_record(group_id: str, topology: Any) -> StreamsGroupRecord:
    return StreamsGroupRecord(RecordType.TOPOLOGY, group_id, None, topology)


def member_metadata_record(
    group_id: str, member_id: str, value: StreamsGroupMemberMetadataValue
) -> StreamsGroupRecord:
    return StreamsGroupRecord(RecordType.MEMBER_METADATA, group_id, member_id, value)


def target_assignment_record(group_id: str, member_id: str, t: TasksTuple) -> StreamsGroupRecord:
    V = StreamsGroupTargetAssignmentMemberValue
    return StreamsGroupRecord(
        RecordType.TARGET_ASSIGNMENT_MEMBER,
        group_id,
        member_id,
        V(
            active_tasks=task_ids(V.TaskIds, t.active),
            standby_tasks=task_ids(V.TaskIds, t.standby),
            warmup_tasks=task_ids(V.TaskIds, t.warmup),
        ),
    )


def target_epoch_record(group_id: str, epoch: int, timestamp_ms: int) -> StreamsGroupRecord:
    return StreamsGroupRecord(
        RecordType.TARGET_ASSIGNMENT_METADATA,
        group_id,
        None,
        StreamsGroupTargetAssignmentMetadataValue(assignment_epoch=epoch, assignment_timestamp=timestamp_ms),
    )


def current_assignment_record(
    group_id: str,
    member_id: str,
    *,
    member_epoch: int,
    previous_member_epoch: int,
    state: int,
    assigned: TasksTuple,
    pending: TasksTuple,
    active_epochs: dict[tuple[str, int], int] | None = None,
) -> StreamsGroupRecord:
    """active_epochs: the epoch each active task was assigned to the member at (Kafka 4.4's AssignmentEpochs, a
    tagged field beside the active tasks' partitions)."""
    V = StreamsGroupCurrentMemberAssignmentValue

    def ids(t: Tasks, epochs: dict[tuple[str, int], int] | None = None) -> list[Any]:
        return [
            V.TaskIds(
                subtopology_id=s,
                partitions=sorted(ps),
                assignment_epochs=None
                if epochs is None
                else [epochs.get((s, p), member_epoch) for p in sorted(ps)],
            )
            for s, ps in sorted(t.items())
            if ps
        ]

    return StreamsGroupRecord(
        RecordType.CURRENT_MEMBER_ASSIGNMENT,
        group_id,
        member_id,
        V(
            member_epoch=member_epoch,
            previous_member_epoch=previous_member_epoch,
            state=state,
            active_tasks=ids(assigned.active, active_epochs),
            standby_tasks=ids(assigned.standby),
            warmup_tasks=ids(assigned.warmup),
            active_tasks_pending_revocation=ids(pending.active, active_epochs),
            standby_tasks_pending_revocation=ids(pending.standby),
            warmup_tasks_pending_revocation=ids(pending.warmup),
        ),
    )


def tombstone(rtype: RecordType, group_id: str, member_id: str | None = None) -> StreamsGroupRecord:
    return StreamsGroupRecord(rtype, group_id, member_id, None)


def member_tombstones(group_id: str, member_id: str) -> list[StreamsGroupRecord]:
    """In Kafka's order: the current assignment, the target assignment, then the member's metadata."""
    return [
        tombstone(RecordType.CURRENT_MEMBER_ASSIGNMENT, group_id, member_id),
        tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, group_id, member_id),
        tombstone(RecordType.MEMBER_METADATA, group_id, member_id),
    ]


def group_tombstones(group_id: str, member_ids: list[str]) -> list[StreamsGroupRecord]:
    out = [r for m in member_ids for r in member_tombstones(group_id, m)]
    out += [
        tombstone(RecordType.TARGET_ASSIGNMENT_METADATA, group_id),
        tombstone(RecordType.TOPOLOGY, group_id),
        tombstone(RecordType.METADATA, group_id),
    ]
    return out

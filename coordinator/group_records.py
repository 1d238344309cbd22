"""Record formats of __consumer_offsets (Kafka's OffsetCommitKey/Value, GroupMetadataKey/Value; the
ConsumerGroup* records of KIP-848 groups are in consumer_group_records)."""

from __future__ import annotations

from dataclasses import dataclass

from kbroker.coordinator import consumer_group_records, share_group_records, streams_group_records
from kbroker.coordinator.consumer_group_records import ConsumerGroupRecord
from kbroker.coordinator.group_metadata import GroupMetadata, OffsetAndMetadata
from kbroker.coordinator.share_group_records import ShareGroupRecord
from kbroker.coordinator.streams_group_records import StreamsGroupRecord
from kbroker.protocol import codec
from kbroker.protocol.messages import GroupMetadataKey, GroupMetadataValue, OffsetCommitKey, OffsetCommitValue
from kbroker.protocol.primitives import I16

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
GROUP_VALUE_VERSION = 3


def _versioned(version: int, obj: object) -> bytes:
    out = bytearray(I16.pack(version))
    codec.encode(obj, version, out)
    return bytes(out)


def offset_key(group: str, topic: str, partition: int) -> bytes:
    return _versioned(OFFSET_KEY_VERSION, OffsetCommitKey(group=group, topic=topic, partition=partition))


def offset_value(o: OffsetAndMetadata) -> bytes:
    return _versioned(
        OFFSET_VALUE_VERSION,
        OffsetCommitValue(offset=o.offset, leader_epoch=o.leader_epoch, metadata=o.metadata,
                          commit_timestamp=o.commit_timestamp),
    )


def group_key(group: str) -> bytes:
    return _versioned(GROUP_KEY_VERSION, GroupMetadataKey(group=group))


def group_value(g: GroupMetadata) -> bytes:
    members = [
        GroupMetadataValue.MemberMetadata(
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            rebalance_timeout=m.rebalance_timeout_ms,
            session_timeout=m.session_timeout_ms,
            subscription=m.metadata_for(g.protocol_name) if g.protocol_name else b"",
            assignment=m.assignment,
        )
        for m in g.members.values()
    ]
    return _versioned(
        GROUP_VALUE_VERSION,
        GroupMetadataValue(
            protocol_type=g.protocol_type or "",
            generation=g.generation_id,
            protocol=g.protocol_name,
            leader=g.leader_id,
            current_state_timestamp=g.state_timestamp_ms,
            members=members,
        ),
    )


@dataclass
class OffsetRecord:
    group: str
    topic: str
    partition: int
    value: OffsetAndMetadata | None  # None: tombstone


@dataclass
class GroupRecord:
    group: str
    value: GroupMetadataValue | None  # None: tombstone


def parse_record(key: bytes, value: bytes | None) -> (OffsetRecord | GroupRecord | ConsumerGroupRecord
                                                            | StreamsGroupRecord | ShareGroupRecord | None):
    """Decode one __consumer_offsets record; None for record types this coordinator does not use."""
    (kv,) = I16.unpack_from(key, 0)
    if consumer_group_records.is_consumer_group_key(kv):
        return consumer_group_records.parse(key, value)
    if streams_group_records.is_streams_group_key(kv):
        return streams_group_records.parse(key, value)
    if share_group_records.is_share_group_key(kv):
        return share_group_records.parse(key, value)
    if kv in (0, 1):
        k, _ = codec.decode(OffsetCommitKey, kv, key, 2)
        if value is None:
            return OffsetRecord(k.group, k.topic, k.partition, None)
        (vv,) = I16.unpack_from(value, 0)
        v, _ = codec.decode(OffsetCommitValue, min(vv, 4), value, 2)
        return OffsetRecord(
            k.group, k.topic, k.partition,
            OffsetAndMetadata(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp),
        )
    if kv == GROUP_KEY_VERSION:
        gk, _ = codec.decode(GroupMetadataKey, kv, key, 2)
        if value is None:
            return GroupRecord(gk.group, None)
        (vv,) = I16.unpack_from(value, 0)
        gv, _ = codec.decode(GroupMetadataValue, min(vv, 4), value, 2)
        return GroupRecord(gk.group, gv)
    return None

"""GroupMetadata and MemberMetadata: the state of one classic consumer group (as Kafka's GroupMetadata)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from kbroker.storage.manager import TopicPartition

if TYPE_CHECKING:
    from kbroker.coordinator.consumer_group import ConsumerGroup
    from kbroker.coordinator.streams_group import StreamsGroup


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# Kafka's GroupMetadata.validPreviousStates
VALID_PREVIOUS = {
    GroupState.DEAD: {GroupState.STABLE, GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE,
                      GroupState.EMPTY, GroupState.DEAD},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY},
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
}




@dataclass
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1
    # Offset in __consumer_offsets of the record that wrote it (-1 until written). When a transaction commits,
    # its offset replaces the committed one only if written later (Kafka's CommitRecordMetadataAndOffset).
    record_offset: int = field(default=-1, compare=False, kw_only=True)


@dataclass
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    # Futures of the JoinGroup / SyncGroup call this member has in flight, resolved on the coordinator loop.
    join_future: asyncio.Future[Any] | None = None
    sync_future: asyncio.Future[Any] | None = None
    heartbeat_deadline: float = 0.0  # coordinator loop time
    heartbeat_timer: asyncio.TimerHandle | None = None
    heartbeat_timer_at: float = 0.0

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        raise KeyError(protocol)

    def supported(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


@dataclass
class GroupMetadata:
    group_id: str
    state: GroupState = GroupState.EMPTY
    state_timestamp_ms: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: set[str] = field(default_factory=set)  # ids handed out with MEMBER_ID_REQUIRED
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    # producer id -> offsets its open transaction committed, applied or dropped by the marker
    # (Kafka's pendingTransactionalOffsetCommits)
    pending_txn_offsets: dict[int, dict[TopicPartition, OffsetAndMetadata]] = field(default_factory=dict)
    new_member_added: bool = False
    in_initial_delay: bool = False
    # timer handles owned by the coordinator
    rebalance_timer: asyncio.TimerHandle | None = None
    # Members of the current generation that have not sent SyncGroup yet, and the rebalance-timeout timer that
    # removes them (Kafka's pendingSyncMembers and DelayedSync).
    pending_sync: set[str] = field(default_factory=set)
    sync_timer: asyncio.TimerHandle | None = None
    # Set for a KIP-848 consumer group (group.protocol=consumer): its membership lives there, and this object
    # keeps only the offsets (shared with the classic paths) and a classic view of its state (Empty / Stable).
    consumer: ConsumerGroup | None = None
    # Set for a KIP-1071 streams group (group.protocol=streams), the same way.
    streams: StreamsGroup | None = None

    def transition(self, to: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS[to]:
            raise AssertionError(f"group {self.group_id}: illegal transition {self.state.value} -> {to.value}")
        self.state = to
        self.state_timestamp_ms = now_ms

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def add_member(self, member: MemberMetadata) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id

    def remove_member(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
            member.heartbeat_timer = None
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def clear_pending_sync(self) -> None:
        self.pending_sync.clear()
        if self.sync_timer is not None:
            self.sync_timer.cancel()
            self.sync_timer = None

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> MemberMetadata:
        member = self.members.pop(old_id)
        if member.join_future is not None and not member.join_future.done():
            member.join_future.set_result("FENCED")
        if member.sync_future is not None and not member.sync_future.done():
            member.sync_future.set_result("FENCED")
        member.join_future = None
        member.sync_future = None
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        return member

    # -- offsets ---------------------------------------------------------------------------------

    def add_pending_txn_offsets(self, producer_id: int, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self.pending_txn_offsets.setdefault(producer_id, {}).update(offsets)

    def has_pending_txn_offset(self, tp: TopicPartition) -> bool:
        return any(tp in pending for pending in self.pending_txn_offsets.values())

    def pending_txn_partitions(self) -> set[TopicPartition]:
        return {tp for pending in self.pending_txn_offsets.values() for tp in pending}

    def complete_pending_txn(self, producer_id: int, commit: bool) -> int:
        """The marker of the producer's transaction was written: apply (commit) or drop (abort) its offsets.

        A pending offset replaces the committed one only if its record is newer, as a plain commit written
        after the transactional one wins (compaction may otherwise materialise the wrong one on reload).
        Returns the number of offsets applied.
        """
        pending = self.pending_txn_offsets.pop(producer_id, None)
        if not pending or not commit:
            return 0
        applied = 0
        for tp, o in pending.items():
            current = self.offsets.get(tp)
            if current is None or o.record_offset > current.record_offset:
                self.offsets[tp] = o
                applied += 1
        return applied

    def remove_offsets(self, tps: list[TopicPartition]) -> None:
        """Tombstones for these partitions: the committed offsets go, and so do pending transactional ones."""
        for tp in tps:
            self.offsets.pop(tp, None)
            for pid in list(self.pending_txn_offsets):
                pending = self.pending_txn_offsets[pid]
                pending.pop(tp, None)
                if not pending:
                    del self.pending_txn_offsets[pid]

    def current_static_member(self, instance_id: str | None) -> str | None:
        return None if instance_id is None else self.static_members.get(instance_id)

    def all_members_joined(self) -> bool:
        """Kafka's hasAllMembersJoined: every member awaits a join and no new member id is outstanding."""
        return all(m.join_future is not None for m in self.members.values()) and not self.pending_members

    def not_yet_rejoined(self) -> list[MemberMetadata]:
        return [m for m in self.members.values() if m.join_future is None]

    def candidate_protocols(self) -> set[str]:
        sets = [set(m.supported()) for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def supports_protocols(self, protocol_type: str, protocols: list[str]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        return self.protocol_type == protocol_type and bool(self.candidate_protocols() & set(protocols))

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol among those all members support."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(p for p in m.supported() if p in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes.items(), key=lambda kv: kv[1])[0]

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def subscribed_topics(self) -> set[str] | None:
        """Topics the consumer members subscribe to, or None when they cannot be known."""
        from kbroker.protocol import codec
        from kbroker.protocol.messages import ConsumerProtocolSubscription
        from kbroker.protocol.primitives import I16

        if self.consumer is not None:
            return self.consumer.subscribed_topic_names()
        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            try:
                meta = m.metadata_for(self.protocol_name)
                (version,) = I16.unpack_from(meta, 0)
                sub, _ = codec.decode(ConsumerProtocolSubscription, min(version, 3), meta, 2)
            except Exception:  # noqa: BLE001 - foreign metadata: the subscription is unknowable
                return None
            topics.update(sub.topics)
        return topics

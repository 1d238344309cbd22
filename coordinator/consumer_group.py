"""ConsumerGroup and ConsumerGroupMember: the state of one KIP-848 consumer group (Kafka's ConsumerGroup).

State changes only by replay() of the group's __consumer_offsets records (consumer_group_records), on the
coordinator loop: a heartbeat computes the records, appends them, then replays them; loading a partition
replays the same records. So the in-memory group is always what a restarted broker reads back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from kbroker.coordinator import consumer_group_records as cgr
from kbroker.coordinator.consumer_group_records import Assignment, ConsumerGroupRecord, RecordType

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class MemberState(IntEnum):
    """Kafka's MemberState, with its byte values in ConsumerGroupCurrentMemberAssignmentValue.state."""

    STABLE = 0
    UNRELEASED_PARTITIONS = 1
    UNREVOKED_PARTITIONS = 2
    UNKNOWN = 127


class ConsumerGroupState(Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class ClassicMemberMetadata:
    """A member that speaks the classic protocol inside a consumer group (Kafka's ConsumerGroupMemberMetadataValue
    .ClassicMemberMetadata): its JoinGroup session timeout and protocols, (name, ConsumerProtocolSubscription)."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


@dataclass
class ConsumerGroupMember:
    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: list[str] = field(default_factory=list)
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    classic: ClassicMemberMetadata | None = None

    @property
    def uses_classic_protocol(self) -> bool:
        return self.classic is not None

    def metadata_record(self, group_id: str) -> ConsumerGroupRecord:
        return cgr.member_metadata_record(
            group_id, self.member_id, instance_id=self.instance_id, rack_id=self.rack_id, client_id=self.client_id,
            client_host=self.client_host, subscribed_topic_names=self.subscribed_topic_names,
            subscribed_topic_regex=self.subscribed_topic_regex, rebalance_timeout_ms=self.rebalance_timeout_ms,
            server_assignor=self.server_assignor, classic=self.classic)

    def assignment_record(self, group_id: str) -> ConsumerGroupRecord:
        return cgr.current_assignment_record(
            group_id, self.member_id, member_epoch=self.member_epoch, previous_member_epoch=self.previous_member_epoch,
            state=int(self.state), assigned=self.assigned, pending_revocation=self.pending_revocation)

    def same_metadata(self, other: ConsumerGroupMember) -> bool:
        return (self.instance_id, self.rack_id, self.rebalance_timeout_ms, self.client_id, self.client_host,
                sorted(self.subscribed_topic_names), self.subscribed_topic_regex, self.server_assignor,
                self.classic) == (
            other.instance_id, other.rack_id, other.rebalance_timeout_ms, other.client_id, other.client_host,
            sorted(other.subscribed_topic_names), other.subscribed_topic_regex, other.server_assignor, other.classic)

    def same_assignment(self, other: ConsumerGroupMember) -> bool:
        return (self.member_epoch, self.previous_member_epoch, self.state, _clean(self.assigned),
                _clean(self.pending_revocation)) == (
            other.member_epoch, other.previous_member_epoch, other.state, _clean(other.assigned),
            _clean(other.pending_revocation))


def _clean(a: Assignment) -> Assignment:
    return {t: ps for t, ps in a.items() if ps}


@dataclass
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerGroupMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, Assignment] = field(default_factory=dict)
    # Kafka 4.0's subscribed topics' metadata (ConsumerGroupPartitionMetadata), replayed from a log written before
    # the metadata hash: name -> (topic id, partitions). Non-empty, the group's next epoch tombstones it.
    subscription_metadata: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    # the group metadata hash (KIP-1101) of the subscribed topics at the group epoch
    metadata_hash: int = 0
    # (topic id, partition) -> member owning it (assigned or pending revocation): Kafka's currentPartitionEpoch.
    owners: dict[tuple[bytes, int], str] = field(default_factory=dict)
    # Not persisted: the topics map last compared with metadata_hash (metadata is copy-on-write).
    checked_topics: object = None
    session_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    session_deadlines: dict[str, float] = field(default_factory=dict)
    rebalance_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    # Classic members' JoinGroup / SyncGroup deadlines: ("join" | "sync", member id) -> timer.
    classic_timers: dict[tuple[str, str], asyncio.TimerHandle] = field(default_factory=dict)

    @property
    def state(self) -> ConsumerGroupState:
        """Kafka's ConsumerGroup.maybeUpdateGroupState."""
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def classic_members(self) -> list[ConsumerGroupMember]:
        return [m for m in self.members.values() if m.classic is not None]

    def all_classic_except(self, member_id: str) -> bool:
        """Kafka's allMembersUseClassicProtocolExcept."""
        return all(m.classic is not None for mid, m in self.members.items() if mid != member_id)

    def supports_classic_protocols(self, protocol_type: str, names: set[str]) -> bool:
        """Kafka's ConsumerGroup.supportsClassicProtocols: the consumer protocol type, and a protocol name every
        classic member supports."""
        if protocol_type != "consumer" or not names:
            return False
        for m in self.classic_members():
            assert m.classic is not None
            names = names & {n for n, _ in m.classic.protocols}
        return bool(names)

    def waiting_on_unreleased_partition(self, member: ConsumerGroupMember) -> bool:
        """Kafka's waitingOnUnreleasedPartition: a partition of its target is still owned by another member."""
        for t, ps in self.target.get(member.member_id, {}).items():
            for p in ps - member.assigned.get(t, set()):
                owner = self.owners.get((t, p))
                if owner is not None and owner != member.member_id:
                    return True
        return False

    def partition_owner(self, topic_id: bytes, partition: int) -> str | None:
        return self.owners.get((topic_id, partition))

    def subscribed_topic_names(self) -> set[str]:
        return {n for m in self.members.values() for n in m.subscribed_topic_names}

    def preferred_assignor(self, default: str) -> str:
        """The server assignor most members ask for (ties: the name first in order), else the default."""
        votes: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if not votes:
            return default
        return max(sorted(votes), key=lambda n: votes[n])

    # ------------------------------------------------------------ replay (Kafka's GroupMetadataManager.replay)

    def replay(self, r: ConsumerGroupRecord) -> None:
        v = r.value
        if r.type is RecordType.METADATA:
            if v is not None:
                self.group_epoch = v.epoch
                self.metadata_hash = v.metadata_hash
        elif r.type is RecordType.PARTITION_METADATA:
            self.subscription_metadata = {} if v is None else {
                t.topic_name: (t.topic_id, t.num_partitions) for t in v.topics}
        elif r.type is RecordType.TARGET_ASSIGNMENT_METADATA:
            self.assignment_epoch = -1 if v is None else v.assignment_epoch
        elif r.type is RecordType.TARGET_ASSIGNMENT_MEMBER:
            assert r.member_id is not None
            if v is None:
                self.target.pop(r.member_id, None)
            else:
                self.target[r.member_id] = cgr.to_assignment(v.topic_partitions)
        elif r.type is RecordType.MEMBER_METADATA:
            assert r.member_id is not None
            self._replay_member_metadata(r.member_id, v)
        elif r.type is RecordType.CURRENT_MEMBER_ASSIGNMENT:
            assert r.member_id is not None
            self._replay_current_assignment(r.member_id, v)

    def _replay_member_metadata(self, member_id: str, v: object | None) -> None:
        old = self.members.get(member_id)
        if v is None:
            if old is not None:
                self._set_owned(old, {}, {})
                del self.members[member_id]
                if old.instance_id is not None and self.static_members.get(old.instance_id) == member_id:
                    del self.static_members[old.instance_id]
            return
        m = old if old is not None else ConsumerGroupMember(member_id)
        if m.instance_id is not None and self.static_members.get(m.instance_id) == member_id:
            del self.static_members[m.instance_id]
        m.instance_id = v.instance_id  # type: ignore[attr-defined]
        m.rack_id = v.rack_id  # type: ignore[attr-defined]
        m.client_id = v.client_id  # type: ignore[attr-defined]
        m.client_host = v.client_host  # type: ignore[attr-defined]
        m.subscribed_topic_names = list(v.subscribed_topic_names)  # type: ignore[attr-defined]
        m.subscribed_topic_regex = v.subscribed_topic_regex or None  # type: ignore[attr-defined]
        m.rebalance_timeout_ms = v.rebalance_timeout_ms  # type: ignore[attr-defined]
        m.server_assignor = v.server_assignor or None  # type: ignore[attr-defined]
        classic = v.classic_member_metadata  # type: ignore[attr-defined]
        m.classic = None if classic is None else ClassicMemberMetadata(
            classic.session_timeout_ms, tuple((p.name, bytes(p.metadata)) for p in classic.supported_protocols))
        self.members[member_id] = m
        if m.instance_id is not None:
            self.static_members[m.instance_id] = member_id

    def _replay_current_assignment(self, member_id: str, v: object | None) -> None:
        m = self.members.get(member_id)
        if m is None:
            if v is None:
                return
            m = self.members[member_id] = ConsumerGroupMember(member_id)
        if v is None:
            # Kafka: the member is leaving; its subscription tombstone follows.
            m.member_epoch = m.previous_member_epoch = LEAVE_GROUP_MEMBER_EPOCH
            m.state = MemberState.STABLE
            self._set_owned(m, {}, {})
            return
        m.member_epoch = v.member_epoch  # type: ignore[attr-defined]
        m.previous_member_epoch = v.previous_member_epoch  # type: ignore[attr-defined]
        try:
            m.state = MemberState(v.state)  # type: ignore[attr-defined]
        except ValueError:
            m.state = MemberState.UNKNOWN
        self._set_owned(m, cgr.to_assignment(v.assigned_partitions),  # type: ignore[attr-defined]
                        cgr.to_assignment(v.partitions_pending_revocation))  # type: ignore[attr-defined]

    def _set_owned(self, m: ConsumerGroupMember, assigned: Assignment, pending: Assignment) -> None:
        for a in (m.assigned, m.pending_revocation):
            for t, ps in a.items():
                for p in ps:
                    if self.owners.get((t, p)) == m.member_id:
                        del self.owners[(t, p)]
        m.assigned, m.pending_revocation = assigned, pending
        for a in (assigned, pending):
            for t, ps in a.items():
                for p in ps:
                    self.owners[(t, p)] = m.member_id

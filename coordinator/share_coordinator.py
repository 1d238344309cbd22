"""ShareCoordinator: KIP-932 share-group membership and server-side assignment (ShareGroupHeartbeat).

Like Kafka's GroupMetadataManager for share groups: a member joins with epoch 0 and the member id its client
made, every change of membership or subscription bumps the group epoch and recomputes the target assignment
at once (share groups have no revocation step: several members may read one partition), and a member that
misses its session timeout is removed. The state is plain Python touched only from the share loop
(broker.share_partition_manager keeps every share structure on the group coordinator's loop), so it needs no lock.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kbroker.coordinator import share_group_records as shr
from kbroker.coordinator.share_group_records import RecordType, ShareGroupRecord, TopicPartitions
from kbroker.protocol.errors import ErrorCode

# topic id -> partition indexes
Assignment = dict[bytes, list[int]]


@dataclass
class ShareMember:
    member_id: str
    member_epoch: int
    client_id: str
    client_host: str
    rack_id: str | None
    subscribed: list[str]
    deadline: float
    assignment: Assignment = field(default_factory=dict)  # the target assignment
    target_epoch: int = 0  # the group epoch of that target; member_epoch catches up with it in a heartbeat
    previous_epoch: int = -1  # a member whose last response was lost may still send this one
    # the assignment last given to the member (Kafka's assignedPartitions, ShareGroupCurrentMemberAssignment):
    # what ShareGroupDescribe shows
    current: Assignment = field(default_factory=dict)


@dataclass
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    # Kafka's group metadata hash (KIP-1101) of the subscribed topics when the epoch was last bumped: a topic
    # whose partition count, id (deleted and made again) or racks change no longer hashes the same, and the
    # group's next heartbeat bumps the epoch and assigns again
    metadata_hash: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    # Kafka's ShareGroupStatePartitionMetadata: the share-partitions whose state the share coordinators
    # initialized (InitializeShareGroupState), are initializing, or are deleting (DeleteShareGroupOffsets)
    initialized: TopicPartitions = field(default_factory=dict)
    initializing: TopicPartitions = field(default_factory=dict)
    deleting: dict[bytes, str] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"

    @property
    def topics(self) -> set[str]:
        """The topics whose share-partitions have state: DeleteGroups deletes it with the group."""
        return {name for name, _ in (*self.initialized.values(), *self.initializing.values())}

    def state_partitions_record(self) -> ShareGroupRecord:
        return shr.state_partitions_record(self.group_id, self.initializing, self.initialized, self.deleting)


@dataclass
class HeartbeatResult:
    error: int = 0
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None
    # share-partitions to initialize (InitializeShareGroupState) with this state epoch once the records are written
    initialize: TopicPartitions | None = None
    state_epoch: int = 0


# topic name -> (topic id, partition count) of the topics that exist now
TopicsView = Callable[[], Mapping[str, tuple[bytes, int]]]
# the group metadata hash (coordinator.group_metadata_hash) of the named topics as they are now
MetadataHash = Callable[[Iterable[str]], int]


def _balance(
    members: list[str], partitions: list[tuple[bytes, int]], old: dict[str, set[tuple[bytes, int]]]
) -> dict[str, set[tuple[bytes, int]]]:
    """Kafka's simple assignment builder over one set of members and partitions: every partition is shared by
    ceil(members / partitions) members, member i wants ceil(s*(i+1)) - ceil(s*i) partitions (s = sharing *
    partitions / members, so the counts differ by one at most), and each member keeps what it had where balance
    allows (members still on a former assignment then overlap the new one as little as possible)."""
    if not partitions or not members:
        return {m: set() for m in members}
    n_parts, n_members = len(partitions), len(members)
    sharing = -(-n_members // n_parts)
    total = sharing * n_parts
    desired = {
        m: -(-total * (i + 1) // n_members) - -(-total * i // n_members) for i, m in enumerate(members)
    }
    targets = set(partitions)
    mine = {m: [p for p in sorted(old.get(m, ())) if p in targets] for m in members}
    holders: dict[tuple[bytes, int], list[str]] = {p: [] for p in partitions}
    for m in members:
        for p in mine[m]:
            holders[p].append(m)
    # over-shared partitions lose their overfilled holders first, then any
    for p in partitions:
        for overfilled_only in (True, False):
            for m in list(holders[p]):
                if len(holders[p]) <= sharing:
                    break
                if not overfilled_only or len(mine[m]) > desired[m]:
                    holders[p].remove(m)
                    mine[m].remove(p)
    # members still holding too many give up their last ones
    for m in members:
        while len(mine[m]) > desired[m]:
            holders[mine[m].pop()].remove(m)
    unfilled = [m for m in members if len(mine[m]) < desired[m]]
    for p in partitions:
        while len(holders[p]) < sharing and unfilled:
            taker = next((m for m in unfilled if m not in holders[p]), None)
            if taker is None:
                break  # every unfilled member holds p already: a slight imbalance, as in Kafka
            holders[p].append(taker)
            mine[taker].append(p)
            if len(mine[taker]) >= desired[taker]:
                unfilled.remove(taker)
            else:  # round robin: the next partition goes to the next unfilled member
                unfilled.append(unfilled.pop(unfilled.index(taker)))
    return {m: set(ps) for m, ps in mine.items()}


def assign(members: list[ShareMember], topics: Mapping[str, tuple[bytes, int]]) -> dict[str, Assignment]:
    """Kafka's SimpleAssignor (4.x): balanced, then sticky. With one subscription for all, the partitions of
    all subscribed topics are balanced together; otherwise each topic among its own subscribers. With more
    members than partitions a partition is shared, so no member idles. `members` in join order."""
    existing = {name: topics[name] for name in {t for m in members for t in m.subscribed} if name in topics}
    old = {m.member_id: {(t, p) for t, ps in m.assignment.items() for p in ps} for m in members}
    got: dict[str, set[tuple[bytes, int]]] = {m.member_id: set() for m in members}
    if len({frozenset(m.subscribed) for m in members}) <= 1:
        groups = [([m.member_id for m in members], sorted(existing))]
    else:
        groups = [
            ([m.member_id for m in members if name in m.subscribed], [name]) for name in sorted(existing)
        ]
    for ids, names in groups:
        parts = [(existing[n][0], i) for n in names for i in range(existing[n][1])]
        for mid, ps in _balance(ids, parts, old).items():
            got[mid] |= ps
    out: dict[str, Assignment] = {}
    for mid, ps in got.items():
        a: Assignment = {}
        for t, p in sorted(ps):
            a.setdefault(t, []).append(p)
        out[mid] = a
    return out


class ShareCoordinator:
    """Every change is written as Kafka's ShareGroup* records (`records`, drained by the caller into
    __consumer_offsets before it answers) and `replay` rebuilds the same state from them at load."""

    def __init__(
        self,
        topics: TopicsView,
        session_timeout_ms: Callable[[str], int],
        heartbeat_interval_ms: Callable[[str], int],
        max_size: int,
        metadata_hash: MetadataHash = lambda names: 0,
    ) -> None:
        self.groups: dict[str, ShareGroup] = {}
        self._topics = topics
        self._metadata_hash = metadata_hash
        # group id -> the topics view its hash was last checked against (replaced, never changed, on a change);
        # kept out of ShareGroup so a snapshot does not copy the view
        self._checked: dict[str, object] = {}
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._max_size = max_size
        self.on_member_removed: Callable[[str, str], None] = lambda group_id, member_id: None
        # group id -> the records of the changes made since the caller last drained them, in order
        self.records: dict[str, list[ShareGroupRecord]] = {}

    def drain(self, group_id: str) -> list[ShareGroupRecord]:
        return self.records.pop(group_id, [])

    def snapshot(self, group_id: str) -> ShareGroup | None:
        """The group as it is now (None: no such group), to revert to if the records of the changes made next
        cannot be written (Kafka's coordinator runtime snapshots its timeline at the last written offset)."""
        group = self.groups.get(group_id)
        return copy.deepcopy(group) if group is not None else None

    def revert(self, group_id: str, before: ShareGroup | None) -> None:
        """Undo the changes whose records were not written. Sessions are not part of the state (Kafka's are
        timers): a member that stays keeps the deadline of its latest heartbeat."""
        self.records.pop(group_id, None)
        now = self.groups.get(group_id)
        if before is None:
            self.groups.pop(group_id, None)
        else:
            if now is not None:
                for mid, m in before.members.items():
                    if mid in now.members:
                        m.deadline = now.members[mid].deadline
            self.groups[group_id] = before
        self._checked.pop(group_id, None)  # a bump for changed topics may have been undone: the next heartbeat redoes it

    def _emit(self, group: ShareGroup, record: ShareGroupRecord) -> None:
        self.records.setdefault(group.group_id, []).append(record)

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        rack_id: str | None,
        subscribed: list[str] | None,
        client_id: str,
        client_host: str,
    ) -> HeartbeatResult:
        if not group_id:
            return HeartbeatResult(ErrorCode.INVALID_REQUEST, "GroupId can't be empty.")
        if not member_id:
            return HeartbeatResult(ErrorCode.INVALID_REQUEST, "MemberId can't be empty.")
        now = time.monotonic()
        group = self.groups.get(group_id)
        interval = self._heartbeat_interval_ms(group_id)
        if member_epoch == -1:
            if group is not None and member_id in group.members:
                self._remove(group, member_id)
            return HeartbeatResult(member_id=member_id, member_epoch=-1, heartbeat_interval_ms=interval)
        if member_epoch == 0:
            if subscribed is None:
                return HeartbeatResult(
                    ErrorCode.INVALID_REQUEST, "SubscribedTopicNames must be set in first request."
                )
            if group is None:
                group = self.groups[group_id] = ShareGroup(group_id)
            member = group.members.get(member_id)
            if member is None:
                if len(group.members) >= self._max_size:
                    return HeartbeatResult(
                        ErrorCode.GROUP_MAX_SIZE_REACHED,
                        f"The share group has reached its maximum capacity of {self._max_size} members.",
                    )
                member = ShareMember(member_id, 0, client_id, client_host, rack_id, list(subscribed), 0.0)
                group.members[member_id] = member
                self._emit_member(group, member)
                self._bump(group)
        else:
            member = group.members.get(member_id) if group is not None else None
            if group is None or member is None:
                return HeartbeatResult(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}."
                )
            if member_epoch not in (member.member_epoch, member.previous_epoch):
                return HeartbeatResult(
                    ErrorCode.FENCED_MEMBER_EPOCH,
                    f"The share group member has a smaller member epoch ({member_epoch}) than the "
                    f"one known by the group coordinator ({member.member_epoch}).",
                )
        changed = False
        if subscribed is not None and sorted(subscribed) != sorted(member.subscribed):
            member.subscribed = list(subscribed)
            changed = True
        if rack_id is not None and rack_id != member.rack_id:
            member.rack_id = rack_id
            changed = True
        if changed:
            self._emit_member(group, member)
            if subscribed is not None:
                self._bump(group)
        topics = self._topics()
        if topics is not self._checked.get(group_id):
            # created or deleted topics, more partitions: as Kafka's metadata refresh, a group whose subscribed
            # topics hash differently now bumps its epoch (with the new hash) and assigns again
            self._checked[group_id] = topics
            self._forget_deleted(group, topics)
            if self._hash(group) != group.metadata_hash:
                self._bump(group)
        member.deadline = now + self._session_timeout_ms(group_id) / 1000
        assignment = None
        if member.member_epoch != member.target_epoch or member_epoch == 0:
            member.previous_epoch, member.member_epoch = member.member_epoch, member.target_epoch
            assignment = member.current = member.assignment
            self._emit(
                group,
                shr.current_assignment_record(
                    group_id, member_id, member.member_epoch, member.previous_epoch, member.assignment
                ),
            )
        return HeartbeatResult(
            member_id=member_id,
            member_epoch=member.member_epoch,
            heartbeat_interval_ms=interval,
            assignment=assignment,
            initialize=self._to_initialize(group, topics),
            state_epoch=group.group_epoch,
        )

    def _to_initialize(
        self, group: ShareGroup, topics: Mapping[str, tuple[bytes, int]]
    ) -> TopicPartitions | None:
        """Kafka's subscribedTopicsChangeMap: the subscribed share-partitions whose state is neither initialized
        nor initializing; they become initializing (a record) and the caller initializes them."""
        out: TopicPartitions = {}
        for name in sorted({t for m in group.members.values() for t in m.subscribed}):
            if name not in topics:
                continue
            tid, count = topics[name]
            have = set(group.initialized.get(tid, ("", []))[1]) | set(
                group.initializing.get(tid, ("", []))[1]
            )
            new = [p for p in range(count) if p not in have]
            if new:
                out[tid] = (name, new)
        if not out:
            return None
        for tid, (name, ps) in out.items():
            group.initializing[tid] = (
                name,
                sorted(set(group.initializing.get(tid, (name, []))[1]) | set(ps)),
            )
        self._emit(group, group.state_partitions_record())
        return out

    def initialized(self, group_id: str, done: TopicPartitions, failed: TopicPartitions) -> None:
        """InitializeShareGroupState answered: the share-partitions done are initialized, the failed ones go back
        to uninitialized (the next heartbeat tries again)."""
        group = self.groups.get(group_id)
        if group is None:
            return
        for tps, into in ((done, group.initialized), (failed, None)):
            for tid, (name, ps) in tps.items():
                left = [p for p in group.initializing.get(tid, (name, []))[1] if p not in ps]
                if left:
                    group.initializing[tid] = (name, left)
                else:
                    group.initializing.pop(tid, None)
                if into is not None:
                    into[tid] = (name, sorted(set(into.get(tid, (name, []))[1]) | set(ps)))
        self._emit(group, group.state_partitions_record())
        if done:
            self._bump(group)  # the new share-partitions are assignable now

    def catch_up(self, group_id: str, member_id: str, r: HeartbeatResult) -> None:
        """After the heartbeat's share-partitions were initialized (a new target): the member gets it in this
        response. Its previous epoch stays the one it sent, so a lost response is retried with that."""
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None or member.member_epoch == member.target_epoch:
            return
        if r.assignment is None:
            member.previous_epoch = member.member_epoch
        member.member_epoch = member.target_epoch
        r.member_epoch, r.assignment = member.member_epoch, member.assignment
        member.current = member.assignment
        self._emit(
            group,
            shr.current_assignment_record(
                group_id, member_id, member.member_epoch, member.previous_epoch, member.assignment
            ),
        )

    def create(self, group_id: str) -> ShareGroup:
        """An empty share group (AlterShareGroupOffsets of a group not known yet makes it, as Kafka's)."""
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = ShareGroup(group_id)
            self._emit(group, shr.group_epoch_record(group_id, 0))
        return group

    def deleting(self, group_id: str, topics: dict[bytes, str]) -> None:
        """DeleteShareGroupOffsets begins: these topics' state is being deleted (Kafka's DeletingTopics)."""
        group = self.groups.get(group_id)
        if group is None or not topics:
            return
        group.deleting.update(topics)
        self._emit(group, group.state_partitions_record())

    def forget_topics(self, group_id: str, topic_ids: set[bytes]) -> None:
        """DeleteShareGroupOffsets: these topics' share-partitions have no state any more (initialized again
        when a member next subscribes to them); the ones whose deletion failed stay initialized."""
        group = self.groups.get(group_id)
        if group is None:
            return
        group.deleting = {}
        for tid in topic_ids:
            group.initialized.pop(tid, None)
            group.initializing.pop(tid, None)
            group.deleting.pop(tid, None)
        self._emit(group, group.state_partitions_record())

    def bump_epoch(self, group_id: str) -> int:
        """A new group epoch, as Kafka's AlterShareGroupOffsets takes one for the state epoch it initializes."""
        group = self.groups[group_id]
        group.group_epoch += 1
        self._emit(group, shr.group_epoch_record(group_id, group.group_epoch, group.metadata_hash))
        return group.group_epoch

    def _emit_member(self, group: ShareGroup, m: ShareMember) -> None:
        self._emit(
            group,
            shr.member_record(
                group.group_id, m.member_id, m.rack_id, m.client_id, m.client_host, m.subscribed
            ),
        )

    def _hash(self, group: ShareGroup) -> int:
        return self._metadata_hash({t for m in group.members.values() for t in m.subscribed})

    def _forget_deleted(self, group: ShareGroup, topics: Mapping[str, tuple[bytes, int]]) -> None:
        """Share-partitions of topics that no longer exist (deleted, perhaps made again under a new id) are no
        longer initialized (Kafka's group coordinator drops deleted topics from ShareGroupStatePartitionMetadata):
        a topic made again under its old name is initialized afresh."""
        live = {tid for tid, _ in topics.values()}
        gone = [t for t in (*group.initialized, *group.initializing) if t not in live]
        if not gone:
            return
        for tid in gone:
            group.initialized.pop(tid, None)
            group.initializing.pop(tid, None)
        self._emit(group, group.state_partitions_record())

    def _bump(self, group: ShareGroup) -> None:
        group.group_epoch += 1
        group.metadata_hash = self._hash(group)
        self._emit(group, shr.group_epoch_record(group.group_id, group.group_epoch, group.metadata_hash))
        self._reassign(group)

    def _assignable(self, group: ShareGroup) -> Mapping[str, tuple[bytes, int]]:
        """The topics as the assignor sees them: as in Kafka, only share-partitions whose state is initialized
        are assigned (a leader never serves one the share coordinators do not know yet); a topic counts with
        its leading initialized partitions."""
        out: dict[str, tuple[bytes, int]] = {}
        for name, (tid, count) in self._topics().items():
            have = set(group.initialized.get(tid, ("", []))[1])
            n = 0
            while n < count and n in have:
                n += 1
            if n:
                out[name] = (tid, n)
        return out

    def _reassign(self, group: ShareGroup) -> None:
        targets = assign(list(group.members.values()), self._assignable(group))
        group.assignment_epoch = group.group_epoch
        for mid, m in group.members.items():
            if targets[mid] != m.assignment or m.target_epoch == 0:
                m.assignment = targets[mid]
                m.target_epoch = group.group_epoch
                self._emit(group, shr.target_member_record(group.group_id, mid, m.assignment))
        self._emit(
            group, shr.target_epoch_record(group.group_id, group.assignment_epoch, int(time.time() * 1000))
        )

    def _remove(self, group: ShareGroup, member_id: str) -> None:
        del group.members[member_id]
        gid = group.group_id
        for rtype in (
            RecordType.CURRENT_MEMBER_ASSIGNMENT,
            RecordType.TARGET_ASSIGNMENT_MEMBER,
            RecordType.MEMBER_METADATA,
        ):
            self._emit(group, shr.tombstone(rtype, gid, member_id))
        self._bump(group)
        self.on_member_removed(gid, member_id)

    def expire_members(self) -> list[str]:
        """Remove the members whose session timed out (Kafka's session timer); the groups changed."""
        now = time.monotonic()
        changed = []
        for group in list(self.groups.values()):
            gone = [mid for mid, m in group.members.items() if m.deadline < now]
            for mid in gone:
                self._remove(group, mid)
            if gone:
                changed.append(group.group_id)
        return changed

    def delete(self, group_id: str) -> int:
        """DeleteGroups of an empty share group (its share-partitions' state is the caller's to delete first)."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP
        del self.groups[group_id]
        self._checked.pop(group_id, None)
        for rtype in (
            RecordType.TARGET_ASSIGNMENT_METADATA,
            RecordType.STATE_PARTITION_METADATA,
            RecordType.METADATA,
        ):
            self._emit(group, shr.tombstone(rtype, group_id))
        return ErrorCode.NONE

    # ------------------------------------------------------------ load

    def replay(self, r: ShareGroupRecord) -> None:
        """Apply one record read back from __consumer_offsets (Kafka's GroupMetadataManager.replay)."""
        gid, v = r.group_id, r.value
        group = self.groups.get(gid)
        if r.type == RecordType.METADATA:
            if v is None:
                self.groups.pop(gid, None)
                return
            group = group or self.groups.setdefault(gid, ShareGroup(gid))
            group.group_epoch = v.epoch
            group.metadata_hash = v.metadata_hash
            return
        if group is None:
            if v is None:
                return
            group = self.groups[gid] = ShareGroup(gid)
        mid = r.member_id or ""
        member = group.members.get(mid)
        if r.type == RecordType.MEMBER_METADATA:
            if v is None:
                group.members.pop(mid, None)
            elif member is None:
                # a session from now, not 0: a sweep between two chunks of a long load must not expire it
                deadline = time.monotonic() + self._session_timeout_ms(gid) / 1000
                group.members[mid] = ShareMember(
                    mid, 0, v.client_id, v.client_host, v.rack_id, list(v.subscribed_topic_names), deadline
                )
            else:
                member.client_id, member.client_host, member.rack_id = v.client_id, v.client_host, v.rack_id
                member.subscribed = list(v.subscribed_topic_names)
        elif r.type == RecordType.TARGET_ASSIGNMENT_MEMBER:
            if v is not None and member is not None:
                member.assignment = shr.to_assignment(v.topic_partitions)
                member.target_epoch = group.group_epoch
        elif r.type == RecordType.TARGET_ASSIGNMENT_METADATA:
            group.assignment_epoch = v.assignment_epoch if v is not None else 0
        elif r.type == RecordType.CURRENT_MEMBER_ASSIGNMENT:
            if v is not None and member is not None:
                member.member_epoch, member.previous_epoch = v.member_epoch, v.previous_member_epoch
                member.current = shr.to_assignment(v.assigned_partitions)
        elif r.type == RecordType.STATE_PARTITION_METADATA:
            if v is None:
                group.initialized, group.initializing, group.deleting = {}, {}, {}
            else:
                group.initialized = shr.to_topic_partitions(v.initialized_topics)
                group.initializing = shr.to_topic_partitions(v.initializing_topics)
                group.deleting = {t.topic_id: t.topic_name for t in v.deleting_topics}

    def loaded(self, group_ids: list[str]) -> None:
        """After a load: every member's session starts now (Kafka's onLoaded schedules their timeouts), and the
        share-partitions still initializing are initialized again on the next heartbeat."""
        now = time.monotonic()
        for gid in group_ids:
            group = self.groups.get(gid)
            if group is None:
                continue
            group.initializing = {}
            for m in group.members.values():
                m.deadline = now + self._session_timeout_ms(gid) / 1000

    def unload(self, group_ids: list[str]) -> None:
        """The coordinator moved away: these groups are another broker's now."""
        for gid in group_ids:
            self.groups.pop(gid, None)
            self.records.pop(gid, None)
            self._checked.pop(gid, None)

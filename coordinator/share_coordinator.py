"""ShareCoordinator: KIP-932 share-group membership and server-side assignment (ShareGroupHeartbeat).

Like Kafka's GroupMetadataManager for share groups: a member joins with epoch 0 and the member id its client
made, every change of membership or subscription bumps the group epoch and recomputes the target assignment
at once (share groups have no revocation step: several members may read one partition), and a member that
misses its session timeout is removed. The state is plain Python touched only from the share loop
(broker.share_partition_manager keeps every share structure on the group coordinator's loop), so it needs no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

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


@dataclass
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    # every topic a member subscribed to (Kafka keeps the initialized ones in its ShareGroupStatePartitionMetadata
    # record): the share-partitions whose state DeleteGroups deletes with the group
    topics: set[str] = field(default_factory=set)

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"


@dataclass
class HeartbeatResult:
    error: int = 0
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None


# topic name -> (topic id, partition count) of the topics that exist now
TopicsView = Callable[[], Mapping[str, tuple[bytes, int]]]


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
    def __init__(
        self,
        topics: TopicsView,
        session_timeout_ms: Callable[[str], int],
        heartbeat_interval_ms: Callable[[str], int],
        max_size: int,
    ) -> None:
        self.groups: dict[str, ShareGroup] = {}
        self._topics = topics
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._max_size = max_size
        self._topics_seen: Mapping[str, tuple[bytes, int]] = {}
        self.on_member_removed: Callable[[str, str], None] = lambda group_id, member_id: None

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
        if subscribed is not None and sorted(subscribed) != sorted(member.subscribed):
            member.subscribed = list(subscribed)
            self._bump(group)
        group.topics.update(member.subscribed)
        if rack_id is not None:
            member.rack_id = rack_id
        topics = self._topics()
        if topics is not self._topics_seen:  # created or deleted topics, more partitions: assign again
            self._topics_seen = topics
            self._reassign(group)
        member.deadline = now + self._session_timeout_ms(group_id) / 1000
        assignment = None
        if member.member_epoch != member.target_epoch or member_epoch == 0:
            member.previous_epoch, member.member_epoch = member.member_epoch, member.target_epoch
            assignment = member.assignment
        return HeartbeatResult(
            member_id=member_id,
            member_epoch=member.member_epoch,
            heartbeat_interval_ms=interval,
            assignment=assignment,
        )

    def _bump(self, group: ShareGroup) -> None:
        group.group_epoch += 1
        self._reassign(group)

    def _reassign(self, group: ShareGroup) -> None:
        targets = assign(list(group.members.values()), self._topics())
        group.assignment_epoch = group.group_epoch
        for mid, m in group.members.items():
            if targets[mid] != m.assignment or m.target_epoch == 0:
                m.assignment = targets[mid]
                m.target_epoch = group.group_epoch

    def _remove(self, group: ShareGroup, member_id: str) -> None:
        del group.members[member_id]
        self._bump(group)
        self.on_member_removed(group.group_id, member_id)

    def expire_members(self) -> None:
        """Remove the members whose session timed out (Kafka's session timer)."""
        now = time.monotonic()
        for group in list(self.groups.values()):
            for mid in [mid for mid, m in group.members.items() if m.deadline < now]:
                self._remove(group, mid)

    def delete(self, group_id: str) -> int:
        """DeleteGroups of an empty share group (its share-partitions' state is the caller's to delete first)."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP
        del self.groups[group_id]
        return ErrorCode.NONE

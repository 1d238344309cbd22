"""KIP-848 consumer groups on the group coordinator: ConsumerGroupHeartbeat, member leave and fencing, session
and rebalance timeouts, ConsumerGroupDescribe, and the member-epoch checks of offset commits and fetches
(Kafka 3.9's GroupMetadataManager.consumerGroupHeartbeat and friends).

ConsumerGroupManager is mixed into GroupCoordinator and runs on its loop like the rest of it: a heartbeat
computes the group's new records from its current state without awaiting anything, appends them to
__consumer_offsets, replays them into the ConsumerGroup (so state changes exactly as a reload would replay it),
and only then awaits the flush/replication before answering.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kbroker.coordinator import consumer_group_records as cgr
from kbroker.coordinator.consumer_group import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroup,
    ConsumerGroupMember,
    MemberState,
)
from kbroker.coordinator.consumer_group_assignors import TargetAssignmentBuilder, assignor_named
from kbroker.coordinator.consumer_group_current_assignment import CurrentAssignmentBuilder
from kbroker.coordinator.consumer_group_records import Assignment, ConsumerGroupRecord
from kbroker.coordinator.group_metadata import GroupMetadata, GroupState
from kbroker.coordinator.group_metadata_hash import rack_lookup, topics_hash
from kbroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kbroker.coordinator.consumer_group_migration import ClassicUpgrade
    from kbroker.coordinator.group_coordinator import CoordinatorHost, GroupConfig

log = logging.getLogger("kbroker.group")


class ConsumerGroupError(Exception):
    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


@dataclass
class ConsumerHeartbeat:
    """One ConsumerGroupHeartbeat request, as the handler decoded it (topic ids for owned partitions)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: list[str] | None
    server_assignor: str | None
    owned: Assignment | None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_regex: str | None = None  # v1 (Kafka 4.0); "" clears it
    api_version: int = 0  # v1 creates a group as Kafka 4.4 does (see _consumer_group)


@dataclass
class ConsumerHeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None


@dataclass
class DescribedConsumerGroup:
    group_id: str
    error: ErrorCode
    message: str | None = None
    state: str = "Dead"
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ""
    members: list[tuple[ConsumerGroupMember, Assignment]] | None = None  # (member snapshot, its target)


def member_topics(m: ConsumerGroupMember, topics: Mapping[str, Any]) -> set[str]:
    """The topics a member subscribes to: its names, and the topics its regex matches in full. Kafka resolves
    the regex with RE2/J; kbroker uses Python's `re` (the same for the usual patterns). Internal topics (`__`)
    are never matched, as in Kafka."""
    out = set(m.subscribed_topic_names)
    if m.subscribed_topic_regex:
        out.update(_regex_matches(m.subscribed_topic_regex, topics))
    return out


_regex_cache: dict[tuple[str, int], frozenset[str]] = {}


def _regex_matches(pattern: str, topics: Mapping[str, Any]) -> frozenset[str]:
    # The topics map is replaced on every change: its identity keys the resolution.
    key = (pattern, id(topics))
    hit = _regex_cache.get(key)
    if hit is None:
        if len(_regex_cache) > 1024:
            _regex_cache.clear()
        rx = re.compile(pattern)
        hit = _regex_cache[key] = frozenset(t for t in topics if not t.startswith("__") and rx.fullmatch(t))
    return hit


def _now_ms() -> int:
    return int(time.time() * 1000)


class ConsumerGroupManager:
    if TYPE_CHECKING:
        host: CoordinatorHost
        config: GroupConfig
        groups: dict[str, GroupMetadata]
        loop: asyncio.AbstractEventLoop

        def coordinator_error(self, group_id: str) -> ErrorCode | None: ...
        def offsets_partition(self, group_id: str) -> int: ...
        def _write(self, group_id: str, entries: Sequence[tuple[bytes, bytes | None]], *,
                   producer_id: int = -1, producer_epoch: int = -1) -> tuple[Any, Any]: ...
        async def _flush_if_needed(self, lg: Any, last_offset: int) -> None: ...
        # coordinator.consumer_group_migration
        def upgrade_classic_group(self, holder: GroupMetadata) -> ClassicUpgrade: ...
        def commit_upgrade(self, upgrade: ClassicUpgrade) -> list[tuple[bytes, bytes | None]]: ...
        def upgrade_committed(self, upgrade: ClassicUpgrade) -> None: ...
        def can_downgrade(self, cg: ConsumerGroup, leaving_id: str,
                          joining: ConsumerGroupMember | None = None) -> bool: ...
        async def downgrade_to_classic_group(self, cg: ConsumerGroup, leaving: ConsumerGroupMember, why: str,
                                             joining: ConsumerGroupMember | None = None,
                                             records: list[ConsumerGroupRecord] | None = None) -> None: ...
        def cancel_classic_timers(self, cg: ConsumerGroup, member_id: str | None = None) -> None: ...

    # ------------------------------------------------------------ heartbeat

    async def consumer_group_heartbeat(self, hb: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        try:
            self._validate_heartbeat(hb)
            err = self.coordinator_error(hb.group_id)
            if err is not None:
                raise ConsumerGroupError(err)
            if hb.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                return await self._consumer_group_leave(hb)
            return await self._consumer_group_join_or_heartbeat(hb)
        except ConsumerGroupError as e:
            return ConsumerHeartbeatResult(e.code, e.message)

    def _validate_heartbeat(self, hb: ConsumerHeartbeat) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        def invalid(msg: str) -> ConsumerGroupError:
            return ConsumerGroupError(ErrorCode.INVALID_REQUEST, msg)

        if not hb.group_id:
            raise invalid("GroupId can't be empty.")
        if hb.instance_id is not None and not hb.instance_id:
            raise invalid("InstanceId can't be empty.")
        if hb.rack_id is not None and not hb.rack_id:
            raise invalid("RackId can't be empty.")
        if hb.api_version >= 1 and not hb.member_id:
            raise invalid("MemberId can't be empty.")  # v1: the member generates its id (KIP-1082)
        if hb.member_epoch > 0 or hb.member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
            if not hb.member_id:
                raise invalid("MemberId can't be empty.")
        elif hb.member_epoch == 0:
            if hb.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if hb.owned is None or any(hb.owned.values()):
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            if hb.subscribed_topic_names is None and not hb.subscribed_topic_regex:
                raise invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        elif hb.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if not hb.member_id:
                raise invalid("MemberId can't be empty.")
            if hb.instance_id is None:
                raise invalid("InstanceId can't be null.")
        else:
            raise invalid(f"MemberEpoch is invalid: {hb.member_epoch}.")
        if hb.subscribed_topic_regex:
            try:
                re.compile(hb.subscribed_topic_regex)
            except re.error as e:
                raise ConsumerGroupError(ErrorCode.INVALID_REGULAR_EXPRESSION,
                                         f"SubscribedTopicRegex `{hb.subscribed_topic_regex}` is not a valid regular "
                                         f"expression: {e}.") from None
        if hb.server_assignor is not None and hb.server_assignor not in self.config.consumer_assignors:
            raise ConsumerGroupError(
                ErrorCode.UNSUPPORTED_ASSIGNOR,
                f"ServerAssignor {hb.server_assignor} is not supported. Supported assignors: "
                f"{', '.join(self.config.consumer_assignors)}.")

    def _consumer_group(self, group_id: str, create: bool, upgrades: list[ClassicUpgrade] | None = None,
                        initial_epoch: int = 0) -> ConsumerGroup:
        """The group's state, or a new unregistered one (registered when its first records are replayed) at
        `initial_epoch` (group and assignment epoch).
        An empty classic group (offsets only) becomes a consumer group, as Kafka replaces it; a joining member
        upgrades a classic group with members when the migration policy allows (the upgrade is added to
        `upgrades`, its records go with the member's)."""
        holder = self.groups.get(group_id)
        if holder is not None and holder.consumer is not None:
            return holder.consumer
        if holder is not None and holder.streams is not None:
            raise ConsumerGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.")
        if holder is not None and (holder.members or holder.state is not GroupState.EMPTY):
            if create and upgrades is not None:
                upgrade = self.upgrade_classic_group(holder)
                upgrades.append(upgrade)
                return upgrade.group
            raise ConsumerGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.")
        if not create:
            raise ConsumerGroupError(ErrorCode.UNKNOWN_MEMBER_ID, f"Consumer group {group_id} not found.")
        return ConsumerGroup(group_id, group_epoch=initial_epoch, assignment_epoch=initial_epoch)

    @staticmethod
    def _check_member_epoch(member: ConsumerGroupMember, received: int, owned: Assignment | None) -> None:
        """Kafka's throwIfMemberEpochIsInvalid: a member one epoch behind whose owned partitions are all still
        assigned to it is accepted (the response that bumped its epoch may have been lost)."""
        if received > member.member_epoch:
            raise ConsumerGroupError(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"The consumer group member has a greater member epoch ({received}) than the one known by the "
                f"group coordinator ({member.member_epoch}). The member must abandon all its partitions and rejoin.")
        if received < member.member_epoch:
            subset = owned is not None and all(ps <= member.assigned.get(t, set()) for t, ps in owned.items())
            if received != member.previous_member_epoch or not subset:
                raise ConsumerGroupError(
                    ErrorCode.FENCED_MEMBER_EPOCH,
                    f"The consumer group member has a smaller member epoch ({received}) than the one known by the "
                    f"group coordinator ({member.member_epoch}). The member must abandon all its partitions and "
                    "rejoin.")

    def _check_group_size(self, cg: ConsumerGroup) -> None:
        if len(cg.members) >= self.config.consumer_max_size:
            raise ConsumerGroupError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"The consumer group has reached its maximum capacity of {self.config.consumer_max_size} members.")

    async def _consumer_group_join_or_heartbeat(self, hb: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        gid = hb.group_id
        upgrades: list[ClassicUpgrade] = []
        # Kafka 4.4 (KAFKA-20268, for its offloaded assignment) creates a group at epoch 1 with an empty target
        # assignment at epoch 1, so the first join makes it epoch 2; Kafka 3.9-4.2 create it at 0 (first join: 1).
        # A group is created as the Kafka release of the creating request's version does: v1 is Kafka 4.x's.
        cg = self._consumer_group(gid, create=hb.member_epoch == 0, upgrades=upgrades,
                                  initial_epoch=1 if hb.api_version >= 1 else 0)
        records: list[ConsumerGroupRecord] = []
        new_member = False
        replaced: ConsumerGroupMember | None = None
        if hb.instance_id is None:
            member = cg.members.get(hb.member_id) if hb.member_id else None
            if member is None:
                if hb.member_epoch != 0:
                    raise ConsumerGroupError(ErrorCode.UNKNOWN_MEMBER_ID,
                                             f"Member {hb.member_id} is not a member of group {gid}.")
                self._check_group_size(cg)
                member = ConsumerGroupMember(hb.member_id or str(uuid.uuid4()))
                new_member = True
            elif hb.member_epoch != 0:
                self._check_member_epoch(member, hb.member_epoch, hb.owned)
        else:
            existing_id = cg.static_members.get(hb.instance_id)
            existing = cg.members.get(existing_id) if existing_id is not None else None
            if hb.member_epoch == 0:
                if existing is None:
                    self._check_group_size(cg)
                    member = ConsumerGroupMember(hb.member_id or str(uuid.uuid4()))
                    new_member = True
                elif existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH and existing.classic is None:
                    # A classic static member does not announce its departure: its instance id is taken over
                    # (a rolling upgrade), as in Kafka.
                    raise ConsumerGroupError(
                        ErrorCode.UNRELEASED_INSTANCE_ID,
                        f"Static member {hb.member_id} with instance id {hb.instance_id} cannot join the group "
                        f"because the instance id is owned by {existing.member_id} member.")
                else:
                    # The static member comes back as a new member id: it takes over its predecessor's epoch and
                    # assignment (Kafka's static member replacement).
                    replaced = existing
                    new_id = hb.member_id or str(uuid.uuid4())
                    if new_id == existing.member_id:
                        new_id = str(uuid.uuid4())
                    epoch = existing.previous_member_epoch if existing.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH \
                        else existing.member_epoch
                    member = replace(existing, member_id=new_id, member_epoch=epoch, state=MemberState.STABLE,
                                     pending_revocation={})
                    records += cgr.member_tombstones(gid, existing.member_id)
                    records.append(cgr.target_assignment_record(gid, new_id, cg.target.get(existing.member_id, {})))
            else:
                if existing is None:
                    raise ConsumerGroupError(ErrorCode.UNKNOWN_MEMBER_ID,
                                             f"Instance id {hb.instance_id} is unknown.")
                if existing.member_id != hb.member_id:
                    raise ConsumerGroupError(
                        ErrorCode.FENCED_INSTANCE_ID,
                        f"Static member {hb.member_id} with instance id {hb.instance_id} was fenced by member "
                        f"{existing.member_id}.")
                member = existing
                self._check_member_epoch(member, hb.member_epoch, hb.owned)
        # A copy: replaying the records below updates the stored member in place.
        before = replace(member)
        if hb.member_epoch == 0 and not new_member and replaced is None:
            # A known member rejoining (after it was fenced, or restarted with its id): it owns nothing now.
            member = replace(member, member_epoch=0, previous_member_epoch=-1, state=MemberState.STABLE,
                             assigned={}, pending_revocation={})
        updated = replace(
            member,
            instance_id=hb.instance_id if hb.instance_id is not None else member.instance_id,
            rack_id=hb.rack_id if hb.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=hb.rebalance_timeout_ms if hb.rebalance_timeout_ms != -1
            else member.rebalance_timeout_ms,
            server_assignor=hb.server_assignor if hb.server_assignor is not None else member.server_assignor,
            subscribed_topic_names=sorted(set(hb.subscribed_topic_names)) if hb.subscribed_topic_names is not None
            else member.subscribed_topic_names,
            subscribed_topic_regex=(hb.subscribed_topic_regex or None) if hb.subscribed_topic_regex is not None
            else member.subscribed_topic_regex,
            client_id=hb.client_id, client_host=hb.client_host,
            classic=None,  # a member heartbeating with ConsumerGroupHeartbeat uses the consumer protocol
        )
        bump = False
        if new_member or replaced is not None or not updated.same_metadata(before):
            records.append(updated.metadata_record(gid))
            bump = new_member or (sorted(updated.subscribed_topic_names) != sorted(before.subscribed_topic_names)
                                  or updated.subscribed_topic_regex != before.subscribed_topic_regex)

        topics = self.host.consumer_group_topics()
        reconciled = self._update_member(cg, before, updated, new_member, replaced, bump, hb.owned, topics, records)

        extra: list[tuple[bytes, bytes | None]] = []
        for upgrade in upgrades:
            extra += self.commit_upgrade(upgrade)
            records[:0] = upgrade.records
        await self._apply_and_flush(gid, cg, records, topics, extra)
        for upgrade in upgrades:
            self.upgrade_committed(upgrade)
        if new_member:
            log.info("Member %s joins consumer group %s (client %s%s)", updated.member_id, gid, hb.client_id,
                     f", instance {hb.instance_id}" if hb.instance_id else "")
        elif replaced is not None:
            log.info("Static member %s of consumer group %s replaces %s (instance %s)", updated.member_id, gid,
                     replaced.member_id, hb.instance_id)
        self._schedule_session_timeout(cg, reconciled.member_id)
        self._maybe_schedule_rebalance_timeout(cg, before, reconciled)
        full = hb.member_epoch == 0 or (hb.rebalance_timeout_ms != -1 and hb.subscribed_topic_names is not None
                                        and hb.owned is not None)
        changed = reconciled.assigned != before.assigned or replaced is not None
        return ConsumerHeartbeatResult(
            ErrorCode.NONE, None, reconciled.member_id, reconciled.member_epoch, self._heartbeat_interval_ms(gid),
            {t: set(ps) for t, ps in reconciled.assigned.items() if ps} if full or changed else None)

    @staticmethod
    def _owner_for(cg: ConsumerGroup, replaced: ConsumerGroupMember | None, member_id: str, t: bytes,
                   p: int) -> str | None:
        owner = cg.partition_owner(t, p)
        if replaced is not None and owner == replaced.member_id:
            return member_id
        return owner

    @staticmethod
    def _subscription_metadata(members: Sequence[ConsumerGroupMember], topics: Mapping[str, Any]
                               ) -> dict[str, tuple[bytes, int]]:
        out: dict[str, tuple[bytes, int]] = {}
        for m in members:
            for name in member_topics(m, topics):
                rec = topics.get(name)
                if rec is not None and rec.num_partitions > 0:
                    out[name] = (rec.topic_id, rec.num_partitions)
        return out

    def _metadata_hash(self, members: Sequence[ConsumerGroupMember], topics: Mapping[str, Any]) -> int:
        """Kafka's ModernGroup.computeMetadataHash: the group hash of the topics the members subscribe to."""
        names = {name for m in members for name in member_topics(m, topics)}
        return topics_hash(names, topics, rack_lookup(self.host))

    def _drop_subscription_metadata(self, cg: ConsumerGroup, records: list[ConsumerGroupRecord]) -> None:
        """Kafka 4.1+ keeps no ConsumerGroupPartitionMetadata: a group loaded with one tombstones it."""
        if cg.subscription_metadata:
            records.append(cgr.tombstone(cgr.RecordType.PARTITION_METADATA, cg.group_id))

    # ------------------------------------------------------------ leave and fencing

    async def _consumer_group_leave(self, hb: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        gid = hb.group_id
        cg = self._consumer_group(gid, create=False)
        if hb.instance_id is None:
            member = cg.members.get(hb.member_id)
            if member is None:
                raise ConsumerGroupError(ErrorCode.UNKNOWN_MEMBER_ID,
                                         f"Member {hb.member_id} is not a member of group {gid}.")
        else:
            mid = cg.static_members.get(hb.instance_id)
            member = cg.members.get(mid) if mid is not None else None
            if member is None:
                raise ConsumerGroupError(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {hb.instance_id} is unknown.")
            if member.member_id != hb.member_id:
                raise ConsumerGroupError(
                    ErrorCode.FENCED_INSTANCE_ID,
                    f"Static member {hb.member_id} with instance id {hb.instance_id} was fenced by member "
                    f"{member.member_id}.")
        if hb.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            # A static member leaving temporarily keeps its partitions until its session times out, so that
            # its next instance gets them back without a rebalance.
            left = replace(member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH,
                           previous_member_epoch=member.member_epoch)
            await self._apply_and_flush(gid, cg, [left.assignment_record(gid)], None)
            self._cancel_rebalance_timeout(cg, member.member_id)
            log.info("Static member %s (instance %s) leaves consumer group %s temporarily", member.member_id,
                     hb.instance_id, gid)
            # A leaving member is told no heartbeat interval (0), as Kafka's consumerGroupLeave answers.
            return ConsumerHeartbeatResult(ErrorCode.NONE, None, member.member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH, 0)
        await self._fence_member(cg, member, "left the group")
        return ConsumerHeartbeatResult(ErrorCode.NONE, None, member.member_id, LEAVE_GROUP_MEMBER_EPOCH, 0)

    async def _fence_member(self, cg: ConsumerGroup, member: ConsumerGroupMember, why: str) -> None:
        """Kafka's consumerGroupFenceMember: the member's records go, the group epoch is bumped (its
        partitions get a new owner on the others' next heartbeats), or the group is downgraded to a classic group
        when only classic members are left."""
        gid = cg.group_id
        self.cancel_classic_timers(cg, member.member_id)
        if self.can_downgrade(cg, member.member_id):
            await self.downgrade_to_classic_group(cg, member, why)
            return
        topics = self.host.consumer_group_topics()
        await self._apply_and_flush(gid, cg, self._removal_records(cg, [member.member_id], topics), topics)
        self._cancel_session_timeout(cg, member.member_id)
        self._cancel_rebalance_timeout(cg, member.member_id)
        log.info("Member %s %s consumer group %s; group epoch %d, %d members left", member.member_id,
                 why if why != "left the group" else "left", gid, cg.group_epoch, len(cg.members))

    # ------------------------------------------------------------ records

    def _removal_records(self, cg: ConsumerGroup, gone: list[str], topics: Any) -> list[ConsumerGroupRecord]:
        """Kafka's consumerGroupFenceMember records for members that go at once: their tombstones, a group epoch
        bump with the metadata hash of what the others subscribe to, and the assignment epoch with it when no member
        is left."""
        gid = cg.group_id
        records = [r for mid in gone for r in cgr.member_tombstones(gid, mid)]
        remaining = [m for m in cg.members.values() if m.member_id not in gone]
        self._drop_subscription_metadata(cg, records)
        records.append(cgr.group_epoch_record(gid, cg.group_epoch + 1, self._metadata_hash(remaining, topics)))
        if all(mid in gone for mid in cg.members):
            # An empty group's assignment epoch is its group epoch (KAFKA-20442, Kafka 4.4): no assignment is
            # pending for a group without members.
            records.append(cgr.target_epoch_record(gid, cg.group_epoch + 1))
        return records

    async def _apply_and_flush(self, gid: str, cg: ConsumerGroup, records: list[ConsumerGroupRecord],
                               topics: object | None, extra: Sequence[tuple[bytes, bytes | None]] = ()) -> None:
        """Append, replay into the group, then wait for durability. Nothing is awaited before the replay, so no
        other request sees the group between the computation of these records and their effect."""
        if records or extra:
            lg, info = self._write(gid, [*extra, *(r.entry() for r in records)])
        for r in records:
            self.replay_consumer_record(r, cg)
        if topics is not None:
            cg.checked_topics = topics
        if records or extra:
            await self._flush_if_needed(lg, info.last_offset)

    def replay_consumer_record(self, r: ConsumerGroupRecord, cg: ConsumerGroup | None = None) -> None:
        """Apply one record (live or at load). The group is registered on its first record and dropped with
        its group tombstone (its committed offsets stay, as Kafka keeps them apart from the group)."""
        holder = self.groups.get(r.group_id)
        if r.type is cgr.RecordType.METADATA and r.value is None:
            if holder is not None and holder.consumer is not None:
                self._cancel_all_timers(holder.consumer)
                holder.consumer = None
                holder.protocol_type = None
                if not holder.offsets and not holder.pending_txn_offsets:
                    self.groups.pop(r.group_id, None)
            return
        if holder is None:
            holder = self.groups[r.group_id] = GroupMetadata(r.group_id, state_timestamp_ms=_now_ms())
        if holder.consumer is None:
            if r.value is None:
                return
            holder.consumer = cg if cg is not None and cg.group_id == r.group_id else ConsumerGroup(r.group_id)
            holder.members.clear()
            holder.static_members.clear()
            holder.generation_id = 0
            holder.protocol_name = None
            holder.leader_id = None
        holder.protocol_type = "consumer"
        holder.consumer.replay(r)
        # The classic view used by offset expiry and DeleteGroups: Empty without members.
        empty = not holder.consumer.members
        if empty != (holder.state is GroupState.EMPTY):
            holder.state = GroupState.EMPTY if empty else GroupState.STABLE
            holder.state_timestamp_ms = _now_ms()

    def consumer_group_tombstones(self, g: GroupMetadata) -> list[tuple[bytes, bytes | None]]:
        """DeleteGroups of an empty consumer group: every record of it goes (Kafka's createGroupTombstoneRecords)."""
        if g.consumer is None:
            return []
        return [r.entry() for r in cgr.group_tombstones(g.group_id, list(g.consumer.members))]

    def _update_member(self, cg: ConsumerGroup, before: ConsumerGroupMember, updated: ConsumerGroupMember,
                       new_member: bool, replaced: ConsumerGroupMember | None, bump: bool, owned: Any, topics: Any,
                       records: list[ConsumerGroupRecord]) -> ConsumerGroupMember:
        """Kafka's consumerGroupHeartbeat after the member's own record (classicGroupJoinToConsumerGroup repeats
        it): subscription metadata, group epoch, target assignment, then the member's reconciliation. Appends
        the records; returns the reconciled member."""
        gid = cg.group_id
        # The group metadata hash (KIP-1101): recomputed when the subscriptions or the cluster's topics changed; a
        # different one (a partition added, a topic deleted or made again) bumps the group epoch.
        others = [m for m in cg.members.values()
                  if m.member_id != updated.member_id and (replaced is None or m.member_id != replaced.member_id)]
        metadata_hash = cg.metadata_hash
        if bump or cg.checked_topics is not topics:
            metadata_hash = self._metadata_hash([*others, updated], topics)
            if metadata_hash != cg.metadata_hash:
                bump = True
        group_epoch = cg.group_epoch
        if bump:
            group_epoch += 1
            self._drop_subscription_metadata(cg, records)
            records.append(cgr.group_epoch_record(gid, group_epoch, metadata_hash))

        target_epoch = cg.assignment_epoch
        target = cg.target.get(replaced.member_id if replaced is not None else updated.member_id, {})
        if group_epoch > cg.assignment_epoch:
            metadata = self._subscription_metadata([*others, updated], topics)
            subs = {m.member_id: sorted(member_topics(m, topics)) for m in others}
            subs[updated.member_id] = sorted(member_topics(updated, topics))
            current_targets = {m: cg.target.get(m, {}) for m in subs}
            current_targets[updated.member_id] = target
            preferred = updated.server_assignor or cg.preferred_assignor(self.config.consumer_assignors[0])
            result = TargetAssignmentBuilder(assignor_named(preferred), metadata).build(subs, current_targets)
            for mid, a in sorted(result.changed.items()):
                records.append(cgr.target_assignment_record(gid, mid, a))
            records.append(cgr.target_epoch_record(gid, group_epoch))
            target_epoch, target = group_epoch, result.assignment.get(updated.member_id, {})
            log.info("Group %s: epoch %d, new target assignment of %d partitions over %d members (assignor %s)",
                     gid, group_epoch, sum(len(ps) for a in result.assignment.values() for ps in a.values()),
                     len(subs), preferred)

        reconciled = (CurrentAssignmentBuilder(updated)
                      .with_target(target_epoch, target)
                      .with_owner_lookup(lambda t, p: self._owner_for(cg, replaced, updated.member_id, t, p))
                      .with_owned(owned)
                      .build())
        if new_member or replaced is not None or not reconciled.same_assignment(before):
            records.append(reconciled.assignment_record(gid))
        return reconciled

    # ------------------------------------------------------------ timers

    def _group_config_ms(self, group_id: str, name: str, default: int) -> int:
        raw = self.host.consumer_group_config(group_id).get(name)
        try:
            return int(raw) if raw is not None else default
        except ValueError:
            return default

    def _session_timeout_ms(self, group_id: str) -> int:
        """Kafka's GroupMetadataManager.consumerGroupSessionTimeoutMs: the group's config, else the broker's."""
        return self._group_config_ms(group_id, "consumer.session.timeout.ms", self.config.consumer_session_timeout_ms)

    def _member_session_timeout_ms(self, cg: ConsumerGroup, member_id: str) -> int:
        """A classic member keeps the session timeout of its JoinGroup (Kafka's classicProtocolSessionTimeout)."""
        m = cg.members.get(member_id)
        if m is not None and m.classic is not None:
            return m.classic.session_timeout_ms
        return self._session_timeout_ms(cg.group_id)

    def _heartbeat_interval_ms(self, group_id: str) -> int:
        return self._group_config_ms(group_id, "consumer.heartbeat.interval.ms",
                                     self.config.consumer_heartbeat_interval_ms)

    def _schedule_session_timeout(self, cg: ConsumerGroup, member_id: str) -> None:
        """The member's session restarts now. One timer per member, re-armed lazily when it fires early, and
        again now when the session got shorter (a lowered consumer.session.timeout.ms)."""
        deadline = self.loop.time() + self._member_session_timeout_ms(cg, member_id) / 1000
        cg.session_deadlines[member_id] = deadline
        timer = cg.session_timers.get(member_id)
        if timer is not None and timer.when() > deadline:
            timer.cancel()
            timer = None
        if timer is None:
            cg.session_timers[member_id] = self.loop.call_at(deadline, self._session_expired, cg, member_id)

    def _session_expired(self, cg: ConsumerGroup, member_id: str) -> None:
        cg.session_timers.pop(member_id, None)
        deadline = cg.session_deadlines.get(member_id)
        holder = self.groups.get(cg.group_id)
        if deadline is None or holder is None or holder.consumer is not cg or member_id not in cg.members:
            return
        if deadline > self.loop.time():
            cg.session_timers[member_id] = self.loop.call_at(deadline, self._session_expired, cg, member_id)
            return
        cg.session_deadlines.pop(member_id, None)
        timeout_ms = self._member_session_timeout_ms(cg, member_id)
        self.loop.create_task(self._fence_quietly(cg, member_id, None,
                                                  f"fenced: session timeout ({timeout_ms} ms) expired in"))

    def _maybe_schedule_rebalance_timeout(self, cg: ConsumerGroup, before: ConsumerGroupMember,
                                          after: ConsumerGroupMember) -> None:
        """Kafka: a member asked to revoke partitions must do so within its rebalance timeout, or be fenced."""
        if after.state is not MemberState.UNREVOKED_PARTITIONS:
            self._cancel_rebalance_timeout(cg, after.member_id)
            return
        if before.state is MemberState.UNREVOKED_PARTITIONS and before.member_epoch == after.member_epoch \
                and after.member_id in cg.rebalance_timers:
            return
        self._cancel_rebalance_timeout(cg, after.member_id)
        timeout = max(after.rebalance_timeout_ms, 0) / 1000
        cg.rebalance_timers[after.member_id] = self.loop.call_later(
            timeout, self._rebalance_expired, cg, after.member_id, after.member_epoch)

    def _rebalance_expired(self, cg: ConsumerGroup, member_id: str, epoch: int) -> None:
        cg.rebalance_timers.pop(member_id, None)
        m = cg.members.get(member_id)
        holder = self.groups.get(cg.group_id)
        if holder is None or holder.consumer is not cg or m is None:
            return
        if m.state is MemberState.UNREVOKED_PARTITIONS and m.member_epoch == epoch:
            self.loop.create_task(self._fence_quietly(cg, member_id, epoch,
                                                      "fenced: it did not revoke its partitions within its "
                                                      "rebalance timeout in"))

    async def _fence_quietly(self, cg: ConsumerGroup, member_id: str, epoch: int | None, why: str) -> None:
        m = cg.members.get(member_id)
        holder = self.groups.get(cg.group_id)
        if m is None or holder is None or holder.consumer is not cg or (epoch is not None and m.member_epoch != epoch):
            return
        try:
            await self._fence_member(cg, m, why)
        except Exception:
            log.exception("Could not fence member %s of consumer group %s", member_id, cg.group_id)

    def _cancel_session_timeout(self, cg: ConsumerGroup, member_id: str) -> None:
        cg.session_deadlines.pop(member_id, None)
        timer = cg.session_timers.pop(member_id, None)
        if timer is not None:
            timer.cancel()

    def _cancel_rebalance_timeout(self, cg: ConsumerGroup, member_id: str) -> None:
        timer = cg.rebalance_timers.pop(member_id, None)
        if timer is not None:
            timer.cancel()

    def _cancel_all_timers(self, cg: ConsumerGroup) -> None:
        for mid in list(cg.session_timers) + list(cg.rebalance_timers):
            self._cancel_session_timeout(cg, mid)
            self._cancel_rebalance_timeout(cg, mid)
        self.cancel_classic_timers(cg)

    def consumer_groups_loaded(self, partition: int) -> None:
        """After a load: every member's session starts now; those that do not heartbeat again are fenced
        (Kafka's onLoaded)."""
        for gid, holder in self.groups.items():
            if holder.consumer is not None and self.offsets_partition(gid) == partition:
                for mid in holder.consumer.members:
                    self._schedule_session_timeout(holder.consumer, mid)
                if holder.consumer.members:
                    log.info("Loaded consumer group %s: epoch %d, %d members", gid, holder.consumer.group_epoch,
                             len(holder.consumer.members))

    # ------------------------------------------------------------ describe

    async def consumer_group_describe(self, group_ids: list[str]) -> list[DescribedConsumerGroup]:
        out = []
        for gid in group_ids:
            err = self.coordinator_error(gid)
            if err is not None:
                out.append(DescribedConsumerGroup(gid, err))
                continue
            holder = self.groups.get(gid)
            if holder is None or (holder.consumer is None and not holder.members and not holder.offsets):
                out.append(DescribedConsumerGroup(gid, ErrorCode.GROUP_ID_NOT_FOUND,
                                                  f"Group {gid} not found."))
                continue
            cg = holder.consumer
            if cg is None:
                out.append(DescribedConsumerGroup(gid, ErrorCode.GROUP_ID_NOT_FOUND,
                                                  f"Group {gid} is not a consumer group."))
                continue
            out.append(DescribedConsumerGroup(
                gid, ErrorCode.NONE, None, cg.state.value, cg.group_epoch, cg.assignment_epoch,
                cg.preferred_assignor(self.config.consumer_assignors[0]),
                [(replace(m), dict(cg.target.get(m.member_id, {}))) for m in cg.members.values()]))
        return out

    # ------------------------------------------------------------ offsets (Kafka's ConsumerGroup.validateOffset*)

    @staticmethod
    def validate_consumer_offset_commit(cg: ConsumerGroup, member_id: str, member_epoch: int,
                                        transactional: bool, api_version: int) -> ErrorCode | None:
        # Epoch -1: the admin client or a consumer without group management, allowed on an empty group.
        if member_epoch < 0 and not cg.members:
            return None
        member = cg.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        # A classic member commits with its generation (= its member epoch) at any version.
        if not transactional and api_version < 9 and not member.uses_classic_protocol:
            return ErrorCode.UNSUPPORTED_VERSION
        if member_epoch != member.member_epoch:
            return ErrorCode.ILLEGAL_GENERATION if member.uses_classic_protocol else ErrorCode.STALE_MEMBER_EPOCH
        return None

    @staticmethod
    def validate_consumer_offset_fetch(cg: ConsumerGroup, member_id: str | None, member_epoch: int
                                       ) -> ErrorCode | None:
        if member_epoch < 0 and member_id is None:
            return None
        member = cg.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.ILLEGAL_GENERATION if member.uses_classic_protocol else ErrorCode.STALE_MEMBER_EPOCH
        return None

    async def convert_empty_consumer_group(self, group_id: str) -> None:
        """A classic JoinGroup for an empty consumer group: its records go and it becomes an empty classic group
        keeping its offsets (Kafka replaces an empty group of the other type)."""
        holder = self.groups.get(group_id)
        if holder is None or holder.consumer is None or holder.consumer.members:
            return
        cg = holder.consumer
        records = cgr.group_tombstones(group_id, [])
        lg, info = self._write(group_id, [r.entry() for r in records])
        for r in records:
            self.replay_consumer_record(r, cg)
        log.info("Empty consumer group %s becomes a classic group", group_id)
        if group_id not in self.groups:
            self.groups[group_id] = GroupMetadata(group_id, state_timestamp_ms=_now_ms())
        await self._flush_if_needed(lg, info.last_offset)

"""Online migration between classic and KIP-848 consumer groups, as Kafka 3.9/4.0's GroupMetadataManager does it
(convertToConsumerGroup, convertToClassicGroup and the classicGroup*ToConsumerGroup handlers).

- Upgrade: a ConsumerGroupHeartbeat joining a non-empty classic group of protocol type "consumer" turns it into a
  consumer group whose members are the classic ones (with their classic metadata), at the classic generation.
  The conversion records (a tombstone of the classic GroupMetadata, then the ConsumerGroup* records) go in the same
  batch as the joining member's, so the group is converted exactly when the new member is in.
- Classic members of a consumer group are served from it: Heartbeat answers REBALANCE_IN_PROGRESS when their
  assignment must move, JoinGroup reconciles them from the owned partitions of their subscription (an eager client
  owns nothing when it rejoins, a cooperative one keeps what stays), SyncGroup hands out their current assignment
  in the ConsumerProtocol format. A classic member that does not rejoin (or sync) within its rebalance timeout is
  fenced, as in Kafka.
- Downgrade: when the last member using the consumer protocol leaves (or is fenced) and only classic members are
  left, the group becomes a classic group again (consumer records tombstoned, one GroupMetadata record) with their
  target assignments, and a rebalance starts.

Everything runs on the coordinator loop, like ConsumerGroupManager: records are computed without awaiting, appended,
replayed, and only then flushed.

group.consumer.migration.policy governs the two conversions. With `disabled`, a classic JoinGroup to a consumer
group with members keeps the INCONSISTENT_GROUP_PROTOCOL answer (Kafka's KAFKA-20640: the group could never become
single-protocol again); with the other policies classic members may join it, as in Kafka.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kbroker.coordinator import consumer_group_records as cgr
from kbroker.coordinator import group_records
from kbroker.coordinator.consumer_group import (
    ClassicMemberMetadata,
    ConsumerGroup,
    ConsumerGroupMember,
    MemberState,
)
from kbroker.coordinator.consumer_group_manager import ConsumerGroupError, ConsumerGroupManager
from kbroker.coordinator.consumer_group_records import Assignment, ConsumerGroupRecord
from kbroker.coordinator.group_metadata import GroupMetadata, GroupState, MemberMetadata
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from kbroker.protocol.primitives import I16

if TYPE_CHECKING:
    from kbroker.coordinator.group_coordinator import JoinResult

log = logging.getLogger("kbroker.group")

PROTOCOL_TYPE = "consumer"
UPGRADE_POLICIES = ("upgrade", "bidirectional")
DOWNGRADE_POLICIES = ("downgrade", "bidirectional")


# ---------------------------------------------------------------- the embedded consumer protocol (ConsumerProtocol)


def decode_subscription(meta: bytes) -> Any:
    (version,) = I16.unpack_from(meta, 0)
    if version < 0:
        raise ValueError(f"subscription version {version}")
    sub, _ = codec.decode(ConsumerProtocolSubscription, min(version, 3), meta, 2)
    return sub


def decode_assignment(data: bytes) -> dict[str, set[int]]:
    if not data:
        return {}
    (version,) = I16.unpack_from(data, 0)
    if version < 0:
        raise ValueError(f"assignment version {version}")
    a, _ = codec.decode(ConsumerProtocolAssignment, min(version, 3), data, 2)
    out: dict[str, set[int]] = {}
    for tp in a.assigned_partitions:
        out.setdefault(tp.topic, set()).update(tp.partitions)
    return out


def encode_assignment(by_name: dict[str, set[int]], metadata: bytes) -> bytes:
    """Kafka's ConsumerProtocol.serializeAssignment at the version of the member's subscription (capped at 3)."""
    version = min(max(I16.unpack_from(metadata, 0)[0], 0), 3) if len(metadata) >= 2 else 0
    out = bytearray(I16.pack(version))
    codec.encode(ConsumerProtocolAssignment(assigned_partitions=[
        ConsumerProtocolAssignment.TopicPartition(topic=t, partitions=sorted(ps))
        for t, ps in sorted(by_name.items()) if ps]), version, out)
    return bytes(out)


def _by_id(by_name: dict[str, set[int]], topics: Any) -> Assignment:
    """Topic names to ids; partitions of unknown topics are dropped (Kafka's topicPartitionMapFromList)."""
    out: Assignment = {}
    for name, ps in by_name.items():
        rec = topics.get(name)
        if rec is not None and ps:
            out.setdefault(rec.topic_id, set()).update(ps)
    return out


def _by_name(a: Assignment, names: dict[bytes, str]) -> dict[str, set[int]]:
    return {names[t]: ps for t, ps in a.items() if t in names and ps}


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class ClassicUpgrade:
    """A classic group being converted by the heartbeat of its first consumer-protocol member."""

    holder: GroupMetadata
    group: ConsumerGroup
    generation: int
    records: list[ConsumerGroupRecord] = field(default_factory=list)


class ConsumerGroupMigration(ConsumerGroupManager):
    """Mixed into GroupCoordinator with ConsumerGroupManager; see the module docstring."""

    if TYPE_CHECKING:
        def _prepare_rebalance(self, g: GroupMetadata, reason: str) -> None: ...
        def _touch_member(self, g: GroupMetadata, member_id: str) -> None: ...

    def _policy_allows(self, policies: tuple[str, ...]) -> bool:
        return self.config.consumer_migration_policy in policies

    # ------------------------------------------------------------ upgrade

    def upgrade_classic_group(self, holder: GroupMetadata) -> ClassicUpgrade:
        """Kafka's validateOnlineUpgrade + convertToConsumerGroup: the consumer group the classic one becomes,
        built (unregistered) by replaying its records; commit_upgrade registers it with the joining member."""
        gid = holder.group_id
        not_consumer = ConsumerGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {gid} is not a consumer group.")
        if not self._policy_allows(UPGRADE_POLICIES):
            log.info("Cannot upgrade classic group %s to a consumer group: the online upgrade is disabled", gid)
            raise not_consumer
        if holder.protocol_type != PROTOCOL_TYPE:
            log.info("Cannot upgrade classic group %s to a consumer group: it does not use the consumer embedded "
                     "protocol", gid)
            raise not_consumer
        if len(holder.members) > self.config.consumer_max_size:
            log.info("Cannot upgrade classic group %s to a consumer group: its size exceeds the consumer group "
                     "maximum size", gid)
            raise not_consumer
        topics = self.host.consumer_group_topics()
        generation = holder.generation_id
        records: list[ConsumerGroupRecord] = []
        members: list[ConsumerGroupMember] = []
        try:
            for m in holder.members.values():
                meta = m.metadata_for(holder.protocol_name) if holder.protocol_name else m.protocols[0][1]
                sub = decode_subscription(meta)
                assigned = _by_id(decode_assignment(m.assignment), topics)
                members.append(ConsumerGroupMember(
                    m.member_id, member_epoch=generation, previous_member_epoch=generation,
                    state=MemberState.STABLE, instance_id=m.group_instance_id, rack_id=sub.rack_id or None,
                    rebalance_timeout_ms=m.rebalance_timeout_ms, client_id=m.client_id, client_host=m.client_host,
                    subscribed_topic_names=sorted(set(sub.topics)), assigned=assigned,
                    classic=ClassicMemberMetadata(m.session_timeout_ms, tuple(m.protocols))))
        except Exception as e:  # noqa: BLE001 - foreign bytes in the embedded protocol
            log.warning("Cannot upgrade classic group %s to a consumer group: malformed embedded consumer protocol "
                        "(%s)", gid, e)
            raise ConsumerGroupError(
                ErrorCode.GROUP_ID_NOT_FOUND,
                f"Cannot upgrade the classic group {gid} to consumer group because the embedded consumer protocol "
                "is malformed.") from None
        # Kafka's ConsumerGroup.createConsumerGroupRecords, in its order.
        records += [m.metadata_record(gid) for m in members]
        records.append(cgr.group_epoch_record(gid, generation, self._metadata_hash(members, topics)))
        records += [cgr.target_assignment_record(gid, m.member_id, m.assigned) for m in members]
        records.append(cgr.target_epoch_record(gid, generation))
        records += [m.assignment_record(gid) for m in members]
        cg = ConsumerGroup(gid)
        for r in records:
            cg.replay(r)
        return ClassicUpgrade(holder, cg, generation, records)

    def commit_upgrade(self, upgrade: ClassicUpgrade) -> list[tuple[bytes, bytes | None]]:
        """Right before the records are appended: the classic side stops (pending JoinGroup/SyncGroup answered
        REBALANCE_IN_PROGRESS so the members rejoin, timers cancelled). Returns the classic group's tombstone."""
        g = upgrade.holder
        if g.rebalance_timer is not None:
            g.rebalance_timer.cancel()
            g.rebalance_timer = None
        self._complete_classic_futures(g, ErrorCode.REBALANCE_IN_PROGRESS)
        for m in g.members.values():
            if m.heartbeat_timer is not None:
                m.heartbeat_timer.cancel()
                m.heartbeat_timer = None
        g.pending_members.clear()
        g.clear_pending_sync()
        g.in_initial_delay = False
        # The classic view of a consumer group with members (offset expiry, DeleteGroups).
        g.state = GroupState.STABLE
        return [(group_records.group_key(g.group_id), None)]

    def upgrade_committed(self, upgrade: ClassicUpgrade) -> None:
        cg = upgrade.group
        for m in cg.classic_members():
            self._schedule_session_timeout(cg, m.member_id)
        log.info("Classic group %s upgraded to a consumer group at generation %d with %d classic members; group "
                 "epoch %d", cg.group_id, upgrade.generation, len(cg.classic_members()), cg.group_epoch)

    @staticmethod
    def _complete_classic_futures(g: GroupMetadata, code: ErrorCode) -> None:
        from kbroker.coordinator.group_coordinator import JoinResult  # group_coordinator imports this module

        for m in g.members.values():
            if m.join_future is not None and not m.join_future.done():
                m.join_future.set_result(JoinResult(code, m.member_id))
            if m.sync_future is not None and not m.sync_future.done():
                m.sync_future.set_result((code, b""))
            m.join_future = m.sync_future = None

    # ------------------------------------------------------------ classic requests to a consumer group

    async def classic_join_to_consumer_group(
            self, g: GroupMetadata, member_id: str, instance_id: str | None, require_known_member: bool,
            client_id: str, client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int,
            protocol_type: str, protocols: list[tuple[str, bytes]]) -> JoinResult:
        """Kafka's classicGroupJoinToConsumerGroup."""
        from kbroker.coordinator.group_coordinator import JoinResult  # group_coordinator imports this module

        cg = g.consumer
        assert cg is not None
        gid = g.group_id
        if not self._policy_allows(UPGRADE_POLICIES + DOWNGRADE_POLICIES):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        unknown = not member_id
        if unknown:
            member_id = str(uuid.uuid4())
        if len(cg.members) >= self.config.consumer_max_size and member_id not in cg.members:
            return JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, member_id)
        if not cg.supports_classic_protocols(protocol_type, {n for n, _ in protocols}):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if unknown and require_known_member and instance_id is None:
            log.info("Member with unknown id joins consumer group %s with the classic protocol: asked to rejoin "
                     "as %s", gid, member_id)
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        try:
            sub = decode_subscription(protocols[0][1])
        except Exception:  # noqa: BLE001 - foreign bytes
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)

        records: list[ConsumerGroupRecord] = []
        replaced: ConsumerGroupMember | None = None
        if instance_id is None:
            existing = cg.members.get(member_id)
            member = existing if existing is not None else ConsumerGroupMember(member_id)
        else:
            static_id = cg.static_members.get(instance_id)
            static = cg.members.get(static_id) if static_id is not None else None
            if unknown:
                if static is None:
                    member = ConsumerGroupMember(member_id)
                else:
                    # The instance comes back with a new member id: it takes over the old member's assignment.
                    replaced = static
                    member = replace(static, member_id=member_id, member_epoch=0, previous_member_epoch=0,
                                     state=MemberState.STABLE, pending_revocation={})
                    records += cgr.member_tombstones(gid, static.member_id)
                    records.append(cgr.target_assignment_record(gid, member_id, cg.target.get(static.member_id, {})))
            else:
                if static is None:
                    return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
                if static.member_id != member_id:
                    return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
                member = static
        new_member = member.member_id not in cg.members
        before = replace(member)
        updated = replace(
            member, instance_id=instance_id if instance_id is not None else member.instance_id,
            rack_id=sub.rack_id or member.rack_id,
            rebalance_timeout_ms=rebalance_timeout_ms if rebalance_timeout_ms != -1 else member.rebalance_timeout_ms,
            subscribed_topic_names=sorted(set(sub.topics)), client_id=client_id, client_host=client_host,
            classic=ClassicMemberMetadata(session_timeout_ms, tuple(protocols)))
        topics = self.host.consumer_group_topics()
        owned = _by_id({tp.topic: set(tp.partitions) for tp in sub.owned_partitions}, topics)
        more, reconciled = self._member_records(cg, before, updated, new_member and replaced is None, replaced,
                                                owned, topics)
        records += more
        existing_static = cg.members.get(cg.static_members.get(instance_id, "")) if instance_id is not None else None
        if existing_static is not None and self.can_downgrade(cg, existing_static.member_id, reconciled):
            # The last consumer-protocol static member is replaced by this classic instance (a rolling downgrade).
            self._cancel_classic_timer(cg, "join", existing_static.member_id)
            await self.downgrade_to_classic_group(cg, existing_static, "is replaced by a classic static member in",
                                                  reconciled, records)
            return JoinResult(ErrorCode.NONE, member_id, reconciled.member_epoch, PROTOCOL_TYPE, protocols[0][0],
                              "", [])
        await self._apply_and_flush(gid, cg, records, topics)
        if self.groups.get(gid) is not g or g.consumer is not cg:
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        if new_member:
            log.info("Member %s joins consumer group %s using the classic protocol (client %s%s)", member_id, gid,
                     client_id, f", instance {instance_id}" if instance_id else "")
        self._cancel_classic_timer(cg, "join", member_id)
        self._schedule_session_timeout(cg, member_id)
        self._schedule_classic_timer(cg, "sync", member_id, updated.rebalance_timeout_ms)
        current = cg.members.get(member_id, reconciled)
        return JoinResult(ErrorCode.NONE, member_id, current.member_epoch, PROTOCOL_TYPE, protocols[0][0], "", [])

    def _member_records(self, cg: ConsumerGroup, before: ConsumerGroupMember, updated: ConsumerGroupMember,
                        joined: bool, replaced: ConsumerGroupMember | None, owned: Assignment | None,
                        topics: Any) -> tuple[list[ConsumerGroupRecord], ConsumerGroupMember]:
        """The subscription, group epoch, target and reconciliation steps of a JoinGroup, as the heartbeat does
        them (Kafka's classicGroupJoinToConsumerGroup repeats consumerGroupHeartbeat's); returns the records and
        the reconciled member."""
        gid = cg.group_id
        records: list[ConsumerGroupRecord] = []
        bump = False
        # A static member taking over its predecessor's place is not new: only a subscription change bumps.
        if joined or replaced is not None or not updated.same_metadata(before):
            records.append(updated.metadata_record(gid))
            bump = joined or sorted(updated.subscribed_topic_names) != sorted(before.subscribed_topic_names)
        reconciled = self._update_member(cg, before, updated, joined, replaced, bump, owned, topics, records)
        return records, reconciled

    def _classic_member(self, cg: ConsumerGroup, member_id: str, instance_id: str | None
                        ) -> ConsumerGroupMember | ErrorCode:
        """Kafka's validateConsumerGroupMember + throwIfMemberDoesNotUseClassicProtocol."""
        if instance_id is None:
            member = cg.members.get(member_id)
        else:
            mid = cg.static_members.get(instance_id)
            member = cg.members.get(mid) if mid is not None else None
            if member is not None and member.member_id != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member is None or member.classic is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return member

    def classic_sync_to_consumer_group(self, g: GroupMetadata, generation_id: int, member_id: str,
                                       instance_id: str | None, protocol_type: str | None,
                                       protocol_name: str | None) -> tuple[ErrorCode, bytes, str | None, str | None]:
        """Kafka's classicGroupSyncToConsumerGroup: the member's current assignment, in the ConsumerProtocol
        format of its subscription's version."""
        cg = g.consumer
        assert cg is not None
        member = self._classic_member(cg, member_id, instance_id)
        if isinstance(member, ErrorCode):
            return member, b"", None, None
        assert member.classic is not None
        if generation_id != member.member_epoch:
            return ErrorCode.ILLEGAL_GENERATION, b"", None, None
        name, meta = member.classic.protocols[0]
        if (protocol_type is not None and protocol_type != PROTOCOL_TYPE) or (
                protocol_name is not None and protocol_name != name):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL, b"", None, None
        if self._must_rejoin_for_epoch(cg, member):
            return ErrorCode.REBALANCE_IN_PROGRESS, b"", None, None
        self._cancel_classic_timer(cg, "sync", member.member_id)
        self._schedule_session_timeout(cg, member.member_id)
        names = {rec.topic_id: n for n, rec in self.host.consumer_group_topics().items()}
        return (ErrorCode.NONE, encode_assignment(_by_name(member.assigned, names), meta),
                protocol_type if protocol_type is not None else PROTOCOL_TYPE,
                protocol_name if protocol_name is not None else name)

    def _must_rejoin_for_epoch(self, cg: ConsumerGroup, member: ConsumerGroupMember) -> bool:
        """Kafka's throwIfRebalanceInProgress: a newer group epoch, unless the member is revoking partitions (its
        rejoin after the revocation catches up)."""
        if cg.group_epoch > member.member_epoch and member.state is not MemberState.UNREVOKED_PARTITIONS:
            self._schedule_classic_timer(cg, "join", member.member_id, member.rebalance_timeout_ms, if_absent=True)
            return True
        return False

    def classic_heartbeat_to_consumer_group(self, g: GroupMetadata, generation_id: int, member_id: str,
                                            instance_id: str | None) -> ErrorCode:
        """Kafka's classicGroupHeartbeatToConsumerGroup: REBALANCE_IN_PROGRESS when the member must rejoin (a newer
        group epoch, partitions to revoke, or partitions it waited for are now free)."""
        cg = g.consumer
        assert cg is not None
        member = self._classic_member(cg, member_id, instance_id)
        if isinstance(member, ErrorCode):
            return member
        if generation_id != member.member_epoch:
            return ErrorCode.ILLEGAL_GENERATION
        self._schedule_session_timeout(cg, member.member_id)
        if member.member_epoch < cg.group_epoch or member.state is MemberState.UNREVOKED_PARTITIONS or (
                member.state is MemberState.UNRELEASED_PARTITIONS and not cg.waiting_on_unreleased_partition(member)):
            self._schedule_classic_timer(cg, "join", member.member_id, member.rebalance_timeout_ms, if_absent=True)
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    async def classic_leave_to_consumer_group(self, g: GroupMetadata, leaving: list[tuple[str, str | None]]
                                              ) -> tuple[ErrorCode, list[ErrorCode]]:
        """Kafka's classicGroupLeaveToConsumerGroup: the members go, the group epoch is bumped."""
        cg = g.consumer
        assert cg is not None
        gid = g.group_id
        results: list[ErrorCode] = []
        gone: list[ConsumerGroupMember] = []
        for member_id, instance_id in leaving:
            if instance_id is None:
                member = cg.members.get(member_id)
            else:
                mid = cg.static_members.get(instance_id)
                member = cg.members.get(mid) if mid is not None else None
                if member is not None and member_id and member.member_id != member_id:
                    results.append(ErrorCode.FENCED_INSTANCE_ID)
                    continue
            if member is None or member.classic is None or any(m.member_id == member.member_id for m in gone):
                results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            gone.append(member)
            results.append(ErrorCode.NONE)
        if gone:
            topics = self.host.consumer_group_topics()
            records = self._removal_records(cg, [m.member_id for m in gone], topics)
            for m in gone:
                self._cancel_session_timeout(cg, m.member_id)
                self._cancel_rebalance_timeout(cg, m.member_id)
                self.cancel_classic_timers(cg, m.member_id)
            await self._apply_and_flush(gid, cg, records, topics)
            for m in gone:
                log.info("Classic member %s has left consumer group %s", m.member_id, gid)
        return ErrorCode.NONE, results

    # ------------------------------------------------------------ join / sync timeouts of classic members

    def _schedule_classic_timer(self, cg: ConsumerGroup, kind: str, member_id: str, timeout_ms: int,
                                if_absent: bool = False) -> None:
        key = (kind, member_id)
        if key in cg.classic_timers:
            if if_absent:
                return
            cg.classic_timers.pop(key).cancel()
        cg.classic_timers[key] = self.loop.call_later(max(timeout_ms, 0) / 1000, self._classic_timer_expired, cg,
                                                      kind, member_id)

    def _classic_timer_expired(self, cg: ConsumerGroup, kind: str, member_id: str) -> None:
        cg.classic_timers.pop((kind, member_id), None)
        why = ("fenced: the classic member did not rejoin within its rebalance timeout in" if kind == "join"
               else "fenced: the classic member did not sync within its rebalance timeout in")
        self.loop.create_task(self._fence_quietly(cg, member_id, None, why))

    def _cancel_classic_timer(self, cg: ConsumerGroup, kind: str, member_id: str) -> None:
        timer = cg.classic_timers.pop((kind, member_id), None)
        if timer is not None:
            timer.cancel()

    def cancel_classic_timers(self, cg: ConsumerGroup, member_id: str | None = None) -> None:
        for key in [k for k in cg.classic_timers if member_id is None or k[1] == member_id]:
            cg.classic_timers.pop(key).cancel()

    # ------------------------------------------------------------ downgrade

    def can_downgrade(self, cg: ConsumerGroup, leaving_id: str, joining: ConsumerGroupMember | None = None) -> bool:
        """Kafka's validateOnlineDowngradeWithFencedMember, or with a joining classic static member replacing
        `leaving_id`, validateOnlineDowngradeWithReplacedMemberId."""
        if not cg.all_classic_except(leaving_id) or (joining is None and len(cg.members) <= 1):
            return False
        if not self._policy_allows(DOWNGRADE_POLICIES):
            log.info("Cannot downgrade consumer group %s to a classic group: the online downgrade is disabled",
                     cg.group_id)
            return False
        if len(cg.members) - (1 if joining is None else 0) > self.config.max_size:
            log.info("Cannot downgrade consumer group %s to a classic group: its size exceeds group.max.size",
                     cg.group_id)
            return False
        remaining = [m for m in cg.members.values() if m.member_id != leaving_id] + (
            [joining] if joining is not None else [])
        common: set[str] | None = None
        for m in remaining:
            if m.classic is not None:
                names = {n for n, _ in m.classic.protocols}
                common = names if common is None else common & names
        # Classic members join only with a protocol all of them support; this guards the records against a group
        # that would have none.
        return bool(common)

    async def downgrade_to_classic_group(self, cg: ConsumerGroup, leaving: ConsumerGroupMember, why: str,
                                         joining: ConsumerGroupMember | None = None,
                                         records: list[ConsumerGroupRecord] | None = None) -> None:
        """Kafka's convertToClassicGroup: the remaining (classic) members form a Stable classic group at the group
        epoch with their target assignments. A rebalance starts when a member left; a classic static member
        replacing `leaving` (`joining`, whose JoinGroup `records` come first) takes its target and the group stays
        Stable. State is set directly (as Kafka does), the records only make a restart read the same group back."""
        gid = cg.group_id
        holder = self.groups[gid]
        names = {rec.topic_id: n for n, rec in self.host.consumer_group_topics().items()}
        # The join's records already replaced the leaving member by the joining one: the tombstones name the latter.
        ids = [joining.member_id if joining is not None and mid == leaving.member_id else mid for mid in cg.members]
        entries = [r.entry() for r in records or []]
        entries += [r.entry() for r in cgr.group_tombstones(gid, ids)]
        targets = {mid: cg.target.get(mid, {}) for mid in cg.members}
        remaining = [m for m in cg.members.values() if m.member_id != leaving.member_id]
        if joining is not None:
            remaining.append(joining)
            targets[joining.member_id] = cg.target.get(leaving.member_id, {})
        self._cancel_all_timers(cg)
        self.cancel_classic_timers(cg)
        holder.consumer = None
        holder.protocol_type = PROTOCOL_TYPE
        holder.generation_id = cg.group_epoch
        holder.leader_id = None
        holder.members, holder.static_members, holder.pending_members = {}, {}, set()
        for m in remaining:
            if m.classic is None:
                continue
            holder.add_member(MemberMetadata(
                m.member_id, m.instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                m.classic.session_timeout_ms, PROTOCOL_TYPE, list(m.classic.protocols)))
        holder.protocol_name = holder.select_protocol()
        for mm in holder.members.values():
            mm.assignment = encode_assignment(_by_name(targets.get(mm.member_id, {}), names),
                                              mm.metadata_for(holder.protocol_name))
        holder.state = GroupState.STABLE
        holder.state_timestamp_ms = _now_ms()
        entries.append((group_records.group_key(gid), group_records.group_value(holder)))
        lg, info = self._write(gid, entries)
        for mid in holder.members:
            self._touch_member(holder, mid)
        log.info("Member %s %s consumer group %s; the group is downgraded to a classic group at generation %d "
                 "with %d classic members", leaving.member_id, why if why != "left the group" else "left", gid,
                 holder.generation_id, len(holder.members))
        if joining is None:
            self._prepare_rebalance(holder, f"downgrade of group {gid} from consumer to classic")
        await self._flush_if_needed(lg, info.last_offset)
